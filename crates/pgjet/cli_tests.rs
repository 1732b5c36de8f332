//! Tests of the option table, the command line built from it and the layering (here, beside
//! the command line: the core library has no clap).
use crate::cli::{self, parse_with_env, ParseError};
use pgjet_core::codec::CompressType;
use pgjet_core::error::Error;
use pgjet_core::options::resolve::Invocation;
use pgjet_core::options::table::{classify, classify_env, Key, COMMANDS, OPTIONS};
use pgjet_core::options::*;
use pgjet_core::storage::config::RepoConfig;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// An environment of `vars`.
fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Parses `argv` (after "pgjet") with `vars` as the environment.
fn parse(argv: &[&str], vars: &[(&str, &str)]) -> Result<Invocation, ParseError> {
    let mut a = vec!["pgjet"];
    a.extend(argv);
    parse_with_env(a, &env(vars))
}

/// The configuration error of a failed parse, and its warnings.
fn config_error(r: Result<Invocation, ParseError>) -> (String, Vec<String>) {
    match r {
        Err(ParseError::Config {
            error, warnings, ..
        }) => (error.to_string(), warnings),
        Err(ParseError::Clap(e)) => panic!("clap refused it: {e}"),
        Ok(i) => panic!("accepted: {:?}", i.command),
    }
}

/// Writes `text` as a config file in `dir`; returns its path as text.
fn conf(dir: &tempfile::TempDir, text: &str) -> String {
    let f = dir.path().join("pgjet.conf");
    std::fs::write(&f, text).unwrap();
    f.display().to_string()
}

#[test]
fn the_command_line_built_from_the_table_is_consistent() {
    cli::command().debug_assert();
    let names: HashSet<&str> = COMMANDS.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), COMMANDS.len());
}

#[test]
fn every_option_has_a_unique_name_per_command_and_a_unique_variable() {
    let mut vars = HashSet::new();
    for (i, a) in OPTIONS.iter().enumerate() {
        for b in &OPTIONS[i + 1..] {
            let shared = COMMANDS
                .iter()
                .any(|c| a.commands.contains(c.cmd) && b.commands.contains(c.cmd));
            let same_spelling = a.spellings().any(|s| b.spellings().any(|t| s == t));
            assert!(
                !(same_spelling && shared),
                "{} and {} share a spelling and a command",
                a.name,
                b.name
            );
            // Options of the same name are command-line-only options of distinct commands.
            if a.name == b.name {
                assert!(a.command_specific() && b.command_specific(), "{}", a.name);
            }
        }
        if a.places.env {
            assert!(
                vars.insert(a.env_var()),
                "{} repeats {}",
                a.name,
                a.env_var()
            );
        }
        assert!(!(a.secret && a.places.cli), "secret {} has a flag", a.name);
        assert!(
            a.commands != table::Cmds::of(&[]),
            "{} applies nowhere",
            a.name
        );
    }
    // The indexed variables of repository options do not collide with any other.
    for d in OPTIONS.iter().filter(|d| d.repo) {
        for n in 1..=MAX_REPOS {
            let (key, var) = d.indexed(n);
            assert!(!vars.contains(&var), "{var}");
            assert_eq!(
                classify(&key),
                Key::Option {
                    def: d,
                    repo: Some(n),
                    alias: false
                }
            );
        }
    }
}

