//! The option table: every option pgjet reads, once. The command line (clap, built from it in
//! [`super::cli`]), the environment and config-file lookup ([`super::resolve`]) and the
//! flags a restored cluster's restore_command carries ([`OptionDef::carried`]) all come from
//! [`OPTIONS`].
//!
//! Each option declares what it takes ([`Kind`]: a boolean, a size, seconds, a range of whole
//! numbers, one of some words, ...); [`Kind::check`] checks a value against it, wherever it
//! was given. The words of a choice are declared by the type its value becomes
//! (`Kind::Choice(Transport::WORDS)`).
//!
//! Names are the long flags without `--` and the config file's keys. The environment
//! variable of an option is `PGJET_<NAME>` (upper case, `-` as `_`). A repository option
//! ([`OptionDef::repo`]) exists once per repository: `repoN-<name>` in the file and
//! `PGJET_REPON_<NAME>` in the environment, N from 1 to [`MAX_REPOS`]; the unnumbered
//! `repo-<name>` (flag, key, `PGJET_REPO_<NAME>`) is repository 1.
use super::command::{
    ArchiveMode, BackupType, InfoFormat, NetworkCompress, RestoreType, Seed, TargetAction,
    Transport,
};
pub use super::kind::{Kind, Words};
use super::repo::{AzureKeyType, GcsKeyType, MAX_REPOS};
use super::{CipherType, Output, RetentionFullType, MAX_JOBS};
use crate::codec::CompressType;
use crate::storage::config::{HostKeyCheck, RepoType, UriStyle};

/// The commands, as the command line spells them ([`CommandDef::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmd {
    StanzaCreate,
    Backup,
    Restore,
    Verify,
    Info,
    Check,
    ReplicaCreate,
    Expire,
    ArchivePush,
    ArchiveGet,
    /// The WAL receiver: the cluster's WAL streamed into the archive.
    ArchiveStream,
    CipherPassChange,
    /// The background pusher (hidden); takes archive-push's options.
    ArchivePushAsync,
    /// The background prefetcher (hidden); takes archive-get's options.
    ArchiveGetAsync,
}

/// A set of commands (a bit per [`Cmd`]), usable in constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cmds(u16);

impl Cmds {
    /// Every command.
    pub const ALL: Cmds = Cmds(u16::MAX);

    /// The set of `list`.
    pub const fn of(list: &[Cmd]) -> Cmds {
        let mut m = 0u16;
        let mut i = 0;
        while i < list.len() {
            m |= 1 << list[i] as u16;
            i += 1;
        }
        Cmds(m)
    }

    /// True when `c` is in the set.
    pub fn contains(self, c: Cmd) -> bool {
        self.0 & (1 << c as u16) != 0
    }
}

/// One command of the command line.
#[derive(Debug)]
pub struct CommandDef {
    pub cmd: Cmd,
    /// The subcommand word.
    pub name: &'static str,
    /// One line for `pgjet --help`.
    pub about: &'static str,
    /// Not shown in help (the background processes pgjet starts itself).
    pub hidden: bool,
    /// Required positional arguments: (value name, help).
    pub args: &'static [(&'static str, &'static str)],
    /// The command whose options and `[<section>:<command>]` config sections this one
    /// takes (itself, or the foreground of a background process).
    pub options_of: Cmd,
}

/// The commands, in the order `pgjet --help` lists them.
pub const COMMANDS: &[CommandDef] = &[
    CommandDef {
        cmd: Cmd::StanzaCreate,
        name: "stanza-create",
        about: "Create the stanza in the repository for the cluster at --pg-path",
        hidden: false,
        args: &[],
        options_of: Cmd::StanzaCreate,
    },
    CommandDef {
        cmd: Cmd::Backup,
        name: "backup",
        about: "Back up the running cluster into the repository",
        hidden: false,
        args: &[],
        options_of: Cmd::Backup,
    },
    CommandDef {
        cmd: Cmd::Restore,
        name: "restore",
        about: "Restore a backup into an empty directory",
        hidden: false,
        args: &[],
        options_of: Cmd::Restore,
    },
    CommandDef {
        cmd: Cmd::Verify,
        name: "verify",
        about: "Re-read every stored byte of a backup (or of all) and check it against the manifest",
        hidden: false,
        args: &[],
        options_of: Cmd::Verify,
    },
    CommandDef {
        cmd: Cmd::Info,
        name: "info",
        about: "List stanzas and backups",
        hidden: false,
        args: &[],
        options_of: Cmd::Info,
    },
    CommandDef {
        cmd: Cmd::Check,
        name: "check",
        about: "Check that configuration, cluster and repository agree",
        hidden: false,
        args: &[],
        options_of: Cmd::Check,
    },
    CommandDef {
        cmd: Cmd::ReplicaCreate,
        name: "replica-create",
        about: "Clone a running primary straight into a new standby data directory",
        hidden: false,
        args: &[],
        options_of: Cmd::ReplicaCreate,
    },
    CommandDef {
        cmd: Cmd::CipherPassChange,
        name: "cipher-pass-change",
        about: "Change an encrypted repository's passphrase (repoN-cipher-pass to repoN-cipher-pass-new); only the wrapped keys are rewritten",
        hidden: false,
        args: &[],
        options_of: Cmd::CipherPassChange,
    },
    CommandDef {
        cmd: Cmd::Expire,
        name: "expire",
        about: "Remove backups past the retention policy and the archived WAL no kept backup needs",
        hidden: false,
        args: &[],
        options_of: Cmd::Expire,
    },
    CommandDef {
        cmd: Cmd::ArchivePush,
        name: "archive-push",
        about: "Archive one WAL file (archive_command = 'pgjet --stanza=NAME archive-push %p')",
        hidden: false,
        args: &[(
            "WAL_PATH",
            "The WAL file (`%p`): relative to the data directory, where PostgreSQL runs archive_command, or absolute",
        )],
        options_of: Cmd::ArchivePush,
    },
    CommandDef {
        cmd: Cmd::ArchiveGet,
        name: "archive-get",
        about: "Fetch one archived WAL file (restore_command = 'pgjet --stanza=NAME archive-get %f \"%p\"'); exit status 1 when the archive does not have it",
        hidden: false,
        args: &[
            ("WAL_FILE", "The WAL file PostgreSQL asks for (`%f`)"),
            (
                "DEST",
                "Where to write it (`%p`): relative to the data directory, or absolute",
            ),
        ],
        options_of: Cmd::ArchiveGet,
    },
    CommandDef {
        cmd: Cmd::ArchiveStream,
        name: "archive-stream",
        about: "Stream the cluster's WAL (--source) over the replication protocol into the stanza's archive, to the last flushed byte, until stopped with SIGTERM: WAL archiving from a backup host, nothing installed on the database host",
        hidden: false,
        args: &[],
        options_of: Cmd::ArchiveStream,
    },
    CommandDef {
        cmd: Cmd::ArchivePushAsync,
        name: "archive-push-async",
        about: "The background pusher of asynchronous archive-push (started by archive-push)",
        hidden: true,
        args: &[("WAL_DIR", "The pg_wal directory whose ready WAL files it pushes")],
        options_of: Cmd::ArchivePush,
    },
    CommandDef {
        cmd: Cmd::ArchiveGetAsync,
        name: "archive-get-async",
        about: "The background prefetcher of asynchronous archive-get (started by archive-get)",
        hidden: true,
        args: &[(
            "FIRST_REQUEST",
            "The request of the archive-get that started it (`<segment> <pid>`)",
        )],
        options_of: Cmd::ArchiveGet,
    },
];

