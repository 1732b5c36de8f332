//! A re-synced standby's own settings: what `replica-create --delta` keeps of the target's
//! `postgresql.auto.conf` when the primary's copy of that file replaces it.
//!
//! A standby's postgresql.auto.conf holds settings that are its own, not the primary's: the
//! `primary_conninfo` and `primary_slot_name` it streams with (written by replica-create or
//! by hand), its `port`, a `restore_command`, and whatever a DBA set on it with `ALTER
//! SYSTEM`. A re-sync copies the primary's postgresql.auto.conf like any other file, so these
//! are read before the copy ([`OwnSettings::read`]) and written back after it
//! ([`OwnSettings::kept_lines`]), unless the command line says otherwise (`--slot`,
//! `--pg-port`, `--source`'s keywords). The rules:
//! - the recovery settings ([`super::finish::RECOVERY_SETTINGS`]) and `port` are always the
//!   standby's (the primary's are commented out by the finish);
//! - any other setting the standby's file sets and the primary's does not is kept;
//! - a setting both files set takes the primary's value (it may have to match the primary's,
//!   as max_connections does for a hot standby: PostgreSQL src/backend/access/transam/xlog.c,
//!   CheckRequiredParameterValues).
//!
//! The file's syntax is PostgreSQL's configuration file syntax (src/backend/utils/misc/
//! guc-file.l): `name = value` or `name value`, `#` comments, values quoted with `'` where
//! `''` and `\'` stand for a quote.
use super::finish::{setting_name, RECOVERY_SETTINGS};
use crate::error::{Error, Result};
use crate::pg::conninfo::ConnInfo;
use std::fs;
use std::path::Path;

/// The settings of one postgresql.auto.conf: (name lower-cased, the whole line), the last
/// line of a name winning as it does for PostgreSQL.
#[derive(Debug, Default, Clone)]
pub struct OwnSettings {
    lines: Vec<(String, String)>,
}

impl OwnSettings {
    /// Reads `pg_path`'s postgresql.auto.conf. A missing file has no settings, and so has
    /// an unfinished copy (pgjet's marker, or no global/pg_control: its files may be
    /// half-written, sparse and full of zeroes) and a file that is not text.
    ///
    /// Errors: the file exists but cannot be read.
    pub fn read(pg_path: &Path) -> Result<OwnSettings> {
        if pg_path.join(super::delta_target::MARKER).exists()
            || !pg_path.join("global/pg_control").exists()
        {
            return Ok(OwnSettings::default());
        }
        OwnSettings::copied(pg_path)
    }

    /// Reads the postgresql.auto.conf just copied into `pg_path` (the primary's), whatever
    /// state the rest of the directory is in; a file that is not text has no settings.
    ///
    /// Errors: the file exists but cannot be read.
    pub fn copied(pg_path: &Path) -> Result<OwnSettings> {
        let p = pg_path.join("postgresql.auto.conf");
        match fs::read(&p) {
            Ok(b) if b.contains(&0) => Ok(OwnSettings::default()),
            Ok(b) => Ok(OwnSettings::parse(&String::from_utf8_lossy(&b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(OwnSettings::default()),
            Err(e) => Err(Error::io("read", &p, e)),
        }
    }

    /// The settings of a file's text.
    pub fn parse(text: &str) -> OwnSettings {
        let mut lines: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(name) = setting_name(line) {
                lines.retain(|(n, _)| *n != name);
                lines.push((name, line.trim().to_string()));
            }
        }
        OwnSettings { lines }
    }

    /// True when the file sets `name`.
    pub fn sets(&self, name: &str) -> bool {
        self.lines.iter().any(|(n, _)| n == name)
    }

    /// The value of `name`, unquoted; None when not set.
    pub fn get(&self, name: &str) -> Option<String> {
        let (_, line) = self.lines.iter().find(|(n, _)| n == name)?;
        settings_in(line).pop().map(|(_, v)| v)
    }

    /// The standby's `primary_slot_name`, when set and not empty.
    pub fn slot(&self) -> Option<String> {
        self.get("primary_slot_name").filter(|s| !s.is_empty())
    }

    /// The standby's `primary_conninfo`, parsed; None when unset, empty or unreadable.
    pub fn conninfo(&self) -> Option<ConnInfo> {
        let c = self.get("primary_conninfo").filter(|s| !s.is_empty())?;
        ConnInfo::parse(&c).ok()
    }

    /// The lines to write back after the primary's file (`primary`) replaced this one:
    /// the settings [`OwnSettings`]'s rules keep, except those in `written` (the settings
    /// replica-create writes itself: primary_conninfo, primary_slot_name, port).
    pub fn kept_lines(&self, primary: &OwnSettings, written: &[&str]) -> Vec<String> {
        let kept: Vec<String> = self
            .lines
            .iter()
            .filter(|(n, _)| !written.contains(&n.as_str()))
            .filter(|(n, _)| {
                RECOVERY_SETTINGS.contains(&n.as_str()) || n == "port" || !primary.sets(n)
            })
            .map(|(_, l)| l.clone())
            .collect();
        if kept.is_empty() {
            return kept;
        }
        let mut v =
            vec!["# the standby's own settings, kept by pgjet replica-create --delta".into()];
        v.extend(kept);
        v
    }
}

/// Every setting of a configuration file's text, in file order: (name lower-cased, value
/// unquoted), as PostgreSQL reads them (a later line of a name wins).
pub fn settings_in(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let name = setting_name(line)?;
            let rest = line.trim_start()[name.len()..].trim_start();
            let rest = rest.strip_prefix('=').unwrap_or(rest).trim();
            Some((name, unquote(rest)))
        })
        .collect()
}

