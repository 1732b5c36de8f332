//! The options of one command, plain: what the library's commands take (never clap types).
//! The values come from the command line through the table ([`super::table`]). Each enum
//! declares the words it is written with (`WORDS`, the table's `Kind::Choice`), once, and parses
//! from them ([`std::str::FromStr`]).
use std::path::PathBuf;

/// Backup types, with pgBackRest's names and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackupType {
    /// Every file stored whole.
    #[default]
    Full,
    /// Only what changed since the newest full backup.
    Diff,
    /// Only what changed since the newest backup of any type.
    Incr,
}
words!(BackupType, "backup type", {
    "full" => Full: "A full backup: every file stored (default)",
    "diff" => Diff: "Differential: only the blocks and files changed since the newest full backup",
    "incr" => Incr: "Incremental: only the blocks and files changed since the newest backup of any type",
});

/// How the files of a primary are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// The local filesystem when the server provably runs on this host, else libpq.
    #[default]
    Auto,
    /// The local filesystem (the server must run on this host).
    Local,
    /// Ordinary connections to the server, reading with pg_read_binary_file: nothing to
    /// install on the primary.
    Libpq,
    /// One replication connection and the `BASE_BACKUP` stream, compressed by the server
    /// (`--network-compress`): nothing to install on the primary; the role needs REPLICATION.
    Basebackup,
}
words!(Transport, "transport", {
    "auto" => Auto: "",
    "local" => Local: "",
    "libpq" => Libpq: "",
    "basebackup" => Basebackup: "",
});

/// How the server compresses the `BASE_BACKUP` stream (`--network-compress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkCompress {
    /// The best the server has: zstd, else lz4, else gzip (read from the values
    /// `wal_compression` accepts, or tried).
    #[default]
    Auto,
    None,
    Gzip,
    Lz4,
    Zstd,
}
words!(NetworkCompress, "network compression", {
    "auto" => Auto: "",
    "none" => None: "",
    "gzip" => Gzip: "",
    "lz4" => Lz4: "",
    "zstd" => Zstd: "",
});

/// What a restored cluster does when it starts (pgBackRest's `--type` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
words!(RestoreType, "restore type", {
    "default" => Default: "Recover from the archive to its end, then promote (default)",
    "immediate" => Immediate: "Recover to the first consistent point",
    "time" => Time: "Recover to a time (--target '2026-11-22 14:15:02+00')",
    "lsn" => Lsn: "Recover to an LSN (--target 0/3000060)",
    "xid" => Xid: "Recover to a transaction ID (--target 1234)",
    "name" => Name: "Recover to a restore point (--target NAME, made with pg_create_restore_point())",
    "standby" => Standby: "Start as a standby (standby.signal), reading the archive",
    "preserve" => Preserve: "Keep the recovery settings the backup had; write none",
    "none" => None: "No recovery settings: crash recovery from backup_label with the WAL the backup holds",
});

/// What the restored cluster does once it reaches the recovery target
/// (recovery_target_action).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetAction {
    /// Pause recovery, so the state can be inspected before promoting (PostgreSQL's default).
    #[default]
    Pause,
    /// End recovery and open for writes on a new timeline.
    Promote,
    /// Shut the server down.
    Shutdown,
}
words!(TargetAction, "target action", {
    "pause" => Pause: "Pause recovery, so the state can be inspected before promoting (PostgreSQL's default)",
    "promote" => Promote: "End recovery and open for writes on a new timeline",
    "shutdown" => Shutdown: "Shut the server down",
});

/// What restore does with the restored cluster's archive_mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArchiveMode {
    /// Keep the backed-up setting.
    #[default]
    Preserve,
    /// Write archive_mode = off.
    Off,
}
words!(ArchiveMode, "archive mode", {
    "preserve" => Preserve: "Keep the backed-up setting",
    "off" => Off: "Write archive_mode = off",
});

/// `backup`'s options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackupOptions {
    /// `--type`.
    pub backup_type: BackupType,
    /// `--start-fast`: an immediate checkpoint instead of a spread one.
    pub start_fast: bool,
    /// `--no-expire`: no `expire` after the backup.
    pub no_expire: bool,
    /// `--no-resume`: an interrupted backup is removed, not resumed.
    pub no_resume: bool,
}