/// Where an option may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Places {
    /// As a flag on the command line.
    pub cli: bool,
    /// As an environment variable ([`OptionDef::env_var`]).
    pub env: bool,
    /// In the config file.
    pub file: bool,
}

/// Command line, environment and config file.
pub const EVERYWHERE: Places = Places {
    cli: true,
    env: true,
    file: true,
};
/// Environment and config file only: secrets, which would show in the process list and in
/// the restore_command a restore writes.
pub const ENV_FILE: Places = Places {
    cli: false,
    env: true,
    file: true,
};
/// Command line and environment (the config file's own location).
pub const CLI_ENV: Places = Places {
    cli: true,
    env: true,
    file: false,
};
/// The command line only: what one run of one command does.
pub const CLI_ONLY: Places = Places {
    cli: true,
    env: false,
    file: false,
};
/// The command line, else the config file: a command's own option that pgBackRest users
/// keep in their file (`start-fast=y`, `delta=y`, `archive-mode=off`, `recovery-option`,
/// `tablespace-map`; pgBackRest's config.yaml gives them `section: global`).
pub const CLI_FILE: Places = Places {
    cli: true,
    env: false,
    file: true,
};
/// The environment only: tuning variables for measurements, read where they are used.
pub const ENV_ONLY: Places = Places {
    cli: false,
    env: true,
    file: false,
};

/// One option.
#[derive(Debug, PartialEq, Eq)]
pub struct OptionDef {
    /// The long flag without `--`, and the config file's key.
    pub name: &'static str,
    /// Other spellings accepted on the command line and in the config file (pgBackRest's:
    /// `pg1-path`, `process-max`, ...), not shown in help.
    pub aliases: &'static [&'static str],
    /// Other spellings accepted likewise and shown in help (`--process-max`, `--pg-host`).
    pub visible_aliases: &'static [&'static str],
    pub kind: Kind,
    /// The value's name in help (`DIR`, `N`).
    pub value_name: &'static str,
    /// The default as the value would be written (None: unset, or computed, as the help says).
    pub default: Option<&'static str>,
    pub help: &'static str,
    /// Help section (`pgjet --help` groups options by it).
    pub heading: &'static str,
    /// The commands it applies to. Given on the command line of another command it is
    /// refused; found in the environment or the config file it is ignored there.
    pub commands: Cmds,
    pub places: Places,
    /// Never written into restore_command, never printed; no command-line flag.
    pub secret: bool,
    /// A repository option: one per repository (`repoN-<name>`, see the module doc).
    pub repo: bool,
}

impl OptionDef {
    /// The environment variable of repository 1 (or of the option when it is not a
    /// repository option): `PGJET_<NAME>`.
    pub fn env_var(&self) -> String {
        env_name(self.name)
    }

    /// The config-file key and environment variable of repository `n`'s copy of this
    /// repository option: (`repoN-<x>`, `PGJET_REPON_<X>`).
    pub fn indexed(&self, n: u8) -> (String, String) {
        let key = format!("repo{n}-{}", repo_suffix(self.name));
        let env = env_name(&key);
        (key, env)
    }

    /// True when a command-specific option (read from the command line only, defined per
    /// command; several commands may have one of the same name).
    pub fn command_specific(&self) -> bool {
        self.heading == H_COMMAND && self.places.cli && !self.places.env
    }

    /// True when restore_command carries this option as a flag when it was given as a flag
    /// or in the environment: repository 1's options that have a flag and are not secret
    /// (the config file is carried by `--config`).
    pub fn carried(&self) -> bool {
        self.repo && self.places.cli && !self.secret
    }

    /// The heading help lists it under: its own, a repository option of one store type
    /// under that store's (so `--help` shows each store's options together).
    pub fn help_heading(&self) -> &'static str {
        const STORES: &[(&str, &str)] = &[
            ("repo-s3-", "Repository: S3 (repo-type=s3)"),
            ("repo-gcs-", "Repository: GCS (repo-type=gcs)"),
            ("repo-azure-", "Repository: Azure Blob (repo-type=azure)"),
            ("repo-sftp-", "Repository: SFTP (repo-type=sftp)"),
            (
                "repo-storage-",
                "Repository: object stores (S3, GCS, Azure)",
            ),
        ];
        match STORES
            .iter()
            .find(|(p, _)| self.repo && self.name.starts_with(p))
        {
            Some((_, h)) => h,
            None => self.heading,
        }
    }

    /// Every spelling: the name, then the aliases.
    pub fn spellings(&self) -> impl Iterator<Item = &'static str> + '_ {
        std::iter::once(self.name)
            .chain(self.visible_aliases.iter().copied())
            .chain(self.aliases.iter().copied())
    }
}

/// `PGJET_` and `key` in upper case with `-` as `_`.
pub fn env_name(key: &str) -> String {
    format!("PGJET_{}", key.to_ascii_uppercase().replace('-', "_"))
}

/// `repo-s3-bucket` -> `s3-bucket`.
fn repo_suffix(name: &str) -> &str {
    name.strip_prefix("repo-").unwrap_or(name)
}