#[test]
fn aliases_resolve_to_their_option_in_the_file_and_on_the_command_line() {
    for (alias, name) in [
        ("pg1-path", "pg-path"),
        ("pg1-port", "pg-port"),
        ("pg1-socket-path", "pg-socket-path"),
        ("pg1-user", "pg-user"),
        ("pg1-host", "source"),
        ("pg-host", "source"),
        ("process-max", "jobs"),
    ] {
        match classify(alias) {
            Key::Option {
                def, alias: true, ..
            } => assert_eq!(def.name, name),
            o => panic!("{alias}: {o:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/g\nprocess-max=3\npg1-host=db1\n[main]\npg1-port=6000\n",
    );
    let i = parse(
        &[
            "--config",
            &f,
            "--stanza",
            "main",
            "--pg-host",
            "db2",
            "backup",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(i.settings.jobs(), 3);
    assert_eq!(i.settings.primary.pg_port, 6000);
    assert_eq!(i.settings.primary.source.as_deref(), Some("host=db2"));
    let i = parse(&["--config", &f, "--process-max", "5", "backup"], &[]).unwrap();
    assert_eq!(
        (i.settings.jobs(), i.settings.primary.source.as_deref()),
        (5, Some("host=db1"))
    );
}

#[test]
fn defaults_in_the_table_agree_with_the_constants() {
    let s = Settings::from_flags(&[]).unwrap();
    assert_eq!(s.primary.pg_port, DEFAULT_PG_PORT);
    assert_eq!(s.primary.pg_socket_path, Path::new(DEFAULT_SOCKET_DIR));
    assert_eq!(s.primary.pg_user, "postgres");
    assert_eq!(s.archive.spool_path, Path::new(DEFAULT_SPOOL_PATH));
    assert_eq!(s.archive.get_queue_max, DEFAULT_ARCHIVE_GET_QUEUE_MAX);
    assert_eq!(s.archive.timeout, DEFAULT_ARCHIVE_TIMEOUT);
    assert!(s.archive.check && !s.archive.asynchronous);
    assert_eq!(s.compression.kind, CompressType::Zstd);
    assert_eq!((s.output, s.log_level.as_str()), (Output::Text, "info"));
    assert_eq!(s.primary.transport, Transport::Auto);
    // Every default is a value its option takes.
    for d in OPTIONS {
        if let Some(v) = d.default {
            assert!(d.kind.check(d.name, v).is_ok(), "{}: {v}", d.name);
        }
    }
    match parse(&["restore"], &[]).unwrap().command {
        Command::Restore(r) => assert_eq!(r, RestoreOptions::default()),
        o => panic!("{o:?}"),
    }
    match parse(&["backup"], &[]).unwrap().command {
        Command::Backup(b) => assert_eq!(b, BackupOptions::default()),
        o => panic!("{o:?}"),
    }
}

#[test]
fn environment_fills_in_and_flags_win() {
    let vars = [("PGJET_REPO_PATH", "/from/env"), ("PGJET_PG_PORT", "6001")];
    let i = parse(&["--stanza", "main", "--pg-port", "7001", "backup"], &vars).unwrap();
    assert_eq!(
        i.settings.repo().unwrap().1,
        &RepoConfig::Posix {
            path: "/from/env".into()
        }
    );
    assert_eq!(i.settings.primary.pg_port, 7001);
    let i = parse(&["--stanza", "main", "backup"], &vars).unwrap();
    assert_eq!(i.settings.primary.pg_port, 6001);
    assert!(i.warnings.is_empty(), "{:?}", i.warnings);
    assert!(matches!(
        parse(&["restore", "--type", "bogus"], &[]),
        Err(ParseError::Clap(_))
    ));
    let (e, _) = config_error(parse(&["backup"], &[("PGJET_PG_PORT", "x")]));
    assert!(
        e.contains("PGJET_PG_PORT") && e.contains("'pg-port=x' is not valid"),
        "{e}"
    );
}

#[test]
fn flags_beat_file_and_stanza_beats_global() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(&dir, "[global]\nrepo1-path=/g\ncompress-type=lz4\nprocess-max=3\n[main]\npg-path=/s\npg-port=6000\n");
    let s = Settings::from_flags(&[("config", f.clone()), ("stanza", "main".into())]).unwrap();
    assert_eq!(
        s.repo().unwrap(),
        (1, &RepoConfig::Posix { path: "/g".into() })
    );
    assert_eq!(s.primary.pg_path.as_deref(), Some(Path::new("/s")));
    assert_eq!(
        (s.primary.pg_port, s.jobs(), s.compression.kind),
        (6000, 3, CompressType::Lz4)
    );
    let s = Settings::from_flags(&[
        ("config", f.clone()),
        ("stanza", "main".into()),
        ("pg-port", "7000".into()),
        ("jobs", "1".into()),
        ("repo-path", "/flag".into()),
    ])
    .unwrap();
    assert_eq!((s.primary.pg_port, s.jobs()), (7000, 1));
    // The flag of repository 1 wins over the file's repo1-path too.
    assert_eq!(
        s.repo().unwrap(),
        (
            1,
            &RepoConfig::Posix {
                path: "/flag".into()
            }
        )
    );
}

#[test]
fn command_sections_are_read_for_their_command() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo-path=/r\ncompress-level=3\n[global:archive-push]\ncompress-level=9\n[main:archive-push]\nprocess-max=7\n",
    );
    let i = parse(
        &["--config", &f, "--stanza", "main", "archive-push", "x"],
        &[],
    )
    .unwrap();
    assert_eq!((i.settings.compression.level, i.settings.jobs()), (9, 7));
    let i = parse(&["--config", &f, "--stanza", "main", "backup"], &[]).unwrap();
    assert_eq!(i.settings.compression.level, 3);
    assert!(i.warnings.is_empty(), "{:?}", i.warnings);
}

#[test]
fn a_repo_that_is_not_configured_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(&dir, "[global]\nrepo1-path=/a\nrepo2-path=/b\n");
    let with = |n: &str| Settings::from_flags(&[("config", f.clone()), ("repo", n.into())]);
    assert_eq!(
        with("2").unwrap().repo().unwrap(),
        (2, &RepoConfig::Posix { path: "/b".into() })
    );
    let e = with("3").unwrap().repo().unwrap_err().to_string();
    assert!(e.contains("repository 3 is not configured"), "{e}");
    assert!(matches!(
        with("5").map_err(|e| e.kind().exit_code()),
        Err(2)
    ));
}

