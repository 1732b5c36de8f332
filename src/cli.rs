//! Command-line definitions (clap). One struct per command; the settings shared by every
//! command live in [`GlobalArgs`] and are layered with the environment and the config file by
//! [`crate::config::Settings::resolve`].
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// pgjet: parallel physical backup, restore and replica creation for PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "pgjet", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Settings every command accepts. Each may also come from `PGJET_<NAME>` or the config file;
/// a flag wins over the environment, which wins over the file.
#[derive(Debug, Clone, Default, Args)]
pub struct GlobalArgs {
    /// Config file (INI: [global] and [<stanza>] sections, keys are the flag names).
    /// Default /etc/pgjet/pgjet.conf, read only if it exists.
    #[arg(long, global = true, env = "PGJET_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Stanza: the name of the cluster's configuration in the repository.
    #[arg(long, global = true, env = "PGJET_STANZA", value_name = "NAME")]
    pub stanza: Option<String>,
    /// Repository directory (posix), or the repository's prefix inside the bucket
    /// (object stores). Repository 1; `repoN-path` in the file or PGJET_REPON_PATH for others.
    #[arg(long, global = true, env = "PGJET_REPO_PATH", value_name = "DIR")]
    pub repo_path: Option<PathBuf>,
    /// Repository to use when several are configured (1-4; default: the first configured).
    #[arg(long, global = true, env = "PGJET_REPO", value_name = "N")]
    pub repo: Option<u8>,
    /// Repository 1's type: posix (default), s3, gcs, azure or sftp.
    #[arg(long, global = true, env = "PGJET_REPO_TYPE", value_name = "TYPE")]
    pub repo_type: Option<String>,
    /// S3 bucket of repository 1.
    #[arg(long, global = true, env = "PGJET_REPO_S3_BUCKET", value_name = "NAME")]
    pub repo_s3_bucket: Option<String>,
    /// S3 endpoint of repository 1: a host name (HTTPS), or a URL with its scheme.
    #[arg(
        long,
        global = true,
        env = "PGJET_REPO_S3_ENDPOINT",
        value_name = "HOST"
    )]
    pub repo_s3_endpoint: Option<String>,
    /// S3 region of repository 1.
    #[arg(
        long,
        global = true,
        env = "PGJET_REPO_S3_REGION",
        value_name = "REGION"
    )]
    pub repo_s3_region: Option<String>,
    /// host (bucket in the host name, default) or path (bucket in the URL path).
    #[arg(
        long,
        global = true,
        env = "PGJET_REPO_S3_URI_STYLE",
        value_name = "STYLE"
    )]
    pub repo_s3_uri_style: Option<String>,
    /// y (default) or n: verify the object store's TLS certificate.
    #[arg(
        long,
        global = true,
        env = "PGJET_REPO_STORAGE_VERIFY_TLS",
        value_name = "Y|N"
    )]
    pub repo_storage_verify_tls: Option<String>,
    /// CA certificates (PEM) that the object store's certificate must chain to.
    #[arg(
        long,
        global = true,
        env = "PGJET_REPO_STORAGE_CA_FILE",
        value_name = "FILE"
    )]
    pub repo_storage_ca_file: Option<PathBuf>,
    /// Data directory of the cluster (backup, check) or of the new cluster (restore, replica-create).
    #[arg(long, global = true, env = "PGJET_PG_PATH", value_name = "DIR")]
    pub pg_path: Option<PathBuf>,
    /// PostgreSQL port (default 5432); for replica-create the port of the new standby.
    #[arg(long, global = true, env = "PGJET_PG_PORT", value_name = "N")]
    pub pg_port: Option<u16>,
    /// Directory of the PostgreSQL Unix socket (default /var/run/postgresql).
    #[arg(long, global = true, env = "PGJET_PG_SOCKET_PATH", value_name = "DIR")]
    pub pg_socket_path: Option<PathBuf>,
    /// Database role to connect as (default: postgres).
    #[arg(long, global = true, env = "PGJET_PG_USER", value_name = "NAME")]
    pub pg_user: Option<String>,
    /// The primary as a libpq connection string, URI or bare host name, e.g.
    /// "host=db1 user=replicator sslmode=verify-full": the cluster to back up, check or clone
    /// when it runs on another host (instead of --pg-socket-path/--pg-port/--pg-user).
    #[arg(
        long,
        visible_alias = "pg-host",
        global = true,
        env = "PGJET_SOURCE",
        value_name = "CONNINFO"
    )]
    pub source: Option<String>,
    /// How the primary's files are read: auto (default: local when the server provably runs
    /// on this host, else libpq), local, or libpq.
    #[arg(long, global = true, env = "PGJET_TRANSPORT", value_name = "HOW")]
    pub transport: Option<String>,
    /// Parallel workers (default: the number of cores).
    #[arg(
        long,
        visible_alias = "process-max",
        global = true,
        env = "PGJET_JOBS",
        value_name = "N"
    )]
    pub jobs: Option<usize>,
    /// Compression of stored bytes (default zstd).
    #[arg(long, global = true, env = "PGJET_COMPRESS_TYPE", value_name = "TYPE")]
    pub compress_type: Option<String>,
    /// Compression level (default: 1 for zstd, 6 for gzip; lz4 has none).
    #[arg(long, global = true, env = "PGJET_COMPRESS_LEVEL", value_name = "N")]
    pub compress_level: Option<i32>,
    /// Seconds archive-push waits for its segment to be archived (async: acknowledged by
    /// the background pusher), and backup and check wait for a segment to reach the archive
    /// (default 60).
    #[arg(
        long,
        global = true,
        env = "PGJET_ARCHIVE_TIMEOUT",
        value_name = "SECONDS"
    )]
    pub archive_timeout: Option<f64>,
    /// y or n (default): archive-push and archive-get work asynchronously through the spool
    /// directory, with a background process moving several WAL files at once.
    #[arg(long, global = true, env = "PGJET_ARCHIVE_ASYNC", value_name = "Y|N")]
    pub archive_async: Option<String>,
    /// Spool directory of asynchronous archiving (default /var/spool/pgjet); local, owned
    /// by the cluster's OS user.
    #[arg(long, global = true, env = "PGJET_SPOOL_PATH", value_name = "DIR")]
    pub spool_path: Option<PathBuf>,
    /// Most WAL (bytes; suffixes KB MB GB TB, powers of 1024) waiting to be archived before
    /// archive-push drops it with a WARNING and records the gap (default: no limit).
    #[arg(
        long,
        global = true,
        env = "PGJET_ARCHIVE_PUSH_QUEUE_MAX",
        value_name = "SIZE"
    )]
    pub archive_push_queue_max: Option<String>,
    /// Most WAL (bytes, suffixes as above) archive-get fetches ahead into the spool
    /// directory when asynchronous (default 128MB).
    #[arg(
        long,
        global = true,
        env = "PGJET_ARCHIVE_GET_QUEUE_MAX",
        value_name = "SIZE"
    )]
    pub archive_get_queue_max: Option<String>,
    /// y (default) or n: a backup of a cluster that archives WAL waits until its last
    /// segment is in the archive and records its WAL range there.
    #[arg(long, global = true, env = "PGJET_ARCHIVE_CHECK", value_name = "Y|N")]
    pub archive_check: Option<String>,
    /// Full backups to keep (retention-full-type=count), or days to keep them (time).
    /// `expire` and every `backup` remove older ones; unset: backups are never expired.
    #[arg(long, global = true, env = "PGJET_RETENTION_FULL", value_name = "N")]
    pub retention_full: Option<u32>,
    /// count (default) or time (retention-full is then in days).
    #[arg(
        long,
        global = true,
        env = "PGJET_RETENTION_FULL_TYPE",
        value_name = "TYPE"
    )]
    pub retention_full_type: Option<String>,
    /// How many of the newest backups keep a continuous WAL archive for point-in-time
    /// recovery (default: all that are kept); older backups keep only the WAL they need
    /// to be consistent.
    #[arg(long, global = true, env = "PGJET_RETENTION_ARCHIVE", value_name = "N")]
    pub retention_archive: Option<u32>,
    /// error, warn, info (default) or debug.
    #[arg(long, global = true, env = "PGJET_LOG_LEVEL", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Output of commands that print data: text (default) or json.
    #[arg(long, global = true, env = "PGJET_OUTPUT", value_name = "FORMAT")]
    pub output: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the stanza in the repository for the cluster at --pg-path.
    StanzaCreate,
    /// Back up the running cluster into the repository.
    Backup(BackupArgs),
    /// Restore a backup into an empty directory.
    Restore(RestoreArgs),
    /// Re-read every stored byte of a backup (or of all) and check it against the manifest.
    Verify(VerifyArgs),
    /// List stanzas and backups.
    Info,
    /// Check that configuration, cluster and repository agree.
    Check,
    /// Clone a running primary straight into a new standby data directory.
    ReplicaCreate(ReplicaArgs),
    /// Remove backups past the retention policy and the archived WAL no kept backup needs.
    Expire(ExpireArgs),
    /// Archive one WAL file (archive_command = 'pgjet --stanza=NAME archive-push %p').
    ArchivePush(ArchivePushArgs),
    /// Fetch one archived WAL file (restore_command = 'pgjet --stanza=NAME archive-get %f "%p"');
    /// exit status 1 when the archive does not have it.
    ArchiveGet(ArchiveGetArgs),
}