/// `restore`'s options.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreOptions {
    /// `--set`: a backup label, or `latest`.
    pub set: String,
    /// `--type`.
    pub restore_type: RestoreType,
    /// `--target`: a time with its zone, an LSN, a transaction ID or a restore point name.
    pub target: Option<String>,
    /// `--target-exclusive` (recovery_target_inclusive = false).
    pub target_exclusive: bool,
    /// `--target-action`.
    pub target_action: TargetAction,
    /// `--target-timeline`: current, latest or a number, as given.
    pub target_timeline: Option<String>,
    /// `--recovery-option KEY=VALUE`, in the order given.
    pub recovery_option: Vec<String>,
    /// `--tablespace-map ID=DIR`, in the order given.
    pub tablespace_map: Vec<String>,
    /// `--archive-mode`.
    pub archive_mode: ArchiveMode,
    /// `--delta`: restore into an existing copy of the same cluster.
    pub delta: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            set: "latest".into(),
            restore_type: RestoreType::Default,
            target: None,
            target_exclusive: false,
            target_action: TargetAction::Pause,
            target_timeline: None,
            recovery_option: Vec::new(),
            tablespace_map: Vec::new(),
            archive_mode: ArchiveMode::Preserve,
            delta: false,
        }
    }
}

/// `verify`'s options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifyOptions {
    /// `--set`: the backup label to verify; None: every backup.
    pub set: Option<String>,
}

/// `replica-create`'s options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaOptions {
    /// `--tablespace-map ID=DIR`, in the order given.
    pub tablespace_map: Vec<String>,
    /// `--slot`: a permanent physical replication slot to create and use.
    pub slot: Option<String>,
    /// `--start-fast`: an immediate checkpoint.
    pub start_fast: bool,
    /// `--start`: start the new standby and wait until it streams.
    pub start: bool,
    /// `--delta`: re-sync an existing copy of the same cluster.
    pub delta: bool,
    /// `--pg-bin`: the PostgreSQL binaries `--start` uses.
    pub pg_bin: Option<PathBuf>,
    /// Set when Patroni called replica-create as its replica creation method
    /// ([`super::patroni::translate`]).
    pub patroni: Option<super::patroni::PatroniCall>,
    /// `--seed`: where the new standby's files come from.
    pub seed: Seed,
}

/// Where replica-create takes the new standby's files from (`--seed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Seed {
    /// The repository when it is estimated faster, or when there is no source (default).
    #[default]
    Auto,
    /// The source, always.
    Source,
    /// The newest backup in the repository and the archived WAL since, always.
    Repo,
}
words!(Seed, "seed", {
    "auto" => Auto: "The repository's newest backup when it and the WAL archived since are estimated faster than a copy from the source, or when no source is given; else the source (default)",
    "source" => Source: "Copy from the source (--source)",
    "repo" => Repo: "Restore the repository's newest backup; the standby replays the archived WAL, then streams from the source",
});

/// Which report `info` prints (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InfoFormat {
    /// pgjet's own.
    #[default]
    Pgjet,
    /// pgBackRest 2.45's, for its monitoring tools.
    Pgbackrest,
}
words!(InfoFormat, "info format", {
    "pgjet" => Pgjet: "pgjet's own report (default)",
    "pgbackrest" => Pgbackrest: "pgBackRest 2.45's info, for its monitoring tools (with --output json: the same keys and types)",
});

/// `info`'s options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InfoOptions {
    /// `--format`.
    pub format: InfoFormat,
}

/// `expire`'s options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpireOptions {
    /// `--dry-run`: say what would be removed, remove nothing.
    pub dry_run: bool,
}

/// A command with its options and arguments, as parsed and resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    StanzaCreate,
    Backup(BackupOptions),
    Restore(RestoreOptions),
    Verify(VerifyOptions),
    Info(InfoOptions),
    Check,
    ReplicaCreate(ReplicaOptions),
    Expire(ExpireOptions),
    /// `cipher-pass-change`.
    CipherPassChange,
    /// `archive-push WAL_PATH`.
    ArchivePush {
        wal_path: PathBuf,
    },
    /// `archive-get WAL_FILE DEST`.
    ArchiveGet {
        wal_file: String,
        dest: PathBuf,
    },
    /// `archive-stream`: the WAL receiver, until stopped.
    ArchiveStream,
    /// The background pusher (hidden): `archive-push-async WAL_DIR`, started by an
    /// asynchronous `archive-push` for the `pg_wal` directory `wal_dir`.
    ArchivePushAsync {
        wal_dir: PathBuf,
    },
    /// The background prefetcher (hidden): `archive-get-async FIRST_REQUEST`, started by an
    /// asynchronous `archive-get`; `first_request` is that foreground's request
    /// (`<segment> <pid>`), which it fetches itself.
    ArchiveGetAsync {
        first_request: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_name_the_choices() {
        for t in [RestoreType::Default, RestoreType::Lsn, RestoreType::None] {
            assert_eq!(t.as_str().parse::<RestoreType>().unwrap(), t);
        }
        let e = "bogus".parse::<TargetAction>().unwrap_err();
        assert_eq!(
            e,
            "'bogus' is not a target action (pause, promote, shutdown)"
        );
        assert_eq!("libpq".parse::<Transport>().unwrap(), Transport::Libpq);
    }
}
