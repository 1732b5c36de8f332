//! Layered settings: config file, then `PGJET_*` environment, then flags (flags win).
//!
//! The config file is INI (the shape pgBackRest users know):
//!
//! ```ini
//! [global]
//! repo-path=/var/lib/pgjet
//! compress-type=zstd
//!
//! [main]
//! pg-path=/var/lib/postgresql/15/main
//! pg-port=5432
//! ```
//!
//! Keys are the long flag names without `--`. A `[<stanza>]` section overrides `[global]`.
//! pgBackRest spellings `pg1-path`, `pg1-port`, `pg1-socket-path`, `pg1-user`, `pg1-host`
//! and `process-max` are accepted as aliases. Repositories are `repo-*` / `repoN-*`
//! (see [`repo`]).
pub mod repo;

pub use repo::{RepoConfig, StorageTls, UriStyle, MAX_REPOS};

use crate::cli::{GlobalArgs, Transport};
use crate::codec::{CompressType, Compression};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Default config file, read only if it exists.
pub const DEFAULT_CONFIG: &str = "/etc/pgjet/pgjet.conf";
/// Default PostgreSQL port.
pub const DEFAULT_PG_PORT: u16 = 5432;
/// Default Unix socket directory (Debian's PostgreSQL default).
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// Output format of commands that print data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

/// Validated settings of one invocation.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The config file that was read (None when there was none).
    pub config_file: Option<PathBuf>,
    /// Repository 1's options given as flags or their `PGJET_REPO_*` variables, as
    /// `--name=value` words (never credentials: those have no flags), for the commands pgjet
    /// writes for later runs (restore_command).
    pub repo_flags: Vec<String>,
    pub stanza: Option<String>,
    /// The configured repositories, by number (1..=[`MAX_REPOS`]), in order.
    pub repos: Vec<(u8, RepoConfig)>,
    /// `--repo N`: the repository a command uses (default: the first configured).
    pub repo: Option<u8>,
    pub pg_path: Option<PathBuf>,
    pub pg_port: u16,
    pub pg_socket_path: PathBuf,
    pub pg_user: String,
    /// Worker threads, at least 1.
    pub jobs: usize,
    /// The primary's connection string (--source / --pg-host); a bare host name is turned
    /// into `host=NAME`.
    pub source: Option<String>,
    /// How the primary's files are read.
    pub transport: Transport,
    /// Whether `jobs` was given (flag, environment or file) rather than defaulted to the
    /// number of cores; a libpq source picks its own default then.
    pub jobs_given: bool,
    pub compression: Compression,
    pub log_level: String,
    pub output: Output,
    /// WAL archiving settings.
    pub archive: ArchiveSettings,
    /// Retention (expire).
    pub retention: Retention,
}

/// How retention-full counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionFullType {
    /// Keep the newest N full backups.
    Count,
    /// Keep full backups from the last N days, and the newest one before them (so the
    /// whole window can be recovered to).
    Time,
}

/// The retention policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// retention-full: None keeps every backup.
    pub full: Option<u32>,
    pub full_type: RetentionFullType,
    /// retention-archive: None keeps the archive of every kept backup.
    pub archive: Option<u32>,
}

/// Default `archive-timeout`, seconds.
pub const DEFAULT_ARCHIVE_TIMEOUT: f64 = 60.0;
/// Default spool directory of asynchronous archiving.
pub const DEFAULT_SPOOL_PATH: &str = "/var/spool/pgjet";
/// Default `archive-get-queue-max`, bytes (pgBackRest's default too).
pub const DEFAULT_ARCHIVE_GET_QUEUE_MAX: u64 = 128 << 20;

/// The settings of WAL archiving (archive-push, archive-get, and backup's archive check).
#[derive(Debug, Clone, PartialEq)]
pub struct ArchiveSettings {
    /// How long to wait for a segment to be archived, in seconds.
    pub timeout: f64,
    /// archive-async=y.
    pub asynchronous: bool,
    pub spool_path: PathBuf,
    /// archive-push-queue-max in bytes; None: no limit.
    pub push_queue_max: Option<u64>,
    /// archive-get-queue-max in bytes.
    pub get_queue_max: u64,
    /// archive-check (backup waits for its WAL in the archive).
    pub check: bool,
}

