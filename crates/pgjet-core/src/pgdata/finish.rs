//! The one finish of a written data directory, for `restore` and `replica-create` alike.
//!
//! Once every copied file is in place: `backup_label`, `tablespace_map`, the settings pgjet
//! adds to `postgresql.auto.conf` (recovery settings inherited from the source commented out
//! first), the signal file; then whatever the caller adds (restore: PostgreSQL's
//! `backup_manifest`); then one syncfs per filesystem; and only then `global/pg_control`,
//! its directory fsynced, and pgjet's marker removed. Until pg_control exists the directory
//! is not a cluster PostgreSQL would start, so a finish cut short at any point leaves
//! nothing that looks usable.
use super::{append_auto_conf, DataDirModes, TargetSync};
use crate::error::{Error, Result};
use crate::io::fs::{fsync_dir, write_file};
use std::fs;
use std::path::Path;

/// The recovery settings a data directory can carry over from the cluster it was copied
/// from (a former standby's `primary_conninfo` and `primary_slot_name`, a restored
/// cluster's `restore_command` and targets). pgBackRest's restore clears the same kind of
/// settings before it writes its own; see PostgreSQL's "Recovery Target" and "Standby
/// Server" settings (doc/src/sgml/config.sgml) for what each one does.
pub const RECOVERY_SETTINGS: &[&str] = &[
    "primary_conninfo",
    "primary_slot_name",
    "restore_command",
    "archive_cleanup_command",
    "recovery_end_command",
    "promote_trigger_file",
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
];

/// What the finish writes besides the copied files.
pub struct Finish<'a> {
    /// `backup_label`, as pg_backup_stop returned it.
    pub backup_label: &'a [u8],
    /// `tablespace_map` text with the chosen locations; None without tablespaces.
    pub tablespace_map: Option<String>,
    /// When set, recovery settings inherited from the source are commented out (with this
    /// note, e.g. "pgjet restore of backup 20261124-010203F") before `auto_conf` is added,
    /// and an inherited standby.signal or recovery.signal is removed.
    pub replace_recovery_settings: Option<String>,
    /// Lines appended to postgresql.auto.conf (each group starts with its own comment).
    pub auto_conf: Vec<String>,
    /// `standby.signal` or `recovery.signal`, written empty; None for neither.
    pub signal: Option<&'a str>,
}

/// Runs the finish on `pg_path` (see the module's documentation): `before_sync` runs after
/// the settings are written and before the sync; `write_control` writes global/pg_control
/// and returns its path, after the sync.
///
/// Errors: any write or sync failure, naming the file.
pub fn finish(
    pg_path: &Path,
    sync: &TargetSync,
    f: &Finish,
    before_sync: impl FnOnce() -> Result<()>,
    write_control: impl FnOnce() -> Result<()>,
) -> Result<()> {
    // Cancelled by now: the directory stays unfinished (no pg_control), as asked.
    crate::io::cancel::check()?;
    // The files written here get the cluster's file mode, from the data directory's mode
    // as PostgreSQL takes it (0600, or 0640 with group access).
    let mode = DataDirModes::of_dir(pg_path)?.file;
    write_file(&pg_path.join("backup_label"), f.backup_label, mode)?;
    if let Some(text) = &f.tablespace_map {
        write_file(&pg_path.join("tablespace_map"), text.as_bytes(), mode)?;
    }
    if let Some(note) = &f.replace_recovery_settings {
        // A copy of a standby carries its standby.signal (PostgreSQL's base backup does not
        // leave it out): the chosen signal alone stays.
        for inherited in ["standby.signal", "recovery.signal"] {
            let p = pg_path.join(inherited);
            match std::fs::remove_file(&p) {
                Ok(()) => tracing::info!("{inherited} inherited from the source removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(crate::error::Error::io("remove", &p, e)),
            }
        }
        let n = comment_out_recovery_settings(pg_path, note, mode)?;
        if n > 0 {
            tracing::info!(
                "{n} recovery setting(s) inherited from the source were commented out in postgresql.auto.conf"
            );
        }
    }
    if !f.auto_conf.is_empty() {
        append_auto_conf(pg_path, &f.auto_conf, mode)?;
    }
    if let Some(signal) = f.signal {
        write_file(&pg_path.join(signal), b"", mode)?;
    }
    before_sync()?;
    sync.sync()?;
    // Last: pg_control. Until it exists the directory is not a cluster PostgreSQL would start.
    write_control()?;
    fsync_dir(&pg_path.join("global"))?;
    super::delta_target::remove_marker(pg_path)
}

/// The setting a postgresql.auto.conf line sets, when it sets one: `name = value` or
/// `name value` (PostgreSQL's configuration file syntax, guc-file.l), name lower-cased.
pub(crate) fn setting_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    let end = t
        .find(|c: char| c == '=' || c.is_whitespace())
        .unwrap_or(t.len());
    Some(t[..end].to_ascii_lowercase())
}