const ALL: Cmds = Cmds::ALL;
/// Commands that work on a repository (replica-create: to seed from it, `--seed`).
const REPO_CMDS: Cmds = Cmds::of(&[
    Cmd::StanzaCreate,
    Cmd::Backup,
    Cmd::Restore,
    Cmd::ReplicaCreate,
    Cmd::Verify,
    Cmd::Info,
    Cmd::Check,
    Cmd::Expire,
    Cmd::ArchivePush,
    Cmd::ArchiveGet,
    Cmd::ArchiveStream,
    Cmd::CipherPassChange,
]);
/// Commands that work on a cluster or its stanza: the options that say which cluster it is
/// (pg-path, pg-port, pg-socket-path, pg-user, source, transport) are taken by every one of
/// them, read or not, so that one set of flags naming the cluster serves every command of
/// a script (as one config file does).
const CLUSTER_CMDS: Cmds = Cmds::of(&[
    Cmd::StanzaCreate,
    Cmd::Backup,
    Cmd::Restore,
    Cmd::Verify,
    Cmd::Info,
    Cmd::Check,
    Cmd::ReplicaCreate,
    Cmd::Expire,
    Cmd::ArchivePush,
    Cmd::ArchiveGet,
    Cmd::ArchiveStream,
    Cmd::CipherPassChange,
]);
/// Commands that print data or progress (not the archive commands PostgreSQL runs).
const OUTPUT_CMDS: Cmds = Cmds::of(&[
    Cmd::StanzaCreate,
    Cmd::Backup,
    Cmd::Restore,
    Cmd::Verify,
    Cmd::Info,
    Cmd::Check,
    Cmd::ReplicaCreate,
    Cmd::Expire,
    Cmd::CipherPassChange,
]);

const H_GENERAL: &str = "General";
const H_REPO: &str = "Repository";
const H_PG: &str = "PostgreSQL";
const H_ARCHIVE: &str = "WAL archiving";
const H_RETENTION: &str = "Retention";
/// Command-specific options go to clap's own "Options" section.
const H_COMMAND: &str = "";
const H_TUNING: &str = "Tuning";

/// A repository option (indexed, for every repository command).
const fn repo_opt(
    name: &'static str,
    kind: Kind,
    value_name: &'static str,
    default: Option<&'static str>,
    secret: bool,
    help: &'static str,
) -> OptionDef {
    OptionDef {
        name,
        aliases: &[],
        visible_aliases: &[],
        kind,
        value_name,
        default,
        help,
        heading: H_REPO,
        commands: REPO_CMDS,
        places: if secret { ENV_FILE } else { EVERYWHERE },
        secret,
        repo: true,
    }
}

/// An option of one or more commands, read from the command line only.
const fn cmd_opt(
    name: &'static str,
    kind: Kind,
    value_name: &'static str,
    default: Option<&'static str>,
    commands: Cmds,
    help: &'static str,
) -> OptionDef {
    OptionDef {
        name,
        aliases: &[],
        visible_aliases: &[],
        kind,
        value_name,
        default,
        help,
        heading: H_COMMAND,
        commands,
        places: CLI_ONLY,
        secret: false,
        repo: false,
    }
}

/// An option of one or more commands, read from the command line, else the config file
/// ([`CLI_FILE`]).
const fn file_cmd_opt(
    name: &'static str,
    kind: Kind,
    value_name: &'static str,
    default: Option<&'static str>,
    commands: Cmds,
    help: &'static str,
) -> OptionDef {
    OptionDef {
        places: CLI_FILE,
        ..cmd_opt(name, kind, value_name, default, commands, help)
    }
}

/// A tuning variable (environment only, read once where it is used).
const fn tuning(name: &'static str, help: &'static str) -> OptionDef {
    OptionDef {
        name,
        aliases: &[],
        visible_aliases: &[],
        kind: Kind::Text,
        value_name: "N",
        default: None,
        help,
        heading: H_TUNING,
        commands: ALL,
        places: ENV_ONLY,
        secret: false,
        repo: false,
    }
}

/// A general option with a flag, an environment variable and a config key.
#[allow(clippy::too_many_arguments)]
const fn opt(
    name: &'static str,
    kind: Kind,
    value_name: &'static str,
    default: Option<&'static str>,
    heading: &'static str,
    commands: Cmds,
    help: &'static str,
) -> OptionDef {
    OptionDef {
        name,
        aliases: &[],
        visible_aliases: &[],
        kind,
        value_name,
        default,
        help,
        heading,
        commands,
        places: EVERYWHERE,
        secret: false,
        repo: false,
    }
}

/// A TCP port.
const PORT: Kind = Kind::Range {
    min: 0,
    max: u16::MAX as i64,
};
/// A count read into a u32, 0 allowed.
const COUNT: Kind = Kind::Range {
    min: 0,
    max: u32::MAX as i64,
};
/// A count read into a u32, at least 1 (retention).
const AT_LEAST_1: Kind = Kind::Range {
    min: 1,
    max: u32::MAX as i64,
};

const BACKUP: Cmds = Cmds::of(&[Cmd::Backup]);
const RESTORE: Cmds = Cmds::of(&[Cmd::Restore]);
const REPLICA: Cmds = Cmds::of(&[Cmd::ReplicaCreate]);