#[test]
fn sizes_and_switches_parse() {
    assert_eq!(parse_size("k", "1GB").unwrap(), 1 << 30);
    assert_eq!(parse_size("k", "256mb").unwrap(), 256 << 20);
    assert_eq!(parse_size("k", "4096").unwrap(), 4096);
    assert_eq!(parse_size("k", "2 MiB").unwrap(), 2 << 20);
    for bad in ["", "MB", "1.5GB", "-1", "1PB", "99999999999TB"] {
        assert!(parse_size("k", bad).is_err(), "{bad}");
    }
    assert!(parse_bool("k", "y").unwrap());
    assert!(!parse_bool("k", "N").unwrap());
    assert!(parse_bool("k", "maybe").is_err());
}

#[test]
fn bad_values_are_config_errors() {
    for flags in [
        vec![("config", "/nonexistent/pgjet.conf".to_string())],
        vec![("jobs", "0".into())],
        vec![("compress-type", "xz".into())],
        vec![("log-level", "loud".into())],
        vec![("output", "xml".into())],
        vec![("archive-timeout", "0".into())],
        vec![("retention-full", "0".into())],
        vec![("retention-full-type", "weeks".into())],
        vec![("transport", "bogus".into())],
    ] {
        assert!(
            matches!(Settings::from_flags(&flags), Err(e) if matches!(e.kind(), Error::Config(_))),
            "{flags:?}"
        );
    }
    let e = Settings::from_flags(&[("transport", "bogus".into())]).unwrap_err();
    assert!(e.to_string().contains("transport 'bogus'"), "{e}");
}

/// A value an option does not take (its kind in the table) is refused in the same words
/// from a flag, a `PGJET_*` variable and the config file, each naming where it was.
#[test]
fn a_bad_value_is_refused_alike_from_each_place() {
    let dir = tempfile::tempdir().unwrap();
    for (name, value, said) in [
        ("jobs", "0", "jobs must be between 1 and 256, not 0"),
        (
            "jobs",
            "x",
            "'jobs=x' is not valid (a whole number between 1 and 256)",
        ),
        (
            "pg-port",
            "70000",
            "pg-port must be between 0 and 65535, not 70000",
        ),
        (
            "retention-full",
            "0",
            "retention-full must be at least 1, not 0",
        ),
        (
            "archive-timeout",
            "0",
            "archive-timeout must be between 0 and 86400 seconds, not 0",
        ),
        (
            "max-rate",
            "1PB",
            "max-rate: '1PB' is not a size (a number with an optional KB, MB, GB or TB)",
        ),
        ("resume", "maybe", "resume: 'maybe' is not y or n"),
        (
            "network-compress",
            "bzip",
            "network-compress 'bzip' is not one of auto, none, gzip, lz4, zstd",
        ),
        (
            "compress-type",
            "xz",
            "compress-type 'xz' is not one of none, lz4, zstd, gzip",
        ),
    ] {
        let flag = format!("--{name}");
        let (e, _) = config_error(parse(&["--stanza", "main", &flag, value, "backup"], &[]));
        assert!(e.ends_with(&format!("command line: {said}")), "{e}");
        let var = format!("PGJET_{}", name.to_uppercase().replace('-', "_"));
        let (e, _) = config_error(parse(&["--stanza", "main", "backup"], &[(&var, value)]));
        assert!(e.ends_with(&format!("environment ({var}): {said}")), "{e}");
        let f = conf(&dir, &format!("[global]\n{name}={value}\n"));
        let (e, _) = config_error(parse(&["--config", &f, "--stanza", "main", "backup"], &[]));
        assert!(
            e.ends_with(&format!("config file {f}, section [global]: {said}")),
            "{e}"
        );
    }
    // A repository's option, by its number, also when its repository's type does not read
    // it.
    let (e, _) = config_error(parse(
        &["--repo-path", "/r", "info"],
        &[("PGJET_REPO2_STORAGE_PORT", "x")],
    ));
    assert!(
        e.ends_with(
            "environment (PGJET_REPO2_STORAGE_PORT): 'repo2-storage-port=x' is not valid (a whole number between 0 and 65535)"
        ),
        "{e}"
    );
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/r\nrepo3-s3-uri-style=virtual\n",
    );
    let (e, _) = config_error(parse(&["--config", &f, "info"], &[]));
    assert!(
        e.ends_with(&format!(
            "config file {f}, section [global]: repo3-s3-uri-style 'virtual' is not one of host, path"
        )),
        "{e}"
    );
    // pgBackRest's spellings of words are words.
    let f = conf(
        &dir,
        "[global]\nrepo1-type=cifs\nrepo1-path=/r\ncompress-type=gz\n",
    );
    let i = parse(&["--config", &f, "backup"], &[]).unwrap();
    assert_eq!(i.settings.compression.kind, CompressType::Gzip);
    assert_eq!(i.settings.repo().unwrap().1.kind(), "posix");
    // A command's own choice: clap refuses the flag; the file's value is checked here.
    assert!(matches!(
        parse(&["restore", "--archive-mode", "on"], &[]),
        Err(ParseError::Clap(_))
    ));
    let f = conf(&dir, "[global]\narchive-mode=on\n");
    let (e, _) = config_error(parse(&["--config", &f, "restore"], &[]));
    assert!(
        e.ends_with(&format!(
            "config file {f}, section [global]: archive-mode 'on' is not one of preserve, off"
        )),
        "{e}"
    );
}