/// A configuration value as written (`'quoted'` or bare) -> its text: `''` and `\'` are a
/// quote, `\\` a backslash (guc-file.l's GUC_scanstr); a trailing comment ends a bare value.
fn unquote(v: &str) -> String {
    let Some(inner) = v.strip_prefix('\'') else {
        return v.split('#').next().unwrap_or("").trim().to_string();
    };
    let mut out = String::with_capacity(inner.len());
    let mut it = inner.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\'' if it.peek() == Some(&'\'') => {
                it.next();
                out.push('\'');
            }
            '\'' => break,
            '\\' => match it.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => out.push(o),
                None => {}
            },
            o => out.push(o),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::session::quote_conf_value;

    #[test]
    fn values_read_back_as_written() {
        let ci = r"host=db1 port=5433 user=rep application_name=s1 password='it\'s'";
        let text = format!(
            "# Do not edit this file manually!\nwork_mem = '8MB'\nport=5433\n\
             primary_conninfo = {}\nprimary_slot_name = 'standby1'\nwork_mem = '16MB' # later\n\
             #primary_slot_name = 'old'\n",
            quote_conf_value(ci)
        );
        let o = OwnSettings::parse(&text);
        assert_eq!(
            o.get("work_mem").as_deref(),
            Some("16MB"),
            "the last line wins"
        );
        assert_eq!(o.get("port").as_deref(), Some("5433"));
        assert_eq!(o.slot().as_deref(), Some("standby1"));
        assert_eq!(o.get("primary_conninfo").as_deref(), Some(ci));
        let c = o.conninfo().unwrap();
        assert_eq!(c.get("application_name"), Some("s1"));
        assert_eq!(c.get("password"), Some("it's"));
        assert_eq!(o.get("nothing"), None);
    }

    #[test]
    fn an_unfinished_copy_has_no_settings_of_its_own() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("global")).unwrap();
        std::fs::write(d.path().join("postgresql.auto.conf"), "port = '5433'\n").unwrap();
        // No pg_control yet (a copy cut short before its end).
        assert!(!OwnSettings::read(d.path()).unwrap().sets("port"));
        assert!(OwnSettings::copied(d.path()).unwrap().sets("port"));
        std::fs::write(d.path().join("global/pg_control"), b"x").unwrap();
        assert!(OwnSettings::read(d.path()).unwrap().sets("port"));
        // pgjet's marker: unfinished.
        std::fs::write(d.path().join(crate::pgdata::delta_target::MARKER), b"").unwrap();
        assert!(!OwnSettings::read(d.path()).unwrap().sets("port"));
        std::fs::remove_file(d.path().join(crate::pgdata::delta_target::MARKER)).unwrap();
        // A sparse, half-written file.
        std::fs::write(d.path().join("postgresql.auto.conf"), [0u8; 64]).unwrap();
        assert!(OwnSettings::read(d.path())
            .unwrap()
            .kept_lines(&OwnSettings::default(), &[])
            .is_empty());
    }

    #[test]
    fn the_standby_keeps_its_own_and_the_primary_wins_the_shared() {
        let standby = OwnSettings::parse(
            "max_connections = '100'\nhot_standby_feedback = 'on'\nport = '5433'\n\
             primary_conninfo = 'host=a'\nprimary_slot_name = 's1'\nrestore_command = 'cp x %p'\n",
        );
        let primary = OwnSettings::parse(
            "max_connections = '200'\nrestore_command = 'theirs'\nport = '5432'\n",
        );
        let kept = standby.kept_lines(&primary, &["primary_conninfo", "primary_slot_name"]);
        assert_eq!(
            kept[1..],
            [
                "hot_standby_feedback = 'on'",
                "port = '5433'",
                "restore_command = 'cp x %p'"
            ],
            "{kept:?}"
        );
        assert!(kept[0].starts_with('#'));
        assert!(OwnSettings::default().kept_lines(&primary, &[]).is_empty());
    }
}