/// Every option, general ones first (the order of help and of the flags pgjet writes).
pub const OPTIONS: &[OptionDef] = &[
    // General.
    OptionDef {
        places: CLI_ENV,
        ..opt(
            "config",
            Kind::Path,
            "FILE",
            Some(super::DEFAULT_CONFIG),
            H_GENERAL,
            ALL,
            "Config file (INI: [global] and [<stanza>] sections, keys are the flag names). Default /etc/pgjet/pgjet.conf, read only if it exists",
        )
    },
    opt(
        "stanza",
        Kind::Text,
        "NAME",
        None,
        H_GENERAL,
        REPO_CMDS,
        "Stanza: the name of the cluster's configuration in the repository",
    ),
    OptionDef {
        // pgBackRest's names for what it prints (pgjet logs to stderr only).
        aliases: &["log-level-console", "log-level-stderr"],
        // Text, not a choice: pgBackRest's levels (off, detail) read as pgjet's, and the
        // message for another word names both (resolve.rs, `log_level`).
        ..opt(
            "log-level",
            Kind::Text,
            "LEVEL",
            Some("info"),
            H_GENERAL,
            ALL,
            "error, warn, info (default), debug or trace (as debug: nothing finer is logged yet); pgBackRest's off and detail read as error and info",
        )
    },
    opt(
        "output",
        Kind::Choice(Output::WORDS),
        "FORMAT",
        Some("text"),
        H_GENERAL,
        OUTPUT_CMDS,
        "Output of commands that print data: text (default) or json; for info also prometheus (metrics for node_exporter's textfile collector)",
    ),
    OptionDef {
        visible_aliases: &["process-max"],
        ..opt(
            "jobs",
            Kind::Range {
                min: 1,
                max: MAX_JOBS as i64,
            },
            "N",
            None,
            H_GENERAL,
            Cmds::of(&[
                Cmd::Backup,
                Cmd::Restore,
                Cmd::Verify,
                Cmd::Check,
                Cmd::ReplicaCreate,
                Cmd::ArchivePush,
                Cmd::ArchiveGet,
                Cmd::ArchiveStream,
            ]),
            "Parallel workers (default: the number of cores)",
        )
    },
    opt(
        "compress-type",
        Kind::Choice(CompressType::WORDS),
        "TYPE",
        Some("zstd"),
        H_GENERAL,
        Cmds::of(&[Cmd::Backup, Cmd::ArchivePush, Cmd::ArchiveStream]),
        "Compression of stored bytes (default zstd)",
    ),
    opt(
        "compress-level",
        Kind::Range {
            min: i32::MIN as i64,
            max: i32::MAX as i64,
        },
        "N",
        None,
        H_GENERAL,
        Cmds::of(&[Cmd::Backup, Cmd::ArchivePush]),
        "Compression level (default: 1 for zstd, 6 for gzip; lz4 has none)",
    ),
    // Repository.
    OptionDef {
        repo: false,
        ..repo_opt(
            "repo",
            Kind::Range {
                min: 1,
                max: MAX_REPOS as i64,
            },
            "N",
            None,
            false,
            "Repository to use when several are configured (1-4; default: the first configured)",
        )
    },
    repo_opt(
        "repo-path",
        Kind::Path,
        "DIR",
        None,
        false,
        "Repository directory (posix), or the repository's prefix inside the bucket (object stores). Repository 1; `repoN-path` in the file or PGJET_REPON_PATH for others",
    ),
    repo_opt(
        "repo-type",
        Kind::Choice(RepoType::WORDS),
        "TYPE",
        Some("posix"),
        false,
        "Repository 1's type: posix (default), s3, gcs, azure or sftp",
    ),
    repo_opt(
        "repo-s3-bucket",
        Kind::Text,
        "NAME",
        None,
        false,
        "S3 bucket of repository 1",
    ),
    repo_opt(
        "repo-s3-endpoint",
        Kind::Text,
        "HOST",
        None,
        false,
        "S3 endpoint of repository 1: a host name (HTTPS), or a URL with its scheme",
    ),
    repo_opt(
        "repo-s3-region",
        Kind::Text,
        "REGION",
        None,
        false,
        "S3 region of repository 1",
    ),
    repo_opt(
        "repo-cipher-type",
        Kind::Choice(CipherType::WORDS),
        "TYPE",
        Some("none"),
        false,
        "none (default) or aes-256-gcm: every object the repository holds is encrypted (chosen when the stanza is created; docs/encryption.md)",
    ),
    repo_opt(
        "repo-cipher-pass",
        Kind::Text,
        "PASSPHRASE",
        None,
        true,
        "passphrase of an encrypted repository (environment or config file only)",
    ),
    repo_opt(
        "repo-cipher-pass-new",
        Kind::Text,
        "PASSPHRASE",
        None,
        true,
        "the new passphrase for cipher-pass-change (environment or config file only)",
    ),
    repo_opt(
        "repo-s3-uri-style",
        Kind::Choice(UriStyle::WORDS),
        "STYLE",
        Some("host"),
        false,
        "host (bucket in the host name, default) or path (bucket in the URL path)",
    ),
    repo_opt(
        "repo-s3-key",
        Kind::Text,
        "KEY",
        None,
        true,
        "S3 access key ID (environment or config file only)",
    ),
    repo_opt(
        "repo-s3-key-secret",
        Kind::Text,
        "SECRET",
        None,
        true,
        "S3 secret access key (environment or config file only)",
    ),
    repo_opt(
        "repo-s3-token",
        Kind::Text,
        "TOKEN",
        None,
        true,
        "S3 session token of temporary credentials (environment or config file only)",
    ),
    repo_opt(
        "repo-gcs-bucket",
        Kind::Text,
        "NAME",
        None,
        false,
        "GCS bucket of repository 1",
    ),
    repo_opt(
        "repo-gcs-endpoint",
        Kind::Text,
        "HOST",
        Some("storage.googleapis.com"),
        false,
        "GCS endpoint of repository 1 (default storage.googleapis.com)",
    ),
    repo_opt(
        "repo-gcs-key-type",
        Kind::Choice(GcsKeyType::WORDS),
        "TYPE",
        Some("service"),
        false,
        "service (default: a service account key file, repo-gcs-key) or none (anonymous, test servers)",
    ),
    repo_opt(
        "repo-gcs-key",
        Kind::Path,
        "FILE",
        None,
        true,
        "GCS service account key file (JSON) (environment or config file only)",
    ),
    repo_opt(
        "repo-azure-account",
        Kind::Text,
        "NAME",
        None,
        false,
        "Azure storage account of repository 1",
    ),
    repo_opt(
        "repo-azure-container",
        Kind::Text,
        "NAME",
        None,
        false,
        "Azure container of repository 1",
    ),
    repo_opt(
        "repo-azure-endpoint",
        Kind::Text,
        "HOST",
        Some("blob.core.windows.net"),
        false,
        "Azure endpoint of repository 1 (default blob.core.windows.net)",
    ),
    repo_opt(
        "repo-azure-uri-style",
        Kind::Choice(UriStyle::WORDS),
        "STYLE",
        Some("host"),
        false,
        "host (account in the host name, default) or path (account in the URL path)",
    ),
    repo_opt(
        "repo-azure-key-type",
        Kind::Choice(AzureKeyType::WORDS),
        "TYPE",
        Some("shared"),
        false,
        "shared (default: repo-azure-key is the account's shared key) or sas (a SAS token)",
    ),
    repo_opt(
        "repo-azure-key",
        Kind::Text,
        "KEY",
        None,
        true,
        "Azure shared key or SAS token (environment or config file only)",
    ),
    repo_opt(
        "repo-sftp-host",
        Kind::Text,
        "HOST",
        None,
        false,
        "SFTP server of repository 1",
    ),
    repo_opt(
        "repo-sftp-host-port",
        PORT,
        "PORT",
        Some("22"),
        false,
        "SFTP server port (default 22)",
    ),
    repo_opt(
        "repo-sftp-host-user",
        Kind::Text,
        "NAME",
        None,
        false,
        "SFTP user",
    ),
    repo_opt(
        "repo-sftp-private-key-file",
        Kind::Path,
        "FILE",
        None,
        false,
        "SSH private key file of the SFTP user",
    ),
    repo_opt(
        "repo-sftp-host-key-check-type",
        Kind::Choice(HostKeyCheck::WORDS),
        "TYPE",
        Some("strict"),
        false,
        "strict (default), accept-new or none: how the SFTP server's host key is checked",
    ),
    repo_opt(
        "repo-storage-verify-tls",
        Kind::Bool,
        "Y|N",
        Some("y"),
        false,
        "y (default) or n: verify the object store's TLS certificate",
    ),
    repo_opt(
        "repo-storage-ca-file",
        Kind::Path,
        "FILE",
        None,
        false,
        "CA certificates (PEM) that the object store's certificate must chain to",
    ),
    repo_opt(
        "repo-storage-host",
        Kind::Text,
        "HOST",
        None,
        false,
        "Host to connect to instead of the endpoint's (object stores)",
    ),
    repo_opt(
        "repo-storage-port",
        PORT,
        "PORT",
        None,
        false,
        "Port to connect to instead of the endpoint's (object stores)",
    ),
    // PostgreSQL.
    OptionDef {
        aliases: &["pg1-path"],
        ..opt(
            "pg-path",
            Kind::Path,
            "DIR",
            None,
            H_PG,
            CLUSTER_CMDS,
            "Data directory of the cluster (backup, check) or of the new cluster (restore, replica-create)",
        )
    },
    OptionDef {
        aliases: &["pg1-port"],
        ..opt(
            "pg-port",
            PORT,
            "N",
            Some("5432"),
            H_PG,
            CLUSTER_CMDS,
            "PostgreSQL port (default 5432); for replica-create the port of the new standby",
        )
    },
    OptionDef {
        aliases: &["pg1-socket-path"],
        ..opt(
            "pg-socket-path",
            Kind::Path,
            "DIR",
            Some(super::DEFAULT_SOCKET_DIR),
            H_PG,
            CLUSTER_CMDS,
            "Directory of the PostgreSQL Unix socket (default /var/run/postgresql)",
        )
    },
    OptionDef {
        aliases: &["pg1-user"],
        ..opt(
            "pg-user",
            Kind::Text,
            "NAME",
            Some("postgres"),
            H_PG,
            CLUSTER_CMDS,
            "Database role to connect as (default: postgres)",
        )
    },
    OptionDef {
        visible_aliases: &["pg-host"],
        aliases: &["pg1-host"],
        ..opt(
            "source",
            Kind::Text,
            "CONNINFO",
            None,
            H_PG,
            CLUSTER_CMDS,
            "The primary as a libpq connection string, URI or bare host name, e.g. \"host=db1 user=replicator sslmode=verify-full\": the cluster to back up, check or clone when it runs on another host (instead of --pg-socket-path/--pg-port/--pg-user)",
        )
    },
    opt(
        "transport",
        Kind::Choice(Transport::WORDS),
        "HOW",
        Some("auto"),
        H_PG,
        CLUSTER_CMDS,
        "How the primary's files are read: auto (default: local when the server provably runs on this host, else a one-second probe of the link and the data's compressibility picks libpq or basebackup), local, libpq (parallel ranges over ordinary connections), or basebackup (one replication connection, the BASE_BACKUP stream compressed by the server; the role needs REPLICATION)",
    ),
    opt(
        "network-compress",
        Kind::Choice(NetworkCompress::WORDS),
        "TYPE",
        Some("auto"),
        H_PG,
        CLUSTER_CMDS,
        "With --transport basebackup (or auto choosing it): how the server compresses the stream: auto (default: zstd, else lz4, else gzip at level 1, whichever the server was built with; with --transport auto, the method the probe found fastest), none, gzip, lz4 or zstd",
    ),
    opt(
        "compress-level-network",
        Kind::Range {
            min: i32::MIN as i64,
            max: i32::MAX as i64,
        },
        "N",
        None,
        H_PG,
        CLUSTER_CMDS,
        "With --transport basebackup: the level of --network-compress (default: the server's; zstd 1..22, gzip 1..9, lz4 1..12)",
    ),
    opt(
        "network-compress-workers",
        COUNT,
        "N",
        None,
        H_PG,
        CLUSTER_CMDS,
        "With --transport basebackup and zstd: threads the server compresses the stream with, besides the backend that reads the files (default: the primary's max_parallel_maintenance_workers, the helpers PostgreSQL lets one maintenance command take; 0: none)",
    ),
    opt(
        "max-rate",
        Kind::Size,
        "BYTES",
        None,
        H_PG,
        CLUSTER_CMDS,
        "The most bytes per second read from the primary, before compression (suffixes k, M, G), as pg_basebackup --max-rate: over the libpq ranges, all connections together; over the BASE_BACKUP stream, the server's MAX_RATE (32 KiB/s to 1 GiB/s); files read on this host are not limited",
    ),
    // WAL archiving.
    opt(
        "archive-timeout",
        Kind::Seconds { max: 86400 },
        "SECONDS",
        Some("60"),
        H_ARCHIVE,
        Cmds::of(&[Cmd::ArchivePush, Cmd::ArchiveGet, Cmd::Backup, Cmd::Check]),
        "Seconds archive-push waits for its segment to be archived (async: acknowledged by the background pusher), and backup and check wait for a segment to reach the archive (default 60)",
    ),
    opt(
        "archive-async",
        Kind::Bool,
        "Y|N",
        Some("n"),
        H_ARCHIVE,
        Cmds::of(&[Cmd::ArchivePush, Cmd::ArchiveGet, Cmd::Restore]),
        "y or n (default): archive-push and archive-get work asynchronously through the spool directory, with a background process moving several WAL files at once",
    ),
    opt(
        "spool-path",
        Kind::Path,
        "DIR",
        Some(super::DEFAULT_SPOOL_PATH),
        H_ARCHIVE,
        Cmds::of(&[
            Cmd::ArchivePush,
            Cmd::ArchiveGet,
            Cmd::Restore,
            Cmd::ArchiveStream,
            Cmd::Info,
        ]),
        "Spool directory of asynchronous archiving and of archive-stream's status file (default /var/spool/pgjet; info reads what they left there); local, owned by the cluster's OS user",
    ),
    opt(
        "archive-push-queue-max",
        Kind::Size,
        "SIZE",
        None,
        H_ARCHIVE,
        Cmds::of(&[Cmd::ArchivePush]),
        "Most WAL (bytes; suffixes KB MB GB TB, powers of 1024) waiting to be archived before archive-push drops it with a WARNING and records the gap (default: no limit)",
    ),
    opt(
        "archive-get-queue-max",
        Kind::Size,
        "SIZE",
        Some("128MB"),
        H_ARCHIVE,
        Cmds::of(&[Cmd::ArchiveGet]),
        "Most WAL (bytes, suffixes as above) archive-get fetches ahead into the spool directory when asynchronous (default 128MB)",
    ),
    opt(
        "archive-stream-slot",
        Kind::Text,
        "SLOT",
        None,
        H_ARCHIVE,
        Cmds::of(&[Cmd::ArchiveStream]),
        "The physical replication slot archive-stream holds on the cluster, created when missing (default pgjet_stream_STANZA): the server keeps every WAL byte not yet durable in the repositories",
    ),
    opt(
        "archive-check",
        Kind::Bool,
        "Y|N",
        Some("y"),
        H_ARCHIVE,
        BACKUP,
        "y (default) or n: a backup of a cluster that archives WAL waits until its last segment is in the archive and records its WAL range there",
    ),
    // Retention.
    // pgBackRest's repo1-retention-full (its only spelling: retention is per repository
    // there); pgjet applies one retention to every repository.
    OptionDef {
        aliases: &["repo1-retention-full"],
        ..opt(
            "retention-full",
            AT_LEAST_1,
            "N",
            None,
            H_RETENTION,
            Cmds::of(&[Cmd::Backup, Cmd::Expire]),
            "Full backups to keep (retention-full-type=count), or days to keep them (time). `expire` and every `backup` remove older ones; unset: backups are never expired",
        )
    },
    // pgBackRest's repo1-retention-full-type (its only spelling: retention is per repository
    // there); pgjet applies one retention to every repository.
    OptionDef {
        aliases: &["repo1-retention-full-type"],
        ..opt(
            "retention-full-type",
            Kind::Choice(RetentionFullType::WORDS),
            "TYPE",
            Some("count"),
            H_RETENTION,
            Cmds::of(&[Cmd::Backup, Cmd::Expire]),
            "count (default) or time (retention-full is then in days)",
        )
    },
    // pgBackRest's repo1-retention-diff (its only spelling: retention is per repository
    // there); pgjet applies one retention to every repository.
    OptionDef {
        aliases: &["repo1-retention-diff"],
        ..opt(
            "retention-diff",
            AT_LEAST_1,
            "N",
            None,
            H_RETENTION,
            Cmds::of(&[Cmd::Backup, Cmd::Expire]),
            "Differential backups to keep; an expired diff takes the incrs that depend on it along. Unset: every diff of a kept full stays",
        )
    },
    // pgBackRest's repo1-retention-archive (its only spelling: retention is per repository
    // there); pgjet applies one retention to every repository.
    OptionDef {
        aliases: &["repo1-retention-archive"],
        ..opt(
            "retention-archive",
            AT_LEAST_1,
            "N",
            None,
            H_RETENTION,
            Cmds::of(&[Cmd::Backup, Cmd::Expire]),
            "How many of the newest backups keep a continuous WAL archive for point-in-time recovery (default: all that are kept); older backups keep only the WAL they need to be consistent",
        )
    },
    // backup.
    cmd_opt(
        "type",
        Kind::Choice(BackupType::WORDS),
        "TYPE",
        Some("full"),
        BACKUP,
        "Backup type",
    ),
    file_cmd_opt(
        "start-fast",
        Kind::Switch,
        "",
        None,
        BACKUP,
        "Ask for an immediate checkpoint instead of waiting for a spread one",
    ),
    cmd_opt(
        "no-expire",
        Kind::Switch,
        "",
        None,
        BACKUP,
        "Do not run `expire` after the backup",
    ),
    cmd_opt(
        "no-resume",
        Kind::Switch,
        "",
        None,
        BACKUP,
        "Do not resume an interrupted backup: remove it and start over (as resume=n)",
    ),
    opt(
        "resume",
        Kind::Bool,
        "Y|N",
        Some("y"),
        H_REPO,
        BACKUP,
        "y (default) or n: a backup resumes the newest interrupted backup of the same type and reference, keeping what it stored and checked where the cluster did not change since",
    ),
    opt(
        "manifest-save-threshold",
        Kind::Size,
        "BYTES",
        Some("64MiB"),
        H_REPO,
        BACKUP,
        "How many bytes a backup stores between saves of its resume journal, at least (suffixes k, M, G; 1% of the backup's size when that is more, as pgBackRest's option of that name); an interrupted backup is resumed from its last save",
    ),
    // restore.
    cmd_opt(
        "set",
        Kind::Text,
        "SET",
        Some("latest"),
        RESTORE,
        "Backup label to restore, or `latest` (with --type time or lsn: the newest backup that ends before the target)",
    ),
    cmd_opt(
        "type",
        Kind::Choice(RestoreType::WORDS),
        "TYPE",
        Some("default"),
        RESTORE,
        "Recovery type",
    ),
    cmd_opt(
        "target",
        Kind::Text,
        "VALUE",
        None,
        RESTORE,
        "Recovery target: a time with its zone, an LSN, a transaction ID or a restore point name, for --type time, lsn, xid and name",
    ),
    cmd_opt(
        "target-exclusive",
        Kind::Switch,
        "",
        None,
        RESTORE,
        "Stop just before the target instead of just after it (recovery_target_inclusive = false)",
    ),
    cmd_opt(
        "target-action",
        Kind::Choice(TargetAction::WORDS),
        "TARGET_ACTION",
        Some("pause"),
        RESTORE,
        "What to do at the target",
    ),
    cmd_opt(
        "target-timeline",
        Kind::Text,
        "TIMELINE",
        None,
        RESTORE,
        "Timeline to recover along: current, latest (PostgreSQL's default) or a number",
    ),
    file_cmd_opt(
        "recovery-option",
        Kind::List,
        "KEY=VALUE",
        None,
        RESTORE,
        "A recovery setting KEY=VALUE for postgresql.auto.conf (repeatable); replaces the one pgjet would write, e.g. restore_command=...",
    ),
    file_cmd_opt(
        "tablespace-map",
        Kind::List,
        "ID=DIR",
        None,
        RESTORE,
        "Restore tablespace ID (OID or name) into DIR instead of its original location",
    ),
    file_cmd_opt(
        "archive-mode",
        Kind::Choice(ArchiveMode::WORDS),
        "ARCHIVE_MODE",
        Some("preserve"),
        RESTORE,
        "`off` sets archive_mode = off in the restored cluster, so a copy of production does not archive into production's WAL archive; `preserve` (default) keeps the setting",
    ),
    file_cmd_opt(
        "delta",
        Kind::Switch,
        "",
        None,
        RESTORE,
        "Restore into an existing copy of the same cluster, writing only the pieces whose bytes differ from the backup's and removing files the backup does not have. Refused while a server runs in the directory",
    ),
    // verify.
    cmd_opt(
        "set",
        Kind::Text,
        "SET",
        None,
        Cmds::of(&[Cmd::Verify]),
        "Backup label to verify (default: all)",
    ),
    // replica-create.
    cmd_opt(
        "tablespace-map",
        Kind::List,
        "ID=DIR",
        None,
        REPLICA,
        "Place tablespace ID (OID or name) in DIR",
    ),
    cmd_opt(
        "slot",
        Kind::Text,
        "SLOT",
        None,
        REPLICA,
        "Create this permanent physical replication slot on the primary and use it",
    ),
    file_cmd_opt(
        "start-fast",
        Kind::Switch,
        "",
        None,
        REPLICA,
        "Ask for an immediate checkpoint",
    ),
    cmd_opt(
        "start",
        Kind::Switch,
        "",
        None,
        REPLICA,
        "Start the new standby (on --pg-port) and wait until it streams",
    ),
    cmd_opt(
        "delta",
        Kind::Switch,
        "",
        None,
        REPLICA,
        "Re-sync an existing copy of the same cluster (a stale or interrupted standby, or a former primary that diverged): only ranges whose hashes differ are copied, files the primary lacks are removed. Refused while a server runs in the directory",
    ),
    cmd_opt(
        "pg-bin",
        Kind::Path,
        "DIR",
        None,
        REPLICA,
        "Directory of the PostgreSQL binaries used by --start (default: those of the primary)",
    ),
    file_cmd_opt(
        "seed",
        Kind::Choice(Seed::WORDS),
        "SEED",
        Some("auto"),
        REPLICA,
        "Where the new standby's files come from: the source, or the repository's newest backup (--stanza) with the WAL archived since (docs/replica-sources.md)",
    ),
    // info.
    file_cmd_opt(
        "format",
        Kind::Choice(InfoFormat::WORDS),
        "FORMAT",
        Some("pgjet"),
        Cmds::of(&[Cmd::Info]),
        "Which report: pgjet's own, or pgBackRest's (`--output json --format pgbackrest`: what pgbackrest_exporter and check_pgbackrest read)",
    ),
    // expire.
    cmd_opt(
        "dry-run",
        Kind::Switch,
        "",
        None,
        Cmds::of(&[Cmd::Expire]),
        "Print what would be removed; remove nothing",
    ),
    // Tuning variables (read where they are used, for measurements; see bench/).
    tuning(
        "read-ahead",
        "Readers of a restore per repository (1 to 64; default: the store's own)",
    ),
    tuning(
        "read-parts",
        "Ranged GETs in flight per object-store read (1 to 16)",
    ),
    tuning(
        "local-io-depth",
        "Threads per job reading a local data directory (1 to 16)",
    ),
    tuning(
        "bundle-kib",
        "Logical KiB of small files bundled into one stored object",
    ),
    tuning("bundle-files", "Files per bundle (1 to 65536)"),
    tuning(
        "libpq-row-kib",
        "KiB per pg_read_binary_file row over libpq (a multiple of 8)",
    ),
    tuning(
        "libpq-prefetch",
        "0 turns the libpq source's prefetch off",
    ),
    tuning(
        "delta-range-kib",
        "KiB per compared range of a delta (a multiple of 8)",
    ),
    tuning(
        "delta-summaries",
        "0 makes a delta compare without reading WAL summaries",
    ),
    tuning(
        "delta-page-lsn",
        "0 makes a delta without WAL summaries compare relation pages by hash instead of by LSN",
    ),
    tuning(
        "delta-wal-share",
        "A delta without WAL summaries lists the changed blocks from the primary's WAL when it is at most 1/N of the data (default 8; 0: never)",
    ),
];