#[test]
fn an_option_that_does_not_apply_is_refused_on_the_command_line_only() {
    for argv in [
        &["archive-get", "--retention-archive", "2", "a", "b"][..],
        &["--retention-archive", "2", "archive-get", "a", "b"][..],
    ] {
        let (e, _) = config_error(parse(argv, &[]));
        assert!(
            e.contains("option retention-archive does not apply to archive-get"),
            "{e}"
        );
    }
    let (e, _) = config_error(parse(&["info", "--jobs", "2"], &[]));
    assert!(e.contains("option jobs does not apply to info"), "{e}");
    let (e, _) = config_error(parse(&["--compress-type", "lz4", "restore"], &[]));
    assert!(
        e.contains("option compress-type does not apply to restore"),
        "{e}"
    );
    // The options naming the cluster are taken by every command of a stanza.
    assert!(parse(&["info", "--pg-port", "5433", "--pg-path", "/d"], &[]).is_ok());
    let (e, _) = config_error(parse(&["archive-push", "--start-fast", "x"], &[]));
    assert!(
        e.contains("option start-fast does not apply to archive-push"),
        "{e}"
    );
    let (e, _) = config_error(parse(&["info", "--repo-s3-key-secret", "s"], &[]));
    assert!(
        e.contains("is a secret") && e.contains("PGJET_REPO_S3_KEY_SECRET"),
        "{e}"
    );
    let (e, _) = config_error(parse(&["restore", "--read-ahead", "4"], &[]));
    assert!(e.contains("environment only: set PGJET_READ_AHEAD"), "{e}");
    // In the file and the environment an option of another command is ignored silently.
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nretention-archive=2\nstart-fast=y\npg-port=5433\n",
    );
    let i = parse(
        &["--config", &f, "archive-get", "a", "b"],
        &[("PGJET_RETENTION_FULL", "2")],
    )
    .unwrap();
    assert!(i.warnings.is_empty(), "{:?}", i.warnings);
    // A command option pgBackRest users keep in the file (start-fast=y) is read from it.
    let i = parse(&["--config", &f, "backup"], &[]).unwrap();
    assert!(i.warnings.is_empty(), "{:?}", i.warnings);
    assert!(
        matches!(&i.command, Command::Backup(b) if b.start_fast),
        "{:?}",
        i.command
    );
    // A command-line-only option of this command found in the file is said to be ignored.
    let f = conf(
        &dir,
        "[global]
type=incr
",
    );
    let i = parse(&["--config", &f, "backup"], &[]).unwrap();
    assert_eq!(i.warnings.len(), 1, "{:?}", i.warnings);
    assert!(
        i.warnings[0].contains("type") && i.warnings[0].contains("only from the command line"),
        "{:?}",
        i.warnings
    );
}

#[test]
fn command_options_pgbackrest_users_keep_in_the_file_are_read_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nstart-fast=n\n[global:backup]\nstart-fast=y\n\
         [main]\ndelta=y\narchive-mode=off\nrecovery-option=recovery_min_apply_delay=5min\n\
         recovery-option=primary_conninfo=host=x\n",
    );
    // [global:backup] wins over [global].
    let i = parse(&["--config", &f, "--stanza", "main", "backup"], &[]).unwrap();
    assert!(
        matches!(&i.command, Command::Backup(b) if b.start_fast),
        "{:?}",
        i.command
    );
    // replica-create reads [global]'s start-fast=n.
    let i = parse(&["--config", &f, "replica-create"], &[]).unwrap();
    assert!(
        matches!(&i.command, Command::ReplicaCreate(r) if !r.start_fast),
        "{:?}",
        i.command
    );
    // restore: delta, archive-mode and every recovery-option line of the stanza's section.
    let i = parse(&["--config", &f, "--stanza", "main", "restore"], &[]).unwrap();
    assert!(i.warnings.is_empty(), "{:?}", i.warnings);
    let Command::Restore(r) = &i.command else {
        panic!("{:?}", i.command)
    };
    assert!(r.delta);
    assert_eq!(r.archive_mode, ArchiveMode::Off);
    assert_eq!(
        r.recovery_option,
        ["recovery_min_apply_delay=5min", "primary_conninfo=host=x"]
    );
    // The command line wins.
    let i = parse(
        &[
            "--config",
            &f,
            "--stanza",
            "main",
            "restore",
            "--archive-mode",
            "preserve",
        ],
        &[],
    )
    .unwrap();
    assert!(matches!(&i.command, Command::Restore(r) if r.archive_mode == ArchiveMode::Preserve));
    // A value that is not a boolean names the file and section.
    let f = conf(&dir, "[global]\nstart-fast=maybe\n");
    let (e, _) = config_error(parse(&["--config", &f, "backup"], &[]));
    assert!(
        e.contains("section [global]") && e.contains("start-fast"),
        "{e}"
    );
}

