//! pgjet's options: one table ([`table::OPTIONS`]) from which the command line, the
//! environment and config-file lookup, and the flags restore_command carries all come.
//!
//! Each option is read from, in order: its flag, its environment variable (`PGJET_<NAME>`),
//! the config file (`[<stanza>:<command>]`, `[<stanza>]`, `[global:<command>]`, then
//! `[global]`), else its default. The config file is INI (the shape pgBackRest users know):
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
//! Keys are the long flag names without `--`; pgBackRest spellings `pg1-path`, `pg1-port`,
//! `pg1-socket-path`, `pg1-user`, `pg1-host` and `process-max` are aliases. Repositories are
//! `repo-*` / `repoN-*` (see [`repo`]).
//!
//! What is not read is said, never silently dropped ([`resolve`]):
//! - a flag that does not apply to the command is refused ("option retention-archive does
//!   not apply to archive-get"); in the environment or the file such an option is ignored
//!   (one config file serves every command);
//! - an unknown key in the file, or an unknown `PGJET_*` variable, is a warning naming it
//!   and where it was;
//! - a pgBackRest option pgjet does not implement is an error naming it; so is a cipher
//!   type other than `none` and `aes-256-gcm`, and a cipher key that is not pgjet's.
pub mod command;
pub mod kind;
pub mod patroni;
pub mod pgbackrest;
pub mod repo;
pub mod resolve;
pub mod table;
pub mod views;

pub use command::{
    ArchiveMode, BackupOptions, BackupType, Command, ExpireOptions, InfoFormat, InfoOptions,
    NetworkCompress, ReplicaOptions, RestoreOptions, RestoreType, Seed, TargetAction, Transport,
    VerifyOptions,
};
pub use kind::{Kind, Value};
pub use repo::MAX_REPOS;
pub use resolve::{Given, Invocation};
pub use views::{ArchiveConfig, PrimaryConn, RepoSet};

use crate::codec::Compression;
use crate::error::{Error, Result};
use crate::storage::config::RepoConfig;
use std::path::{Path, PathBuf};

/// Default config file, read only if it exists.
pub const DEFAULT_CONFIG: &str = "/etc/pgjet/pgjet.conf";
/// Default PostgreSQL port.
pub const DEFAULT_PG_PORT: u16 = 5432;
/// Default Unix socket directory (Debian's PostgreSQL default).
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";
/// Default `archive-timeout`, seconds.
pub const DEFAULT_ARCHIVE_TIMEOUT: f64 = 60.0;
/// Default spool directory of asynchronous archiving.
pub const DEFAULT_SPOOL_PATH: &str = "/var/spool/pgjet";
/// Default `archive-get-queue-max`, bytes (pgBackRest's default too).
pub const DEFAULT_ARCHIVE_GET_QUEUE_MAX: u64 = 128 << 20;
/// The most `jobs` (the table's bound; the number of cores is taken up to it).
pub const MAX_JOBS: usize = 256;

/// Output format of commands that print data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    /// Prometheus' text exposition format (`info` only).
    Prometheus,
}
words!(Output, "output", {
    "text" => Text: "",
    "json" => Json: "",
    "prometheus" => Prometheus: "",
});

/// Validated settings of one invocation: what every command may read, plain.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The config file that was read (None when there was none).
    pub config_file: Option<PathBuf>,
    /// The options given as flags or `PGJET_*` variables, secrets left out, in table
    /// order: restore_command carries the repository ones ([`Settings::carried_flags`]),
    /// a background process gets the flags ([`Settings::command_line_flags`]).
    pub given: Vec<Given>,
    pub stanza: Option<String>,
    /// The configured repositories, by number (1..=[`MAX_REPOS`]), in order.
    pub repos: Vec<(u8, RepoConfig)>,
    /// The passphrases of the repositories with `repoN-cipher-type=aes-256-gcm`, by number.
    pub ciphers: Vec<(u8, CipherPass)>,
    /// `repoN-cipher-pass-new`: the passphrases `cipher-pass-change` sets, by number.
    pub ciphers_new: Vec<(u8, CipherPass)>,
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
    /// How the server compresses a `BASE_BACKUP` stream (--network-compress).
    pub network_compress: NetworkCompress,
    /// --compress-level-network; None: the server's default.
    pub network_level: Option<i32>,
    /// --network-compress-workers: zstd threads on the server; None: the primary's
    /// `max_parallel_maintenance_workers`.
    pub network_workers: Option<u32>,
    /// --max-rate, bytes per second; None: no limit.
    pub max_rate: Option<u64>,
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
    /// `resume`: a backup resumes an interrupted one ([`crate::repo::resume`]).
    pub resume: bool,
    /// `manifest-save-threshold`: bytes of files stored between saves of a backup's resume
    /// journal (at least 1 MiB).
    pub manifest_save_threshold: u64,
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
words!(RetentionFullType, "retention-full type", {
    "count" => Count: "",
    "time" => Time: "",
});

