//! The permission bits of what pgjet creates, with pgjet run under a umask that removes
//! nothing (`umask 000`, as a careless shell or service unit may have):
//!
//! - PostgreSQL 15, a cluster without group access: stanza-create, a backup, asynchronous
//!   archive-push (PostgreSQL's archive_command itself runs under umask 000) and
//!   archive-get, synchronous and asynchronous: every directory below the repository and
//!   the spool (the spool directory too, which pgjet creates) is 0750 and every file 0640,
//!   none readable by other users; archive-get's `%p` gets 0640 less the caller's umask
//!   (0600 under PostgreSQL's 077). A restore (with a tablespace) gives 0700/0600
//!   throughout, and the restored cluster starts with the same rows.
//! - PostgreSQL 18, a cluster made with `initdb -g` (group access): the repository is again
//!   0750/0640, and a restore keeps the group access: the data directory, the tablespace
//!   directory and everything below them are 0750/0640 (pg_wal/summaries, which the backup
//!   does not copy, included), and the restored cluster starts with data_directory_mode
//!   0750 and the same rows.

use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs pgjet as postgres under umask `umask` (three octal digits).
fn pgjet_umask(umask: &str, args: &[String]) -> Run {
    let script = format!("umask {umask}; exec \"$0\" \"$@\"");
    let mut a = args!["-c", script, pgjet_bin().display()];
    a.extend(args.iter().cloned());
    run_as_postgres(Path::new("/bin/sh"), &a, None)
}

/// `pgjet <cmd> <stanza args> <extra>` under umask 000; panics unless it succeeds.
fn pj000(cluster: &Cluster, cmd: &str, extra: &[&str]) -> Run {
    let mut a = vec![cmd.to_string()];
    a.extend(cluster.stanza_args(&cluster.repo));
    a.extend(extra.iter().map(|x| x.to_string()));
    pgjet_umask("000", &a).ok()
}

/// Permission bits of `p` (not following a symbolic link).
fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every directory and file below `root` (symbolic links skipped, not followed): (path,
/// is a directory, mode).
fn tree(root: &Path) -> Vec<(PathBuf, bool, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for ent in fs::read_dir(&d).unwrap_or_else(|e| panic!("list {}: {e}", d.display())) {
            let p = ent.unwrap().path();
            let meta = fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.is_dir() {
                stack.push(p.clone());
            }
            out.push((p, meta.is_dir(), meta.permissions().mode() & 0o7777));
        }
    }
    out.sort();
    out
}

