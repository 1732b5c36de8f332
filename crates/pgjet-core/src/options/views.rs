//! The narrow settings each layer takes, handed down from the top (commands/): the
//! repository set with its ciphers (repo/) and the primary's connection and transport choice
//! (primary/, pgdata/'s standby settings), which the resolved [`Settings`] holds, and WAL
//! archiving's settings (archive/, and the restore_command pgdata/ writes), built from it.
//! No layer below commands/ reads [`Settings`] itself.
use super::{config_note, ArchiveSettings, CipherPass, NetworkCompress, Settings, Transport};
use crate::codec::Compression;
use crate::error::{Error, Result};
use crate::storage::config::RepoConfig;
use std::path::{Path, PathBuf};

/// The repositories of one invocation with their ciphers: what repo/ opens
/// (`crate::repo::open`).
#[derive(Debug, Clone)]
pub struct RepoSet {
    /// `--stanza`; None when not given (most commands require it: [`RepoSet::stanza`]).
    pub stanza: Option<String>,
    /// The configured repositories, by number (1..=[`super::MAX_REPOS`]), in order.
    pub repos: Vec<(u8, RepoConfig)>,
    /// The passphrases of the repositories with `repoN-cipher-type=aes-256-gcm`, by number.
    pub ciphers: Vec<(u8, CipherPass)>,
    /// `--repo N`: the repository a command uses (default: the first configured).
    pub repo: Option<u8>,
    /// The config file that was read (None when there was none), for messages.
    pub config_file: Option<PathBuf>,
}

impl RepoSet {
    /// The stanza. Errors: none given.
    pub fn stanza(&self) -> Result<&str> {
        self.stanza.as_deref().ok_or_else(|| {
            Error::Config(format!(
                "--stanza is required; {}",
                config_note(self.config_file.as_deref())
            ))
        })
    }

    /// The repository a command uses: `--repo N`, else the first configured one.
    ///
    /// Errors: no repository configured, or `--repo N` names one that is not.
    pub fn repo(&self) -> Result<(u8, &RepoConfig)> {
        let config_file = self.config_file.as_deref();
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
}

/// How the cluster being copied is reached: the primary's connection and the transport
/// choice (primary/), and the local cluster's port and directory.
#[derive(Debug, Clone)]
pub struct PrimaryConn {
    /// `--pg-path`: the data directory ([`PrimaryConn::pg_path`]).
    pub pg_path: Option<PathBuf>,
    pub pg_port: u16,
    pub pg_socket_path: PathBuf,
    pub pg_user: String,
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
    /// Worker threads, at least 1.
    pub jobs: usize,
    /// Whether `jobs` was given (flag, environment or file) rather than defaulted to the
    /// number of cores; a libpq source picks its own default then.
    pub jobs_given: bool,
    /// The config file that was read (None when there was none), for messages; the same
    /// as [`RepoSet::config_file`].
    pub config_file: Option<PathBuf>,
}

impl PrimaryConn {
    /// The data directory (`--pg-path`). Errors: not given.
    pub fn pg_path(&self) -> Result<&Path> {
        self.pg_path.as_deref().ok_or_else(|| {
            Error::Config(format!(
                "--pg-path is required; {}",
                config_note(self.config_file.as_deref())
            ))
        })
    }
}

/// WAL archiving's settings (archive/): the repositories, the archive options, compression,
/// and how a pgjet it starts (the background pusher or prefetcher, restore_command) gets the
/// same settings.
#[derive(Debug, Clone)]
pub struct ArchiveConfig {
    pub repo_set: RepoSet,
    pub archive: ArchiveSettings,
    pub compression: Compression,
    pub jobs: usize,
    pub pg_path: Option<PathBuf>,
    /// The options given on the command line, as `--name=value` words
    /// ([`Settings::command_line_flags`]): what a background process gets.
    pub command_line_flags: Vec<String>,
    /// Repository 1's options restore_command carries ([`Settings::carried_flags`]).
    pub carried_flags: Vec<String>,
}

impl ArchiveConfig {
    /// The stanza. Errors: none given.
    pub fn stanza(&self) -> Result<&str> {
        self.repo_set.stanza()
    }

    /// The config file that was read.
    pub fn config_file(&self) -> Option<&Path> {
        self.repo_set.config_file.as_deref()
    }
}

impl Settings {
    /// WAL archiving's settings (archive/).
    pub fn archive_config(&self) -> ArchiveConfig {
        ArchiveConfig {
            repo_set: self.repo_set.clone(),
            archive: self.archive.clone(),
            compression: self.compression,
            jobs: self.primary.jobs,
            pg_path: self.primary.pg_path.clone(),
            command_line_flags: self.command_line_flags(),
            carried_flags: self.carried_flags(),
        }
    }
}