/// Parses a size: digits with an optional suffix B, KB, MB, GB, TB (powers of 1024, as
/// pgBackRest reads them; KiB, MiB, GiB, TiB too), case-insensitive.
///
/// Errors: [`Error::Config`] naming `key`.
pub fn parse_size(key: &str, v: &str) -> Result<u64> {
    let t = v.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => u64::MAX,
    };
    num.parse::<u64>()
        .ok()
        .filter(|_| mult != u64::MAX)
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            Error::Config(format!(
                "{key}: '{v}' is not a size (a number with an optional KB, MB, GB or TB)"
            ))
        })
}

/// Parses y/n (also true/false, on/off, 1/0). Errors: [`Error::Config`] naming `key`.
pub fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" | "true" | "on" | "1" => Ok(true),
        "n" | "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(Error::Config(format!("{key}: '{v}' is not y or n"))),
    }
}

const KEYS: &[(&str, &str)] = &[
    ("pg1-path", "pg-path"),
    ("pg1-port", "pg-port"),
    ("pg1-socket-path", "pg-socket-path"),
    ("pg1-user", "pg-user"),
    ("process-max", "jobs"),
    ("pg1-host", "source"),
];

/// Reads `key` from the stanza section, then from `[global]`.
fn file_value(ini: Option<&ini::Ini>, stanza: Option<&str>, key: &str) -> Option<String> {
    let ini = ini?;
    let lookup = |section: Option<&str>| -> Option<String> {
        let props = ini.section(section)?;
        props.get(key).map(str::to_owned).or_else(|| {
            KEYS.iter()
                .find(|(alias, name)| *name == key && props.contains_key(alias))
                .and_then(|(alias, _)| props.get(alias).map(str::to_owned))
        })
    };
    stanza
        .and_then(|s| lookup(Some(s)))
        .or_else(|| lookup(Some("global")))
}

/// The environment variable of an option: `repo2-s3-key` -> `PGJET_REPO2_S3_KEY`.
fn env_name(key: &str) -> String {
    format!("PGJET_{}", key.to_uppercase().replace('-', "_"))
}

fn parse<T: std::str::FromStr>(key: &str, v: String) -> Result<T> {
    v.trim()
        .parse()
        .map_err(|_| Error::Config(format!("config file: '{key}={v}' is not valid")))
}