/// The retention policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// retention-full: None keeps every backup.
    pub full: Option<u32>,
    pub full_type: RetentionFullType,
    /// retention-diff: differential backups to keep; None keeps all (that retention-full
    /// keeps).
    pub diff: Option<u32>,
    /// retention-archive: None keeps the archive of every kept backup.
    pub archive: Option<u32>,
}

impl Retention {
    /// True when any of retention-full, retention-diff and retention-archive is set: only
    /// then does `expire` remove anything.
    pub fn is_set(&self) -> bool {
        self.full.is_some() || self.diff.is_some() || self.archive.is_some()
    }
}

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

/// Parses a size ([`Kind::Size`]): digits with an optional suffix B, KB, MB, GB, TB (powers of
/// 1024, as pgBackRest reads them; KiB, MiB, GiB, TiB too), case-insensitive.
///
/// Errors: [`Error::Config`] naming `key`.
pub fn parse_size(key: &str, v: &str) -> Result<u64> {
    let value = Kind::Size.check(key, v).map_err(Error::Config)?;
    value
        .size()
        .ok_or_else(|| Error::Config(format!("{key}: '{v}' is not a size")))
}

/// Parses y/n (also true/false, on/off, 1/0: [`Kind::Bool`]). Errors: [`Error::Config`]
/// naming `key`.
pub fn parse_bool(key: &str, v: &str) -> Result<bool> {
    let value = Kind::Bool.check(key, v).map_err(Error::Config)?;
    value
        .bool()
        .ok_or_else(|| Error::Config(format!("{key}: '{v}' is not y or n")))
}

impl Settings {
    /// Resolves settings as if `flags` (option name, value) were given on the command line,
    /// with no environment, and the config file `config` names among them (else the default
    /// one when it exists); every option applies. For tests and tools that call the library
    /// directly.
    ///
    /// Errors: as [`resolve::resolve_settings`].
    pub fn from_flags(flags: &[(&str, String)]) -> Result<Settings> {
        let cli = flags
            .iter()
            .map(|(k, v)| (k.to_string(), vec![v.clone()]))
            .collect();
        let mut warnings = Vec::new();
        resolve::resolve_settings(None, &cli, &resolve::NoEnv, &mut warnings)
    }

    /// The stanza, required by most commands.
    pub fn stanza(&self) -> Result<&str> {
        need_stanza(self.stanza.as_deref(), self.config_file.as_deref())
    }

    /// The repository a command uses: `--repo N`, else the first configured one.
    ///
    /// Errors: no repository configured, or `--repo N` names one that is not.
    pub fn repo(&self) -> Result<(u8, &RepoConfig)> {
        need_repo(&self.repos, self.repo, self.config_file.as_deref())
    }

    /// Which config file was read, for messages: "config file F read", or that the
    /// default one does not exist.
    pub fn config_note(&self) -> String {
        config_note(self.config_file.as_deref())
    }

    /// The data directory (`--pg-path`).
    pub fn pg_path(&self) -> Result<&Path> {
        need_pg_path(self.pg_path.as_deref(), self.config_file.as_deref())
    }