#[test]
fn unknown_keys_and_variables_warn_naming_where_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo-path=/r\nbogus-option=1\n[other]\nbogus-two=2\n",
    );
    let i = parse(
        &["--config", &f, "info"],
        &[
            ("PGJET_REPO_PAHT", "/x"),
            ("PGJET_PROCESS_MAX", "2"),
            // The harness's own variables and the tuning variables are not warned about.
            ("PGJET_BIN", "/usr/bin/pgjet"),
            ("PGJET_READ_AHEAD", "8"),
            ("HOME", "/root"),
        ],
    )
    .unwrap();
    let w = i.warnings.join("\n");
    assert_eq!(i.warnings.len(), 4, "{w}");
    assert!(
        w.contains(&format!(
            "config file {f}, section [global]: unknown option bogus-option"
        )),
        "{w}"
    );
    assert!(
        w.contains(&format!(
            "config file {f}, section [other]: unknown option bogus-two"
        )),
        "{w}"
    );
    assert!(
        w.contains("environment: unknown variable PGJET_REPO_PAHT"),
        "{w}"
    );
    assert!(
        w.contains("PGJET_PROCESS_MAX is not read; the variable of process-max is PGJET_JOBS"),
        "{w}"
    );
    assert_eq!(classify_env("PGJET_MILLION_DIR"), None);
    assert_eq!(classify_env("HOME"), None);
}

#[test]
fn a_pgbackrest_option_pgjet_lacks_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/r\nrepo2-retention-full=2\nrepo1-bundle=n\n[main]\npg1-database=app\n[other]\nrepo1-block=n\n",
    );
    let (e, _) = config_error(parse(&["--config", &f, "--stanza", "main", "backup"], &[]));
    assert!(
        e.contains("pgBackRest options pgjet does not implement yet; remove them: ")
            && e.contains(&format!("repo2-retention-full (config file {f}, section [global]; pgjet reads repo1-retention-full (or retention-full) and applies it to every repository)"))
            && e.contains(&format!("repo1-bundle (config file {f}, section [global]; pgjet always bundles small files)"))
            && e.contains(&format!("pg1-database (config file {f}, section [main]; pgjet connects over libpq")),
        "{e}"
    );
    // Another stanza's section is checked when that stanza is used.
    assert!(!e.contains("repo1-block"), "{e}");
    let (e, _) = config_error(parse(&["info"], &[("PGJET_ARCHIVE_MODE_CHECK", "n")]));
    assert!(
        e.contains(
            "PGJET_ARCHIVE_MODE_CHECK (environment) is a pgBackRest option pgjet does not implement yet"
        ),
        "{e}"
    );
    assert_eq!(
        classify("repo5-path"),
        Key::PgBackRest(Some("pgjet configures repositories 1 to 4"))
    );
}

