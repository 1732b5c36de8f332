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

/// Validated settings of one invocation: what every command may read, plain. The
/// repositories ([`RepoSet`]) and the primary's connection ([`PrimaryConn`]) are held as the
/// narrow views the layers below take; the config file that was read is in both
/// ([`Settings::config_file`]), the worker threads in the primary's
/// ([`Settings::jobs`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The options given as flags or `PGJET_*` variables, secrets left out, in table
    /// order: restore_command carries the repository ones ([`Settings::carried_flags`]),
    /// a background process gets the flags ([`Settings::command_line_flags`]).
    pub given: Vec<Given>,
    /// The stanza, the repositories, their ciphers and `--repo N` (repo/).
    pub repo_set: RepoSet,
    /// `repoN-cipher-pass-new`: the passphrases `cipher-pass-change` sets, by number.
    pub ciphers_new: Vec<(u8, CipherPass)>,
    /// The data directory, the primary's connection, the transport and the worker threads
    /// (primary/).
    pub primary: PrimaryConn,
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
    /// archive-stream-slot; None: `pgjet_stream_<stanza>`.
    pub stream_slot: Option<String>,
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

    /// The config file that was read (None when there was none).
    pub fn config_file(&self) -> Option<&Path> {
        self.repo_set.config_file.as_deref()
    }

    /// Worker threads, at least 1 (`--jobs`, else the number of cores).
    pub fn jobs(&self) -> usize {
        self.primary.jobs
    }

    /// The stanza, required by most commands.
    pub fn stanza(&self) -> Result<&str> {
        self.repo_set.stanza()
    }

    /// The repository a command uses: `--repo N`, else the first configured one.
    ///
    /// Errors: no repository configured, or `--repo N` names one that is not.
    pub fn repo(&self) -> Result<(u8, &RepoConfig)> {
        self.repo_set.repo()
    }

    /// Which config file was read, for messages: "config file F read", or that the
    /// default one does not exist.
    pub fn config_note(&self) -> String {
        config_note(self.config_file())
    }

    /// The data directory (`--pg-path`).
    pub fn pg_path(&self) -> Result<&Path> {
        self.primary.pg_path()
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