impl Settings {
    /// Merges flags/environment (already merged by clap) with the config file.
    ///
    /// Errors: an explicit `--config` that cannot be read, a malformed file, or a value out of
    /// range (`--jobs 0`, unknown compress type, bad level, log level or output).
    pub fn resolve(args: &GlobalArgs) -> Result<Settings> {
        let (path, explicit) = match &args.config {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        let ini = if explicit || Path::new(&path).exists() {
            Some(ini::Ini::load_from_file(&path).map_err(|e| {
                Error::Config(format!("cannot read config file {}: {e}", path.display()))
            })?)
        } else {
            None
        };
        let config_file = ini.as_ref().map(|_| path.clone());
        let ini = ini.as_ref();
        let stanza = args
            .stanza
            .clone()
            .or_else(|| file_value(ini, None, "stanza"));
        let st = stanza.as_deref();
        let get = |key: &str| file_value(ini, st, key);

        // Repository options: repository 1's flags, then PGJET_<OPTION>, then the file.
        let flags: [(&str, Option<String>); 8] = [
            (
                "repo-path",
                args.repo_path.as_ref().map(|p| p.display().to_string()),
            ),
            ("repo-type", args.repo_type.clone()),
            ("repo-s3-bucket", args.repo_s3_bucket.clone()),
            ("repo-s3-endpoint", args.repo_s3_endpoint.clone()),
            ("repo-s3-region", args.repo_s3_region.clone()),
            ("repo-s3-uri-style", args.repo_s3_uri_style.clone()),
            (
                "repo-storage-verify-tls",
                args.repo_storage_verify_tls.clone(),
            ),
            (
                "repo-storage-ca-file",
                args.repo_storage_ca_file
                    .as_ref()
                    .map(|p| p.display().to_string()),
            ),
        ];
        let repo_opt = |key: &str| -> Option<String> {
            flags
                .iter()
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| v.clone())
                .or_else(|| std::env::var(env_name(key)).ok())
                .or_else(|| get(key))
        };
        let repo_flags = flags
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("--{k}={v}")))
            .collect();
        let mut repos = Vec::new();
        for n in 1..=MAX_REPOS {
            if let Some(c) = RepoConfig::resolve(n, &repo_opt)? {
                repos.push((n, c));
            }
        }
        let repo = match (args.repo, get("repo")) {
            (Some(n), _) => Some(n),
            (None, Some(v)) => Some(parse("repo", v)?),
            (None, None) => None,
        };
        if let Some(n) = repo {
            if n == 0 || n > MAX_REPOS {
                return Err(Error::Config(format!(
                    "--repo must be between 1 and {MAX_REPOS}, not {n}"
                )));
            }
        }
        let pg_path = args
            .pg_path
            .clone()
            .or_else(|| get("pg-path").map(PathBuf::from));
        let pg_port = match (args.pg_port, get("pg-port")) {
            (Some(p), _) => p,
            (None, Some(v)) => parse("pg-port", v)?,
            (None, None) => DEFAULT_PG_PORT,
        };
        let pg_socket_path = args
            .pg_socket_path
            .clone()
            .or_else(|| get("pg-socket-path").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_DIR));
        let pg_user = args
            .pg_user
            .clone()
            .or_else(|| get("pg-user"))
            .unwrap_or_else(|| "postgres".into());
        let source = args
            .source
            .clone()
            .or_else(|| get("source"))
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                if v.contains('=') || v.contains("://") {
                    v
                } else {
                    format!("host={}", v.trim())
                }
            });
        let transport = match args
            .transport
            .clone()
            .or_else(|| get("transport"))
            .as_deref()
        {
            None | Some("auto") => Transport::Auto,
            Some("local") => Transport::Local,
            Some("libpq") => Transport::Libpq,
            Some(o) => {
                return Err(Error::Config(format!(
                    "transport '{o}' is not one of auto, local, libpq"
                )))
            }
        };
        let jobs_given = args.jobs.is_some() || get("jobs").is_some();
        let jobs = match (args.jobs, get("jobs")) {
            (Some(j), _) => j,
            (None, Some(v)) => parse("jobs", v)?,
            (None, None) => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
        };
        if jobs == 0 || jobs > 256 {
            return Err(Error::Config(format!(
                "jobs must be between 1 and 256, not {jobs}"
            )));
        }
        let kind: CompressType = args
            .compress_type
            .clone()
            .or_else(|| get("compress-type"))
            .unwrap_or_else(|| "zstd".into())
            .parse()
            .map_err(Error::Config)?;
        let level = match (args.compress_level, get("compress-level")) {
            (Some(l), _) => Some(l),
            (None, Some(v)) => Some(parse("compress-level", v)?),
            (None, None) => None,
        };
        let compression = Compression::new(kind, level).map_err(Error::Config)?;
        let log_level = args
            .log_level
            .clone()
            .or_else(|| get("log-level"))
            .unwrap_or_else(|| "info".into());
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(Error::Config(format!(
                "log-level must be error, warn, info or debug, not '{log_level}'"
            )));
        }
        let output = match args.output.clone().or_else(|| get("output")).as_deref() {
            None | Some("text") => Output::Text,
            Some("json") => Output::Json,
            Some(o) => {
                return Err(Error::Config(format!(
                    "output must be text or json, not '{o}'"
                )))
            }
        };
        let archive = ArchiveSettings {
            timeout: match (args.archive_timeout, get("archive-timeout")) {
                (Some(t), _) => t,
                (None, Some(v)) => parse("archive-timeout", v)?,
                (None, None) => DEFAULT_ARCHIVE_TIMEOUT,
            },
            asynchronous: match args.archive_async.clone().or_else(|| get("archive-async")) {
                Some(v) => parse_bool("archive-async", &v)?,
                None => false,
            },
            spool_path: args
                .spool_path
                .clone()
                .or_else(|| get("spool-path").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SPOOL_PATH)),
            push_queue_max: match args
                .archive_push_queue_max
                .clone()
                .or_else(|| get("archive-push-queue-max"))
            {
                Some(v) => Some(parse_size("archive-push-queue-max", &v)?),
                None => None,
            },
            get_queue_max: match args
                .archive_get_queue_max
                .clone()
                .or_else(|| get("archive-get-queue-max"))
            {
                Some(v) => parse_size("archive-get-queue-max", &v)?,
                None => DEFAULT_ARCHIVE_GET_QUEUE_MAX,
            },
            check: match args.archive_check.clone().or_else(|| get("archive-check")) {
                Some(v) => parse_bool("archive-check", &v)?,
                None => true,
            },
        };
        if !(archive.timeout > 0.0 && archive.timeout <= 86400.0) {
            return Err(Error::Config(format!(
                "archive-timeout must be between 0 and 86400 seconds, not {}",
                archive.timeout
            )));
        }
        let count = |key: &str, flag: Option<u32>| -> Result<Option<u32>> {
            let v = match (flag, get(key)) {
                (Some(v), _) => Some(v),
                (None, Some(v)) => Some(parse(key, v)?),
                (None, None) => None,
            };
            if v == Some(0) {
                return Err(Error::Config(format!("{key} must be at least 1")));
            }
            Ok(v)
        };
        let retention = Retention {
            full: count("retention-full", args.retention_full)?,
            full_type: match args
                .retention_full_type
                .clone()
                .or_else(|| get("retention-full-type"))
                .as_deref()
            {
                None | Some("count") => RetentionFullType::Count,
                Some("time") => RetentionFullType::Time,
                Some(o) => {
                    return Err(Error::Config(format!(
                        "retention-full-type must be count or time, not '{o}'"
                    )))
                }
            },
            archive: count("retention-archive", args.retention_archive)?,
        };
        Ok(Settings {
            retention,
            config_file,
            repo_flags,
            archive,
            stanza,
            repos,
            repo,
            pg_path,
            pg_port,
            pg_socket_path,
            pg_user,
            jobs,
            jobs_given,
            source,
            transport,
            compression,
            log_level,
            output,
        })
    }

    /// The stanza, required by most commands.
    pub fn stanza(&self) -> Result<&str> {
        self.stanza
            .as_deref()
            .ok_or_else(|| Error::Config("--stanza is required".into()))
    }

    /// The repository a command uses: `--repo N`, else the first configured one.
    ///
    /// Errors: no repository configured, or `--repo N` names one that is not.
    pub fn repo(&self) -> Result<(u8, &RepoConfig)> {
        match self.repo {
            Some(n) => self
                .repos
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(k, c)| (*k, c))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "--repo {n}: repository {n} is not configured (set repo{n}-type and repo{n}-path or its store's options)"
                    ))
                }),
            None => self.repos.first().map(|(k, c)| (*k, c)).ok_or_else(|| {
                Error::Config(
                    "no repository configured: --repo-path is required (or repo-type=s3|gcs|azure|sftp with its options)"
                        .into(),
                )
            }),
        }
    }

    /// The data directory (`--pg-path`).
    pub fn pg_path(&self) -> Result<&Path> {
        self.pg_path
            .as_deref()
            .ok_or_else(|| Error::Config("--pg-path is required".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_file_and_stanza_beats_global() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgjet.conf");
        std::fs::write(&f, "[global]\nrepo1-path=/g\ncompress-type=lz4\nprocess-max=3\n[main]\npg-path=/s\npg-port=6000\n").unwrap();
        let mut a = GlobalArgs {
            config: Some(f.clone()),
            stanza: Some("main".into()),
            ..Default::default()
        };
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(
            s.repo().unwrap(),
            (1, &RepoConfig::Posix { path: "/g".into() })
        );
        assert_eq!(s.pg_path.as_deref(), Some(Path::new("/s")));
        assert_eq!(
            (s.pg_port, s.jobs, s.compression.kind),
            (6000, 3, CompressType::Lz4)
        );
        a.pg_port = Some(7000);
        a.jobs = Some(1);
        let s = Settings::resolve(&a).unwrap();
        assert_eq!((s.pg_port, s.jobs), (7000, 1));
    }

    #[test]
    fn a_repo_that_is_not_configured_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgjet.conf");
        std::fs::write(&f, "[global]\nrepo1-path=/a\nrepo2-path=/b\n").unwrap();
        let mut a = GlobalArgs {
            config: Some(f),
            repo: Some(2),
            ..Default::default()
        };
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(
            s.repo().unwrap(),
            (2, &RepoConfig::Posix { path: "/b".into() })
        );
        a.repo = Some(3);
        let e = Settings::resolve(&a)
            .unwrap()
            .repo()
            .unwrap_err()
            .to_string();
        assert!(e.contains("repository 3 is not configured"), "{e}");
        a.repo = Some(5);
        assert!(matches!(Settings::resolve(&a), Err(Error::Config(_))));
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
        let a = GlobalArgs {
            config: Some("/nonexistent/pgjet.conf".into()),
            ..Default::default()
        };
        assert!(matches!(Settings::resolve(&a), Err(Error::Config(_))));
        let a = GlobalArgs {
            jobs: Some(0),
            ..Default::default()
        };
        assert!(matches!(Settings::resolve(&a), Err(Error::Config(_))));
        let a = GlobalArgs {
            compress_type: Some("xz".into()),
            ..Default::default()
        };
        assert!(matches!(Settings::resolve(&a), Err(Error::Config(_))));
    }
}