/// A pgBackRest config as users keep it: every option pgjet implements, does anyway
/// (repo1-bundle=y, archive-copy=y, ...) or that only tunes pgBackRest's own processes is
/// read; only the tuning ones and the log file's are a warning.
#[test]
fn a_pgbackrest_config_as_users_keep_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/var/lib/pgbackrest\nrepo1-retention-full=2\nrepo1-bundle=y\n\
         repo1-block=y\nprocess-max=4\ncompress-type=zst\ncompress-level=3\nstart-fast=y\n\
         delta=y\narchive-async=y\nspool-path=/var/spool/pgbackrest\narchive-push-queue-max=4GiB\n\
         archive-copy=y\nchecksum-page=y\nstop-auto=y\nexpire-auto=y\nlog-level-console=info\n\
         log-level-file=detail\ndb-timeout=600\nprotocol-timeout=630\n\
         [main]\npg1-path=/var/lib/postgresql/15/main\npg1-port=5432\npg1-socket-path=/var/run/postgresql\n",
    );
    for cmd in [
        &["backup"][..],
        &["restore"],
        &["archive-push", "pg_wal/x"],
        &["check"],
    ] {
        let mut a = vec!["--config", f.as_str(), "--stanza", "main"];
        a.extend_from_slice(cmd);
        let inv = parse(&a, &[]).unwrap_or_else(|e| panic!("{cmd:?}: {e:?}"));
        let w = inv.warnings.join("\n");
        for key in ["log-level-file", "db-timeout", "protocol-timeout"] {
            assert!(w.contains(&format!("{key} is ignored")), "{cmd:?}: {w}");
        }
        assert_eq!(inv.warnings.len(), 3, "{cmd:?}: {w}");
    }
    let inv = parse(&["--config", &f, "--stanza", "main", "backup"], &[]).unwrap();
    assert!(matches!(&inv.command, Command::Backup(b) if b.start_fast));
    let inv = parse(&["--config", &f, "--stanza", "main", "restore"], &[]).unwrap();
    assert!(matches!(&inv.command, Command::Restore(r) if r.delta));
    // The same in the environment.
    let inv = parse(
        &["--repo-path", "/r", "info"],
        &[("PGJET_REPO1_BUNDLE", "y"), ("PGJET_ARCHIVE_COPY", "y")],
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let (e, _) = config_error(parse(
        &["--repo-path", "/r", "info"],
        &[("PGJET_REPO1_BUNDLE", "n")],
    ));
    assert!(e.contains("PGJET_REPO1_BUNDLE"), "{e}");
}

/// pgBackRest's logging options, as carried-over configs set them: log-level-console (and
/// log-level-stderr) is pgjet's log-level, with pgBackRest's levels; the log file's options
/// are read with a warning each, since pgjet logs to stderr only.
#[test]
fn pgbackrest_logging_options_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/r\nlog-level-console=detail\nlog-level-file=debug\nlog-path=/var/log/pgbackrest\n",
    );
    let inv = parse(&["--config", &f, "--stanza", "main", "info"], &[])
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(inv.settings.log_level, "info");
    for key in ["log-level-file", "log-path"] {
        assert!(
            inv.warnings
                .iter()
                .any(|w| w.contains(&format!("{key} is ignored: pgjet logs to stderr only"))),
            "{key}: {:?}",
            inv.warnings
        );
    }
    let inv = parse(
        &["--log-level-console", "off", "--repo-path", "/r", "info"],
        &[],
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(inv.settings.log_level, "error");
    let inv = parse(
        &["--repo-path", "/r", "info"],
        &[("PGJET_LOG_PATH", "/var/log")],
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(
        inv.warnings
            .iter()
            .any(|w| w.contains("PGJET_LOG_PATH is ignored")),
        "{:?}",
        inv.warnings
    );
    let (e, _) = config_error(parse(
        &["--log-level-console", "loud", "--repo-path", "/r", "info"],
        &[],
    ));
    assert!(
        e.contains("log-level must be error, warn, info, debug or trace"),
        "{e}"
    );
}

#[test]
fn cipher_options_choose_an_encrypted_repository_or_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Both, from the file or the environment: repository 1 or 2 is encrypted.
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/r\nrepo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass=a long secret\n",
    );
    let i = parse(&["--config", &f, "stanza-create"], &[]).unwrap();
    assert_eq!(i.settings.repo_set.ciphers.len(), 1);
    assert_eq!(i.settings.repo_set.ciphers[0].0, 1);
    assert_eq!(i.settings.repo_set.ciphers[0].1.expose(), "a long secret");
    assert!(!format!("{:?}", i.settings).contains("a long secret"));
    let i = parse(
        &["--repo-path", "/r", "backup"],
        &[
            ("PGJET_REPO2_PATH", "/two"),
            ("PGJET_REPO2_CIPHER_TYPE", "aes-256-gcm"),
            ("PGJET_REPO2_CIPHER_PASS", "env secret"),
        ],
    )
    .unwrap();
    assert_eq!(i.settings.repo_set.ciphers[0].0, 2);
    // Half a setting, another cipher, or a flag for the passphrase: refused, the value
    // never repeated.
    for (text, said) in [
        ("repo1-cipher-type=aes-256-gcm\n", "needs repo1-cipher-pass"),
        (
            "repo1-cipher-pass=secret\n",
            "repo1-cipher-type is not aes-256-gcm",
        ),
        (
            "repo1-cipher-type=aes-256-cbc\nrepo1-cipher-pass=secret\n",
            "CBC does not authenticate",
        ),
        (
            "repo1-cipher-type=rot13\nrepo1-cipher-pass=secret\n",
            "is not one of none, aes-256-gcm",
        ),
        ("cipher-pass=secret\n", "encryption is set per repository"),
    ] {
        let f = conf(&dir, &format!("[global]\nrepo1-path=/r\n{text}"));
        let (e, _) = config_error(parse(&["--config", &f, "stanza-create"], &[]));
        assert!(e.contains(said), "{text}: {e}");
        assert!(!e.contains("=secret"), "the value is not repeated: {e}");
    }
    let r = parse(
        &["--repo-cipher-pass", "x", "--repo-path", "/r", "info"],
        &[],
    );
    assert!(
        r.is_err(),
        "the passphrase is not taken on the command line"
    );
    assert_eq!(classify("cipher-pass"), Key::Cipher);
    // Asking for no encryption is not an error.
    let f = conf(&dir, "[global]\nrepo1-path=/r\nrepo1-cipher-type=none\n");
    let i = parse(&["--config", &f, "backup"], &[]).unwrap();
    assert!(i.settings.repo_set.ciphers.is_empty());
}