/// Variables in pgjet's `PGJET_` namespace that are not options: the names the project's
/// benchmarks and tests use for their own purposes (`grep -rhoE "PGJET_[A-Z0-9_]+" bench
/// tests scripts`). pgjet ignores them without a warning; any other unknown `PGJET_*`
/// variable is warned about.
pub const HARNESS_VARIABLES: &[&str] = &[
    "PGJET_BIN",
    "PGJET_SRC",
    "PGJET_BASE",
    "PGJET_ENV",
    "PGJET_CONF",
    "PGJET_VERSION",
    "PGJET_COMPRESS",
    "PGJET_MILLION_DIR",
];

/// The command `name` names.
pub fn command(name: &str) -> Option<&'static CommandDef> {
    COMMANDS.iter().find(|c| c.name == name)
}

/// The definition of `cmd`.
pub fn command_def(cmd: Cmd) -> &'static CommandDef {
    COMMANDS
        .iter()
        .find(|c| c.cmd == cmd)
        .unwrap_or(&COMMANDS[0])
}

/// The option spelled `spelling` (name or alias) that applies to `cmd`, else the first
/// one of that spelling (several commands may each have an option of the same name).
pub fn find(spelling: &str, cmd: Option<Cmd>) -> Option<&'static OptionDef> {
    let mut all = OPTIONS
        .iter()
        .filter(move |d| d.spellings().any(|s| s == spelling));
    let first = all.next()?;
    match cmd {
        Some(c) => Some(
            std::iter::once(first)
                .chain(all)
                .find(|d| d.commands.contains(c))
                .unwrap_or(first),
        ),
        None => Some(first),
    }
}