/// `expire` flags.
#[derive(Debug, Args)]
pub struct ExpireArgs {
    /// Print what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `archive-push` arguments.
#[derive(Debug, Args)]
pub struct ArchivePushArgs {
    /// The WAL file (`%p`): relative to the data directory, where PostgreSQL runs
    /// archive_command, or absolute.
    #[arg(value_name = "WAL_PATH")]
    pub wal_path: PathBuf,
}

/// `archive-get` arguments.
#[derive(Debug, Args)]
pub struct ArchiveGetArgs {
    /// The WAL file PostgreSQL asks for (`%f`).
    #[arg(value_name = "WAL_FILE")]
    pub wal_file: String,
    /// Where to write it (`%p`): relative to the data directory, or absolute.
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
}

/// Backup types. Only `full` exists so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum BackupType {
    #[default]
    Full,
}

/// How the files of a primary are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Transport {
    /// The local filesystem when the server provably runs on this host, else libpq.
    #[default]
    Auto,
    /// The local filesystem (the server must run on this host).
    Local,
    /// Ordinary connections to the server, reading with pg_read_binary_file: nothing to
    /// install on the primary.
    Libpq,
}

/// `backup` flags.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Backup type.
    #[arg(long = "type", value_enum, default_value_t = BackupType::Full)]
    pub backup_type: BackupType,
    /// Ask for an immediate checkpoint instead of waiting for a spread one.
    #[arg(long)]
    pub start_fast: bool,
    /// Do not run `expire` after the backup.
    #[arg(long)]
    pub no_expire: bool,
}