    /// The repository options restore_command carries, as `--name=value` words: repository
    /// 1's options that have a flag and are not secret ([`table::OptionDef::carried`]),
    /// given as flags or `PGJET_*` variables, in table order. Secrets never; what came from
    /// the config file is carried by `--config`.
    pub fn carried_flags(&self) -> Vec<String> {
        self.given
            .iter()
            .filter(|g| g.repo == Some(1))
            .filter(|g| table::find(g.name, None).is_some_and(|d| d.carried()))
            .map(Given::flag)
            .collect()
    }

    /// The options given on the command line, as `--name=value` words (`--name` for a
    /// switch), in table order: what a background process started for this invocation
    /// gets, so that it resolves the same settings.
    pub fn command_line_flags(&self) -> Vec<String> {
        self.given
            .iter()
            .filter(|g| !g.from_env)
            .map(Given::flag)
            .collect()
    }
}

/// The stanza `stanza`. Errors: none given ([`config_note`] says which file was read).
fn need_stanza<'a>(stanza: Option<&'a str>, config_file: Option<&Path>) -> Result<&'a str> {
    stanza.ok_or_else(|| {
        Error::Config(format!(
            "--stanza is required; {}",
            config_note(config_file)
        ))
    })
}

/// The repository of `repos` a command uses: `repo` (`--repo N`), else the first configured.
///
/// Errors: no repository configured, or `repo` names one that is not.
fn need_repo<'a>(
    repos: &'a [(u8, RepoConfig)],
    repo: Option<u8>,
    config_file: Option<&Path>,
) -> Result<(u8, &'a RepoConfig)> {
    match repo {
        Some(n) => repos
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(k, c)| (*k, c))
            .ok_or_else(|| {
                Error::Config(format!(
                    "--repo {n}: repository {n} is not configured (set repo{n}-type and repo{n}-path or its store's options)"
                ))
            }),
        None => repos.first().map(|(k, c)| (*k, c)).ok_or_else(|| {
            Error::Config(format!(
                "no repository configured: --repo-path is required (or repo-type=s3|gcs|azure|sftp with its options); {}",
                config_note(config_file)
            ))
            .with_hint(format!(
                "set repo1-path (or repo1-type and its options) in the config file; a command PostgreSQL runs (archive_command, restore_command) has none of your shell's PGJET_* variables, so give it the file: archive_command = 'pgjet --config {} --stanza=NAME archive-push %p'",
                config_file.map(|p| p.display().to_string()).unwrap_or_else(|| "/path/to/pgjet.conf".into())
            ))
        }),
    }
}

/// The data directory `pg_path` (`--pg-path`). Errors: not given.
fn need_pg_path<'a>(pg_path: Option<&'a Path>, config_file: Option<&Path>) -> Result<&'a Path> {
    pg_path.ok_or_else(|| {
        Error::Config(format!(
            "--pg-path is required; {}",
            config_note(config_file)
        ))
    })
}

/// Which config file was read, for messages: "config file F read", or that the default
/// one does not exist.
fn config_note(config_file: Option<&Path>) -> String {
    match config_file {
        Some(p) => format!("config file {} read", p.display()),
        None => format!(
            "no config file read ({DEFAULT_CONFIG} does not exist; --config FILE or PGJET_CONFIG names another)"
        ),
    }
}

/// `repoN-cipher-type`: whether repository N is encrypted (docs/encryption.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherType {
    None,
    Aes256Gcm,
}
words!(CipherType, "cipher type", {
    "none" => None: "",
    "aes-256-gcm" => Aes256Gcm: "",
});

/// The one cipher of an encrypted repository (`repoN-cipher-type`; docs/encryption.md).
pub const CIPHER_TYPE: &str = CipherType::Aes256Gcm.as_str();

/// A repository's passphrase (`repoN-cipher-pass`): never printed, wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct CipherPass(zeroize::Zeroizing<String>);

impl CipherPass {
    /// The passphrase `pass`, as read from the config file or the environment.
    pub fn new(pass: String) -> CipherPass {
        CipherPass(zeroize::Zeroizing::new(pass))
    }

    /// The passphrase itself, for the key derivation only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for CipherPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CipherPass(..)")
    }
}