/// What a config-file key (or an option name derived from an environment variable) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A pgjet option; for a repository option, the repository's number. `alias` when it
    /// was spelled by an alias.
    Option {
        def: &'static OptionDef,
        repo: Option<u8>,
        alias: bool,
    },
    /// A cipher option (`repo1-cipher-type`, `repo-cipher-pass`, ...).
    Cipher,
    /// A pgBackRest option pgjet does not implement (yet); with a hint when pgjet has
    /// something near.
    PgBackRest(Option<&'static str>),
    /// Neither.
    Unknown,
}

/// Classifies config-file key `key` (lower case). pgjet's own options come first, so a
/// pgBackRest name pgjet implements (`pg1-path`, `process-max`) is an option.
pub fn classify(key: &str) -> Key {
    if let Some(def) = OPTIONS.iter().find(|d| d.name == key && !d.repo) {
        return Key::Option {
            def,
            repo: None,
            alias: false,
        };
    }
    if let Some(def) = OPTIONS
        .iter()
        .find(|d| d.aliases.contains(&key) || d.visible_aliases.contains(&key))
    {
        return Key::Option {
            def,
            repo: None,
            alias: true,
        };
    }
    if let Some((n, suffix)) = split_repo(key) {
        if let Some(def) = OPTIONS
            .iter()
            .find(|d| d.repo && repo_suffix(d.name) == suffix)
        {
            if (1..=MAX_REPOS).contains(&n) {
                return Key::Option {
                    def,
                    repo: Some(n),
                    alias: false,
                };
            }
            return Key::PgBackRest(Some("pgjet configures repositories 1 to 4"));
        }
    }
    if key.contains("cipher") {
        return Key::Cipher;
    }
    match super::pgbackrest::lookup(key) {
        Some(hint) => Key::PgBackRest(hint),
        None => Key::Unknown,
    }
}