/// Comments out, in `pg_path`'s postgresql.auto.conf, every line that sets one of
/// [`RECOVERY_SETTINGS`], each preceded by a line saying why (`note` and today's date), so
/// that the settings pgjet writes next are the only ones in effect. Returns how many lines
/// it commented out; a missing file is fine (0). The file is rewritten durably only when
/// something changed, in place (it keeps its mode; `mode` is used only should it vanish
/// meanwhile).
///
/// Errors: the file cannot be read or written.
pub fn comment_out_recovery_settings(pg_path: &Path, note: &str, mode: u32) -> Result<usize> {
    let p = pg_path.join("postgresql.auto.conf");
    let text = match fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io("read", &p, e)),
    };
    let date = chrono::Utc::now().format("%Y-%m-%d");
    let mut out = String::with_capacity(text.len() + 256);
    let mut n = 0;
    let former = without_former_pgjet_lines(&text);
    let changed = former.len() != text.lines().count();
    for line in former {
        match setting_name(line) {
            Some(name) if RECOVERY_SETTINGS.contains(&name.as_str()) => {
                out.push_str(&format!(
                    "# {name} inherited from the source, commented out by {note} on {date}:\n#{line}\n"
                ));
                n += 1;
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if n > 0 || changed {
        write_file(&p, out.as_bytes(), mode)?;
    }
    Ok(n)
}

/// The lines of a postgresql.auto.conf without what earlier pgjet runs wrote there that a
/// copy brought along (the source was itself made by pgjet, as every member of an HA
/// cluster is after a few switchovers): their block headers (`# standby settings added by
/// pgjet ...`, `# recovery settings added by pgjet ...`) and their notes on settings they
/// commented out (the note and the commented line). The settings under a former header
/// stay, to be commented out with this run's note. So a copy of a copy holds one generation
/// of notes and one block, not one more of each per generation. Other lines are kept.
fn without_former_pgjet_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("# standby settings added by pgjet")
            || t.starts_with("# recovery settings added by pgjet")
        {
            continue;
        }
        if t.starts_with('#') && t.contains(" inherited from the source, commented out by pgjet") {
            if lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with('#'))
            {
                lines.next();
            }
            continue;
        }
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inherited_recovery_settings_are_commented_out_and_others_kept() {
        let d = tempfile::tempdir().unwrap();
        let conf = d.path().join("postgresql.auto.conf");
        assert_eq!(
            comment_out_recovery_settings(d.path(), "x", 0o600).unwrap(),
            0
        );
        fs::write(
            &conf,
            "# Do not edit this file manually!\n\
             shared_buffers = '256MB'\n\
             primary_conninfo = 'host=old user=rep'\n\
             Primary_Slot_Name='r1'\n\
             restore_command 'cp /a/%f %p'\n\
             recovery_target_time = '2026-01-01 00:00:00+00'\n\
             # primary_slot_name = 'already a comment'\n\
             archive_mode = 'on'\n",
        )
        .unwrap();
        let n = comment_out_recovery_settings(d.path(), "pgjet replica-create", 0o600).unwrap();
        assert_eq!(n, 4);
        let after = fs::read_to_string(&conf).unwrap();
        let active: Vec<&str> = after
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        assert_eq!(active, ["shared_buffers = '256MB'", "archive_mode = 'on'"]);
        assert!(after.contains("#Primary_Slot_Name='r1'"), "{after}");
        assert!(
            after.contains("commented out by pgjet replica-create on"),
            "{after}"
        );
        // A copy of a copy: pgjet's former block and notes go, one new block stays.
        let mut again = after.clone();
        again.push_str(
            "# standby settings added by pgjet replica-create\n\
             primary_conninfo = 'host=a'\n\
             primary_slot_name = 's1'\n\
             hot_standby_feedback = 'on'\n",
        );
        fs::write(&conf, &again).unwrap();
        assert_eq!(
            comment_out_recovery_settings(d.path(), "pgjet replica-create", 0o600).unwrap(),
            2
        );
        let third = fs::read_to_string(&conf).unwrap();
        let kept: Vec<&str> = third
            .lines()
            .filter(|l| !l.contains("commented out by pgjet"))
            .collect();
        assert_eq!(
            kept,
            [
                "# Do not edit this file manually!",
                "shared_buffers = '256MB'",
                "# primary_slot_name = 'already a comment'",
                "archive_mode = 'on'",
                "#primary_conninfo = 'host=a'",
                "#primary_slot_name = 's1'",
                "hot_standby_feedback = 'on'",
            ],
            "{third}"
        );
        assert_eq!(
            third.matches("commented out by pgjet").count(),
            2,
            "{third}"
        );
        // Nothing left to comment out, and the notes of a former run go: the file keeps its
        // settings and the lines pgjet did not write.
        assert_eq!(
            comment_out_recovery_settings(d.path(), "again", 0o600).unwrap(),
            0
        );
        assert_eq!(
            fs::read_to_string(&conf).unwrap(),
            "# Do not edit this file manually!\n\
             shared_buffers = '256MB'\n\
             # primary_slot_name = 'already a comment'\n\
             archive_mode = 'on'\n\
             hot_standby_feedback = 'on'\n"
        );
    }
}