#[test]
fn restore_command_carries_the_given_non_secret_repository_options_only() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-s3-key=FILEKEY\nrepo1-s3-region=from-file\n",
    );
    let i = parse(
        &[
            "--config",
            &f,
            "--stanza",
            "main",
            "--repo-type",
            "s3",
            "--repo-s3-bucket",
            "bench",
            "restore",
        ],
        &[
            ("PGJET_REPO_S3_ENDPOINT", "s3.example.net"),
            ("PGJET_REPO1_S3_KEY_SECRET", "ENVSECRET"),
            ("PGJET_REPO2_PATH", "/two"),
            ("PGJET_PG_PORT", "5433"),
        ],
    )
    .unwrap();
    let carried = i.settings.carried_flags();
    assert_eq!(
        carried,
        vec![
            "--repo-type=s3".to_string(),
            "--repo-s3-bucket=bench".into(),
            "--repo-s3-endpoint=s3.example.net".into(),
        ]
    );
    let debug = format!("{:?}", i.settings.given);
    assert!(
        !debug.contains("ENVSECRET") && !debug.contains("FILEKEY"),
        "{debug}"
    );
    assert_eq!(
        i.settings.command_line_flags(),
        vec![
            format!("--config={f}"),
            "--stanza=main".into(),
            "--repo-type=s3".into(),
            "--repo-s3-bucket=bench".into(),
        ]
    );
}

#[test]
fn a_background_process_resolves_the_same_settings() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(&dir, "[global]\nrepo-path=/r\narchive-async=y\n");
    let vars = [("PGJET_SPOOL_PATH", "/spool")];
    let fg = parse(
        &[
            "--config",
            &f,
            "archive-get",
            "--stanza=main",
            "--process-max",
            "3",
            "a",
            "b",
        ],
        &vars,
    )
    .unwrap();
    let mut argv: Vec<String> = fg.settings.command_line_flags();
    argv.extend([
        "archive-get-async".to_string(),
        "000000010000000000000001 42".into(),
    ]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let bg = parse(&argv, &vars).unwrap();
    assert_eq!(format!("{:?}", fg.settings), format!("{:?}", bg.settings));
    assert_eq!(
        bg.command,
        Command::ArchiveGetAsync {
            first_request: "000000010000000000000001 42".into()
        }
    );
    let help = cli::command().render_help().to_string();
    assert!(!help.contains("archive-get-async"), "{help}");
    // The names the archive commands start their background processes with are the table's.
    for (name, cmd) in [
        (
            pgjet_core::archive::pusher::PUSH_COMMAND,
            table::Cmd::ArchivePushAsync,
        ),
        (
            pgjet_core::archive::prefetcher::GET_COMMAND,
            table::Cmd::ArchiveGetAsync,
        ),
    ] {
        let c = table::command(name).unwrap();
        assert!(c.cmd == cmd && c.hidden, "{name}");
    }
}

#[test]
fn each_command_lists_the_options_that_apply_to_it() {
    let mut root = cli::command();
    let get = root
        .find_subcommand_mut("archive-get")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(
        get.contains("--archive-get-queue-max") && !get.contains("--retention-archive"),
        "{get}"
    );
    for c in COMMANDS.iter().filter(|c| !c.hidden) {
        let help = root
            .find_subcommand_mut(c.name)
            .unwrap()
            .render_long_help()
            .to_string();
        for d in OPTIONS
            .iter()
            .filter(|d| d.places.cli && d.commands.contains(c.cmd))
        {
            assert!(
                help.contains(&format!("--{}", d.name)),
                "{} lacks --{}",
                c.name,
                d.name
            );
        }
        for d in OPTIONS.iter().filter(|d| d.secret) {
            assert!(
                !help.contains(&format!("--{} ", d.name)),
                "{} shows --{}",
                c.name,
                d.name
            );
        }
    }
}