/// `repo-x` -> (1, "x"); `repoN-x` -> (N, "x") (N may be out of range).
fn split_repo(key: &str) -> Option<(u8, &str)> {
    let rest = key.strip_prefix("repo")?;
    if let Some(s) = rest.strip_prefix('-') {
        return Some((1, s));
    }
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let n: u8 = rest[..digits].parse().unwrap_or(u8::MAX);
    rest[digits..].strip_prefix('-').map(|s| (n, s))
}

/// What a `PGJET_*` environment variable is: the key it stands for (`PGJET_REPO2_PATH` ->
/// `repo2-path`), classified; None for a harness variable ([`HARNESS_VARIABLES`]) or a
/// name outside the namespace.
pub fn classify_env(var: &str) -> Option<(String, Key)> {
    let rest = var.strip_prefix("PGJET_")?;
    if HARNESS_VARIABLES.contains(&var) || rest.is_empty() {
        return None;
    }
    let key = rest.to_ascii_lowercase().replace('_', "-");
    let class = classify(&key);
    Some((key, class))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// The words of `T` each parse into a `T` whose word is that word, its other spellings
    /// too; the words as `T` lists them.
    fn words_of<T: FromStr<Err = String> + Copy + PartialEq + std::fmt::Debug>(
        as_str: fn(T) -> &'static str,
        words: Words,
    ) -> Words {
        for (w, _, other) in words {
            let v: T = w.parse().unwrap_or_else(|e| panic!("{w}: {e}"));
            assert_eq!(as_str(v), *w);
            for o in *other {
                assert_eq!(o.parse::<T>(), Ok(v), "{o}");
            }
        }
        words
    }

    #[test]
    fn every_choice_takes_the_words_of_the_type_it_becomes() {
        // (option, the words of the type its value becomes, checked to parse into it).
        let types: &[(&str, Words)] = &[
            ("output", words_of(Output::as_str, Output::WORDS)),
            (
                "compress-type",
                words_of(CompressType::as_str, CompressType::WORDS),
            ),
            ("repo-type", words_of(RepoType::as_str, RepoType::WORDS)),
            (
                "repo-cipher-type",
                words_of(CipherType::as_str, CipherType::WORDS),
            ),
            (
                "repo-s3-uri-style",
                words_of(UriStyle::as_str, UriStyle::WORDS),
            ),
            (
                "repo-gcs-key-type",
                words_of(GcsKeyType::as_str, GcsKeyType::WORDS),
            ),
            (
                "repo-azure-uri-style",
                words_of(UriStyle::as_str, UriStyle::WORDS),
            ),
            (
                "repo-azure-key-type",
                words_of(AzureKeyType::as_str, AzureKeyType::WORDS),
            ),
            (
                "repo-sftp-host-key-check-type",
                words_of(HostKeyCheck::as_str, HostKeyCheck::WORDS),
            ),
            ("transport", words_of(Transport::as_str, Transport::WORDS)),
            (
                "network-compress",
                words_of(NetworkCompress::as_str, NetworkCompress::WORDS),
            ),
            (
                "retention-full-type",
                words_of(RetentionFullType::as_str, RetentionFullType::WORDS),
            ),
            ("type", words_of(BackupType::as_str, BackupType::WORDS)),
            ("type", words_of(RestoreType::as_str, RestoreType::WORDS)),
            (
                "target-action",
                words_of(TargetAction::as_str, TargetAction::WORDS),
            ),
            (
                "archive-mode",
                words_of(ArchiveMode::as_str, ArchiveMode::WORDS),
            ),
            ("seed", words_of(Seed::as_str, Seed::WORDS)),
            ("format", words_of(InfoFormat::as_str, InfoFormat::WORDS)),
        ];
        let choices: Vec<(&str, Words)> = OPTIONS
            .iter()
            .filter_map(|d| match d.kind {
                Kind::Choice(w) => Some((d.name, w)),
                _ => None,
            })
            .collect();
        assert_eq!(choices, types, "a choice of the table is not listed here");
        // Each word, and each other spelling, names one value; defaults are words.
        for d in OPTIONS {
            if let Kind::Choice(words) = d.kind {
                let mut all: Vec<&str> = words
                    .iter()
                    .flat_map(|(w, _, o)| std::iter::once(*w).chain(o.iter().copied()))
                    .collect();
                let n = all.len();
                all.sort_unstable();
                all.dedup();
                assert_eq!(all.len(), n, "{}: a word twice", d.name);
            }
            if let Some(v) = d.default {
                assert!(d.kind.check(d.name, v).is_ok(), "{}: default {v}", d.name);
            }
        }
    }
}