/// Asserts every directory below `root` has mode `dir` and every file `file`; returns how
/// many files there are. `what` names the tree in the message.
fn assert_tree_modes(what: &str, root: &Path, dir: u32, file: u32) -> usize {
    let all = tree(root);
    let wrong: Vec<String> = all
        .iter()
        .filter(|(_, is_dir, m)| *m != if *is_dir { dir } else { file })
        .map(|(p, is_dir, m)| {
            format!(
                "{} {} {m:04o}",
                if *is_dir { "directory" } else { "file" },
                p.display()
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} entries below {} are not {dir:04o}/{file:04o}:\n{}",
        wrong.len(),
        all.len(),
        root.display(),
        wrong.join("\n")
    );
    let files = all.iter().filter(|(_, d, _)| !d).count();
    step!(
        "{what}: {} directories {dir:04o}, {files} files {file:04o}",
        all.len() - files
    );
    files
}

/// Restarts the server with `pg_ctl restart` (archive_mode needs it).
fn restart(s: &Server) {
    let (data, log) = (s.data.display().to_string(), s.log.display().to_string());
    let opts = format!("-p {} -k {}", s.port, s.sock.display());
    let a = [
        "restart", "-w", "-t", "60", "-m", "fast", "-D", &data, "-l", &log, "-o", &opts,
    ];
    let r = run_as_postgres(&s.pg.tool("pg_ctl"), &a, None);
    assert!(r.success(), "restart failed:\n{r}");
}

/// Creates tablespace ts1 at `<root>/ts1` and tables in it and in the default tablespace.
fn load(cluster: &Cluster) {
    mkdir_pg(&cluster.ts1, 0o700);
    cluster.psql(
        "postgres",
        &format!(
            "CREATE TABLESPACE ts1 LOCATION '{}';\n\
             CREATE TABLE ts_t (id int PRIMARY KEY, v text) TABLESPACE ts1;\n\
             INSERT INTO ts_t SELECT i, md5(i::text) FROM generate_series(1, 5000) i;\n\
             CREATE TABLE t (id int PRIMARY KEY, v text);\n\
             INSERT INTO t SELECT i, repeat('x', 100) FROM generate_series(1, 20000) i;\n\
             CHECKPOINT;",
            cluster.ts1.display()
        ),
    );
}

const ROWS_SQL: &str =
    "SELECT (SELECT count(*) || ':' || md5(string_agg(v, ',' ORDER BY id)) FROM ts_t) \
     || ' ' || (SELECT count(*) || ':' || md5(string_agg(v, ',' ORDER BY id)) FROM t)";

/// Restores the newest backup under umask 000 into `<root>/<name>` and `<root>/<name>-ts1`,
/// neither of which exists (pgjet creates them), archive_mode off; returns both.
fn restore000(cluster: &Cluster, name: &str) -> (PathBuf, PathBuf) {
    let (data, ts) = (
        cluster.root.join(name),
        cluster.root.join(&format!("{name}-ts1")),
    );
    let mut a = restore_args(
        &cluster.repo,
        &data,
        "latest",
        &format!("ts1={}", ts.display()),
    );
    a.extend(args!["--archive-mode", "off"]);
    pgjet_umask("000", &a).ok();
    (data, ts)
}

#[test]
fn pg15_repository_spool_and_restore_modes_under_umask_000() {
    let cluster = Cluster::new(&Pg::v15(), "modes15");
    load(&cluster);
    let spool = cluster.root.join("spool");
    let async_flags = args![
        "--archive-async=y",
        format!("--spool-path={}", spool.display())
    ];
    pj000(&cluster, "stanza-create", &[]);

    // PostgreSQL runs archive_command through sh: it runs pgjet under umask 000 too.
    let cmd = format!(
        "umask 000; exec {} --stanza=main --repo-path={} {} archive-push %p",
        pgjet_bin().display(),
        cluster.repo.display(),
        async_flags.join(" ")
    );
    cluster.psql(
        "postgres",
        &format!(
            "ALTER SYSTEM SET archive_mode = 'on'; ALTER SYSTEM SET archive_command = '{}'",
            cmd.replace('\'', "''")
        ),
    );
    restart(&cluster.server);
    pj000(&cluster, "backup", &["--type", "full", "--start-fast"]);
    let want = cluster.psql("postgres", ROWS_SQL);
    let mut last = String::new();
    for _ in 0..3 {
        cluster.psql(
            "postgres",
            "INSERT INTO t VALUES ((SELECT max(id) + 1 FROM t), 'more')",
        );
        last = cluster.psql("postgres", "SELECT pg_walfile_name(pg_switch_wal())");
    }
    let archived = wait_for(Duration::from_secs(60), || {
        let done = cluster.psql(
            "postgres",
            &format!("SELECT last_archived_wal >= '{last}' FROM pg_stat_archiver"),
        );
        (done == "t").then_some(())
    });
    assert!(
        archived.is_some(),
        "{last} was not archived in 60 s:\n{}",
        cluster.server.log_tail()
    );

    // archive-get's %p: 0640 less the caller's umask; synchronous, then asynchronous (the
    // prefetcher fills <spool>/archive/main/in).
    let got = cluster.new_dir("got");
    for (umask, extra, want) in [
        ("000", vec![], 0o640),
        ("077", vec![], 0o600),
        ("000", async_flags.clone(), 0o640),
    ] {
        let dest = got.join(format!("{umask}-{}", extra.len()));
        let mut a = args![
            "--stanza=main",
            format!("--repo-path={}", cluster.repo.display())
        ];
        a.extend(extra);
        a.extend(args!["archive-get", last, dest.display()]);
        pgjet_umask(umask, &a).ok();
        assert_eq!(
            mode(&dest),
            want,
            "archive-get under umask {umask}: {}",
            dest.display()
        );
    }

    // The repository and the spool: 0750/0640 throughout.
    let files = assert_tree_modes("repository", &cluster.repo, 0o750, 0o640);
    assert!(files > 5, "only {files} files in the repository");
    assert_eq!(mode(&spool), 0o750, "the spool directory pgjet created");
    assert_tree_modes("spool", &spool, 0o750, 0o640);
    // What asynchronous archiving writes there (the acknowledgements in out/ are removed
    // once PostgreSQL has marked their segments done; the unit tests of spool.rs cover them).
    let stanza_spool = spool.join("archive/main");
    for p in [
        "push.lock",
        "push.log",
        "get.lock",
        "get.log",
        "in/.requested",
        "out",
        "gap",
    ] {
        assert!(
            stanza_spool.join(p).exists(),
            "no {p} in {}",
            stanza_spool.display()
        );
    }

    // A restore (of the backup: --type immediate) of a cluster without group access:
    // 0700/0600, whatever pgjet's umask.
    let (data, ts) = restore000(&cluster, "restored");
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&ts), 0o700);
    assert_tree_modes("restored data directory", &data, 0o700, 0o600);
    assert_tree_modes("restored tablespace", &ts, 0o700, 0o600);
    let server = start_restored(&cluster, "restored", &data);
    assert_eq!(server.psql("postgres", "SHOW data_directory_mode"), "0700");
    assert_eq!(server.psql("postgres", ROWS_SQL), want);
}

#[test]
fn pg18_group_access_cluster_restores_with_group_modes() {
    let cluster = Cluster::with_initdb_args(&Pg::v18(), "modes18g", &["-g"]);
    assert_eq!(cluster.psql("postgres", "SHOW data_directory_mode"), "0750");
    load(&cluster);
    pj000(&cluster, "stanza-create", &[]);
    pj000(&cluster, "backup", &["--type", "full", "--start-fast"]);
    assert_tree_modes("repository", &cluster.repo, 0o750, 0o640);

    let want = cluster.psql("postgres", ROWS_SQL);
    let (data, ts) = restore000(&cluster, "restored");
    assert_eq!(mode(&data), 0o750);
    assert_eq!(mode(&ts), 0o750);
    assert!(data.join("pg_wal/summaries").is_dir());
    assert_tree_modes("restored data directory", &data, 0o750, 0o640);
    assert_tree_modes("restored tablespace", &ts, 0o750, 0o640);
    let server = start_restored(&cluster, "restored", &data);
    assert_eq!(server.psql("postgres", "SHOW data_directory_mode"), "0750");
    assert_eq!(server.psql("postgres", ROWS_SQL), want);
}