#[test]
fn network_compress_workers_as_given_or_refused() {
    let i = parse(
        &[
            "--stanza",
            "main",
            "--network-compress-workers",
            "3",
            "backup",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(i.settings.primary.network_workers, Some(3));
    let i = parse(&["--stanza", "main", "backup"], &[]).unwrap();
    assert_eq!(i.settings.primary.network_workers, None);
    assert!(matches!(
        parse(&["--network-compress-workers", "-1", "backup"], &[]),
        Err(ParseError::Clap(_))
    ));
    let (e, _) = config_error(parse(
        &["backup"],
        &[("PGJET_NETWORK_COMPRESS_WORKERS", "two")],
    ));
    assert!(
        e.contains("PGJET_NETWORK_COMPRESS_WORKERS")
            && e.contains("'network-compress-workers=two' is not valid"),
        "{e}"
    );
}

/// Runs `prog args` with `input` on its stdin; (exit code, stderr).
fn run_with_input(prog: &str, args: &[&str], input: &[u8]) -> (Option<i32>, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{prog}: {e} (scripts/install-deps.sh installs it)"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `pgjet completion bash` is a script bash accepts, naming every visible command; `pgjet
/// man` and `pgjet man backup` are pages groff renders without a warning; other command
/// lines are not documents.
#[test]
fn completion_and_man_pages() {
    let doc = |argv: &[&str]| cli::document(argv.iter().copied());
    assert!(doc(&["pgjet", "backup"]).is_none());
    assert!(doc(&["pgjet"]).is_none());
    let bash = doc(&["pgjet", "completion", "bash"]).unwrap().unwrap();
    let text = String::from_utf8(bash.clone()).unwrap();
    for c in COMMANDS.iter().filter(|c| !c.hidden) {
        assert!(
            text.contains(c.name),
            "{} not in the bash completion",
            c.name
        );
    }
    assert!(text.contains("--repo-path"));
    // A general option's words, from the table (any value passes clap; the core checks it).
    assert!(text.contains("auto local libpq basebackup"), "{text}");
    assert_eq!(
        run_with_input("bash", &["-n"], &bash),
        (Some(0), String::new())
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        assert!(!doc(&["pgjet", "completion", shell])
            .unwrap()
            .unwrap()
            .is_empty());
    }
    assert!(doc(&["pgjet", "completion", "tcsh"]).unwrap().is_err());
    for (argv, title) in [
        (&["pgjet", "man"][..], ".TH pgjet 1"),
        (&["pgjet", "man", "backup"][..], ".TH pgjet-backup 1"),
    ] {
        let page = doc(argv).unwrap().unwrap();
        assert!(String::from_utf8_lossy(&page).contains(title), "{argv:?}");
        let (code, warnings) = run_with_input("groff", &["-man", "-Tutf8", "-ww", "-z"], &page);
        assert_eq!((code, warnings.as_str()), (Some(0), ""), "{argv:?}");
    }
    assert!(doc(&["pgjet", "man", "backup"])
        .unwrap()
        .map(|p| String::from_utf8_lossy(&p).contains("repo\\-path"))
        .unwrap());
    assert!(doc(&["pgjet", "man", "nosuch"]).unwrap().is_err());
    assert!(doc(&["pgjet", "man", "archive-push-async"])
        .unwrap()
        .is_err());
}

#[test]
fn a_config_file_others_may_read_with_a_secret_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/var/lib/pgjet\nrepo1-s3-key-secret=TopSecret42\n",
    );
    let warned = |mode: u32| {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        let i = parse(&["--config", &f, "--stanza", "main", "info"], &[]).unwrap();
        assert!(
            i.warnings.iter().all(|w| !w.contains("TopSecret42")),
            "{:?}",
            i.warnings
        );
        i.warnings
            .iter()
            .any(|w| w.contains("repo1-s3-key-secret") && w.contains("may read it"))
    };
    assert!(warned(0o644), "a world-readable file with a secret");
    assert!(!warned(0o640), "group-readable only");
    assert!(!warned(0o600), "owner only");
    // No secret, no warning.
    let f = conf(&dir, "[global]\nrepo1-path=/var/lib/pgjet\n");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let i = parse(&["--config", &f, "--stanza", "main", "info"], &[]).unwrap();
    assert!(
        i.warnings.iter().all(|w| !w.contains("may read it")),
        "{:?}",
        i.warnings
    );
}

/// pgBackRest spells retention per repository (`repo1-retention-full`, ...); pgjet reads
/// repo1's as its own retention, which applies to every repository.
#[test]
fn pgbackrests_repo1_retention_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let f = conf(
        &dir,
        "[global]\nrepo1-path=/r\nrepo1-retention-full=2\nrepo1-retention-full-type=time\nrepo1-retention-diff=3\nrepo1-retention-archive=1\n",
    );
    let i = parse(&["--config", &f, "--stanza", "main", "expire"], &[]).unwrap();
    let r = &i.settings.retention;
    assert_eq!((r.full, r.diff, r.archive), (Some(2), Some(3), Some(1)));
    assert_eq!(r.full_type, RetentionFullType::Time);
    assert!(i.warnings.is_empty(), "{:?}", i.warnings);
}
