//! The narrow settings each layer takes, built once at the top (commands/) from the resolved
//! [`Settings`]: the repository set with its ciphers (repo/), the primary's connection and
//! transport choice (primary/, pgdata/'s standby settings), and WAL archiving's settings
//! (archive/, and the restore_command pgdata/ writes). No layer below commands/ reads
//! [`Settings`] itself.
use super::{
    need_pg_path, need_repo, need_stanza, ArchiveSettings, CipherPass, NetworkCompress, Settings,
    Transport,
};
use crate::codec::Compression;
use crate::error::Result;
use crate::storage::config::RepoConfig;
use std::path::{Path, PathBuf};

/// The repositories of one invocation with their ciphers: what repo/ opens
/// (`crate::repo::open`).
#[derive(Debug, Clone)]
pub struct RepoSet {
    pub stanza: Option<String>,
    /// The configured repositories, by number (1..=[`super::MAX_REPOS`]), in order.
    pub repos: Vec<(u8, RepoConfig)>,
    /// The passphrases of the repositories with `repoN-cipher-type=aes-256-gcm`, by number.
    pub ciphers: Vec<(u8, CipherPass)>,
    /// `--repo N`: the repository a command uses (default: the first configured).
    pub repo: Option<u8>,
    /// The config file that was read, for messages.
    pub config_file: Option<PathBuf>,
}

impl RepoSet {
    /// The stanza. Errors: none given.
    pub fn stanza(&self) -> Result<&str> {
        need_stanza(self.stanza.as_deref(), self.config_file.as_deref())
    }

    /// The repository a command uses: `--repo N`, else the first configured one.
    ///
    /// Errors: no repository configured, or `--repo N` names one that is not.
    pub fn repo(&self) -> Result<(u8, &RepoConfig)> {
        need_repo(&self.repos, self.repo, self.config_file.as_deref())
    }
}

/// How the cluster being copied is reached: the primary's connection and the transport
/// choice (primary/), and the local cluster's port and directory.
#[derive(Debug, Clone)]
pub struct PrimaryConn {
    pub pg_path: Option<PathBuf>,
    pub pg_port: u16,
    pub pg_socket_path: PathBuf,
    pub pg_user: String,
    /// The primary's connection string (--source / --pg-host).
    pub source: Option<String>,
    pub transport: Transport,
    pub network_compress: NetworkCompress,
    pub network_level: Option<i32>,
    pub network_workers: Option<u32>,
    /// --max-rate, bytes per second.
    pub max_rate: Option<u64>,
    /// Worker threads, at least 1.
    pub jobs: usize,
    /// Whether `jobs` was given rather than defaulted to the number of cores.
    pub jobs_given: bool,
    /// The config file that was read, for messages.
    pub config_file: Option<PathBuf>,
}

impl PrimaryConn {
    /// The data directory (`--pg-path`). Errors: not given.
    pub fn pg_path(&self) -> Result<&Path> {
        need_pg_path(self.pg_path.as_deref(), self.config_file.as_deref())
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
    /// The repositories with their ciphers (repo/).
    pub fn repo_set(&self) -> RepoSet {
        RepoSet {
            stanza: self.stanza.clone(),
            repos: self.repos.clone(),
            ciphers: self.ciphers.clone(),
            repo: self.repo,
            config_file: self.config_file.clone(),
        }
    }

    /// The primary's connection and transport (primary/).
    pub fn primary_conn(&self) -> PrimaryConn {
        PrimaryConn {
            pg_path: self.pg_path.clone(),
            pg_port: self.pg_port,
            pg_socket_path: self.pg_socket_path.clone(),
            pg_user: self.pg_user.clone(),
            source: self.source.clone(),
            transport: self.transport,
            network_compress: self.network_compress,
            network_level: self.network_level,
            network_workers: self.network_workers,
            max_rate: self.max_rate,
            jobs: self.jobs,
            jobs_given: self.jobs_given,
            config_file: self.config_file.clone(),
        }
    }

    /// WAL archiving's settings (archive/).
    pub fn archive_config(&self) -> ArchiveConfig {
        ArchiveConfig {
            repo_set: self.repo_set(),
            archive: self.archive.clone(),
            compression: self.compression,
            jobs: self.jobs,
            pg_path: self.pg_path.clone(),
            command_line_flags: self.command_line_flags(),
            carried_flags: self.carried_flags(),
        }
    }
}