/// What a restored cluster does when it starts (pgBackRest's `--type` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RestoreType {
    /// Recover from the archive to its end, then promote (default).
    Default,
    /// Recover to the first consistent point.
    Immediate,
    /// Recover to a time (--target '2026-11-22 14:15:02+00').
    Time,
    /// Recover to an LSN (--target 0/3000060).
    Lsn,
    /// Recover to a transaction ID (--target 1234).
    Xid,
    /// Recover to a restore point (--target NAME, made with pg_create_restore_point()).
    Name,
    /// Start as a standby (standby.signal), reading the archive.
    Standby,
    /// Keep the recovery settings the backup had; write none.
    Preserve,
    /// No recovery settings: crash recovery from backup_label with the WAL the backup holds.
    None,
}

/// What the restored cluster does once it reaches the recovery target
/// (recovery_target_action).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum TargetAction {
    /// Pause recovery, so the state can be inspected before promoting (PostgreSQL's default).
    #[default]
    Pause,
    /// End recovery and open for writes on a new timeline.
    Promote,
    /// Shut the server down.
    Shutdown,
}

/// `restore` flags.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// Backup label to restore, or `latest` (with --type time or lsn: the newest backup that
    /// ends before the target).
    #[arg(long, default_value = "latest")]
    pub set: String,
    /// Recovery type.
    #[arg(long = "type", value_enum, default_value_t = RestoreType::Default)]
    pub restore_type: RestoreType,
    /// Recovery target: a time with its zone, an LSN, a transaction ID or a restore point
    /// name, for --type time, lsn, xid and name.
    #[arg(long, value_name = "VALUE")]
    pub target: Option<String>,
    /// Stop just before the target instead of just after it (recovery_target_inclusive = false).
    #[arg(long)]
    pub target_exclusive: bool,
    /// What to do at the target.
    #[arg(long, value_enum, default_value_t = TargetAction::Pause)]
    pub target_action: TargetAction,
    /// Timeline to recover along: current, latest (PostgreSQL's default) or a number.
    #[arg(long, value_name = "TIMELINE")]
    pub target_timeline: Option<String>,
    /// A recovery setting KEY=VALUE for postgresql.auto.conf (repeatable); replaces the one
    /// pgjet would write, e.g. restore_command=... .
    #[arg(long, value_name = "KEY=VALUE")]
    pub recovery_option: Vec<String>,
    /// Restore tablespace ID (OID or name) into DIR instead of its original location.
    #[arg(long, value_name = "ID=DIR")]
    pub tablespace_map: Vec<String>,
    /// `off` sets archive_mode = off in the restored cluster, so a copy of production does
    /// not archive into production's WAL archive; `preserve` (default) keeps the setting.
    #[arg(long, value_enum, default_value_t = ArchiveMode::Preserve)]
    pub archive_mode: ArchiveMode,
    /// Restore into an existing copy of the same cluster, writing only the pieces whose
    /// bytes differ from the backup's and removing files the backup does not have. Refused
    /// while a server runs in the directory.
    #[arg(long)]
    pub delta: bool,
}

