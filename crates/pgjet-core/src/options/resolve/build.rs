//! A command's plain options ([`Command`]) from the command line's values and the table's
//! defaults.
use super::*;

/// The command `cmd` with its options from the command line values `cli` (defaults from
/// the table) and its positional arguments `args`.
///
/// Errors: a value that does not parse (clap has checked them already).
pub fn build_command(cmd: Cmd, cli: &CliValues, args: &[String]) -> Result<Command> {
    let o = CommandValues { cmd, cli };
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    Ok(match cmd {
        Cmd::StanzaCreate => Command::StanzaCreate,
        Cmd::CipherPassChange => Command::CipherPassChange,
        Cmd::Info => Command::Info(InfoOptions {
            format: o.parsed("format")?,
        }),
        Cmd::Check => Command::Check,
        Cmd::Backup => Command::Backup(BackupOptions {
            backup_type: o.parsed("type")?,
            start_fast: o.switch("start-fast"),
            no_expire: o.switch("no-expire"),
            no_resume: o.switch("no-resume"),
        }),
        Cmd::Restore => Command::Restore(RestoreOptions {
            set: o.parsed("set")?,
            restore_type: o.parsed("type")?,
            target: o.text("target"),
            target_exclusive: o.switch("target-exclusive"),
            target_action: o.parsed("target-action")?,
            target_timeline: o.text("target-timeline"),
            recovery_option: o.list("recovery-option"),
            tablespace_map: o.list("tablespace-map"),
            archive_mode: o.parsed("archive-mode")?,
            delta: o.switch("delta"),
        }),
        Cmd::Verify => Command::Verify(VerifyOptions { set: o.text("set") }),
        Cmd::ReplicaCreate => Command::ReplicaCreate(ReplicaOptions {
            tablespace_map: o.list("tablespace-map"),
            slot: o.text("slot"),
            start_fast: o.switch("start-fast"),
            start: o.switch("start"),
            delta: o.switch("delta"),
            pg_bin: o.text("pg-bin").map(PathBuf::from),
            patroni: None,
            seed: o.parsed("seed")?,
        }),
        Cmd::Expire => Command::Expire(ExpireOptions {
            dry_run: o.switch("dry-run"),
        }),
        Cmd::ArchivePush => Command::ArchivePush {
            wal_path: PathBuf::from(arg(0)),
        },
        Cmd::ArchiveGet => Command::ArchiveGet {
            wal_file: arg(0),
            dest: PathBuf::from(arg(1)),
        },
        Cmd::ArchiveStream => Command::ArchiveStream,
        Cmd::ArchivePushAsync => Command::ArchivePushAsync {
            wal_dir: PathBuf::from(arg(0)),
        },
        Cmd::ArchiveGetAsync => Command::ArchiveGetAsync {
            first_request: arg(0),
        },
    })
}

/// A command's own options from the command line, defaults from the table.
pub(super) struct CommandValues<'a> {
    cmd: Cmd,
    cli: &'a CliValues,
}

impl CommandValues<'_> {
    fn text(&self, name: &str) -> Option<String> {
        self.cli
            .get(name)
            .and_then(|v| v.last().cloned())
            .or_else(|| {
                table::find(name, Some(self.cmd))
                    .and_then(|d| d.default)
                    .map(str::to_string)
            })
    }
    fn switch(&self, name: &str) -> bool {
        self.cli.contains_key(name)
    }
    fn list(&self, name: &str) -> Vec<String> {
        self.cli.get(name).cloned().unwrap_or_default()
    }
    fn parsed<T: std::str::FromStr<Err = E>, E: std::fmt::Display>(&self, name: &str) -> Result<T> {
        let v = self.text(name).unwrap_or_default();
        v.parse()
            .map_err(|e| Error::Config(format!("--{name} {v}: {e}")))
    }
}