/// What restore does with the restored cluster's archive_mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArchiveMode {
    /// Keep the backed-up setting.
    Preserve,
    /// Write archive_mode = off.
    Off,
}

/// `verify` flags.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Backup label to verify (default: all).
    #[arg(long)]
    pub set: Option<String>,
}

/// `replica-create` flags.
#[derive(Debug, Args)]
pub struct ReplicaArgs {
    /// Place tablespace ID (OID or name) in DIR.
    #[arg(long, value_name = "ID=DIR")]
    pub tablespace_map: Vec<String>,
    /// Create this permanent physical replication slot on the primary and use it.
    #[arg(long)]
    pub slot: Option<String>,
    /// Ask for an immediate checkpoint.
    #[arg(long)]
    pub start_fast: bool,
    /// Start the new standby (on --pg-port) and wait until it streams.
    #[arg(long)]
    pub start: bool,
    /// Re-sync an existing copy of the same cluster (a stale or interrupted standby, or a
    /// former primary that diverged): only ranges whose hashes differ are copied, files the
    /// primary lacks are removed. Refused while a server runs in the directory.
    #[arg(long)]
    pub delta: bool,
    /// Directory of the PostgreSQL binaries used by --start (default: those of the primary).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn environment_fills_in_and_flags_win() {
        // Only this test sets PGJET_* variables in the test process.
        std::env::set_var("PGJET_REPO_PATH", "/from/env");
        std::env::set_var("PGJET_PG_PORT", "6001");
        let cli = Cli::try_parse_from(["pgjet", "--stanza", "main", "--pg-port", "7001", "info"])
            .unwrap();
        let s = Settings::resolve(&cli.global).unwrap();
        std::env::remove_var("PGJET_REPO_PATH");
        std::env::remove_var("PGJET_PG_PORT");
        assert_eq!(
            s.repo().unwrap().1,
            &crate::config::RepoConfig::Posix {
                path: "/from/env".into()
            }
        );
        assert_eq!(s.pg_port, 7001);
        assert!(
            Cli::try_parse_from(["pgjet", "--process-max", "3", "info"])
                .unwrap()
                .global
                .jobs
                == Some(3)
        );
        assert!(Cli::try_parse_from(["pgjet", "restore", "--type", "bogus"]).is_err());
    }
}
