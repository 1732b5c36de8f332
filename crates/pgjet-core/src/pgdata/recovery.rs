//! What a restored cluster does when it starts: the recovery settings `restore` writes for
//! each `--type`, the recovery target, and the choice of backup for a point-in-time target.
//!
//! PostgreSQL's recovery settings are documented in "Archive Recovery" and "Recovery Target"
//! of its manual (runtime-config-wal); `recovery.signal` asks for archive recovery,
//! `standby.signal` for standby mode.
use crate::error::{Error, Result};
use crate::options::{ArchiveConfig, RepoSet, RestoreOptions, RestoreType, TargetAction};
use crate::pg::lsn::{self, Lsn};
use crate::repo::open::open_stanzas;
use crate::repo::{BackupSummary, Stanza};
use chrono::{DateTime, FixedOffset, NaiveDateTime, Utc};

/// A recovery target, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// No target: to the end of the archive (`default`, `standby`), or none at all.
    None,
    /// The first consistent point.
    Immediate,
    /// `recovery_target_time`: the text given, and the instant it means.
    Time(String, DateTime<Utc>),
    Lsn(Lsn),
    /// `recovery_target_xid`: a transaction ID (with or without epoch).
    Xid(u64),
    /// `recovery_target_name`: a restore point made with pg_create_restore_point().
    Name(String),
}

/// Parses a recovery target time as PostgreSQL's `timestamptz` input would take it in the
/// common forms: `YYYY-MM-DD HH:MM:SS[.frac]` with an offset (`+00`, `+02:00`, `Z`) or the
/// word `UTC`, or RFC 3339. A time without a zone is refused: PostgreSQL would read it in
/// the restored server's `timezone`, which pgjet cannot know.
///
/// Errors: [`Error::Config`] naming the value and the forms accepted.
pub fn parse_target_time(v: &str) -> Result<DateTime<Utc>> {
    let t = v.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(d.with_timezone(&Utc));
    }
    // The date and time may be joined by a 'T' (ISO 8601).
    let t2 = match t.get(10..11) {
        Some("T") | Some("t") => format!("{} {}", &t[..10], &t[11..]),
        _ => t.to_string(),
    };
    for suffix in [" UTC", " utc", " GMT", "Z", "z"] {
        if let Some(base) = t2.strip_suffix(suffix) {
            for f in [
                "%Y-%m-%d %H:%M:%S%.f",
                "%Y-%m-%d %H:%M:%S",
                "%Y-%m-%d %H:%M",
            ] {
                if let Ok(n) = NaiveDateTime::parse_from_str(base.trim(), f) {
                    return Ok(n.and_utc());
                }
            }
        }
    }
    // An offset of hours only (+02) is what PostgreSQL prints; chrono wants minutes.
    let with_minutes = match t2.rfind(['+', '-']) {
        Some(i) if i > 10 && t2[i + 1..].len() == 2 => format!("{t2}:00"),
        _ => t2.clone(),
    };
    for f in [
        "%Y-%m-%d %H:%M:%S%.f%:z",
        "%Y-%m-%d %H:%M:%S%:z",
        "%Y-%m-%d %H:%M:%S%.f%z",
    ] {
        if let Ok(d) = DateTime::<FixedOffset>::parse_from_str(&with_minutes, f) {
            return Ok(d.with_timezone(&Utc));
        }
    }
    Err(Error::Config(format!(
        "--target '{v}' is not a time pgjet can read: give it with its time zone, e.g. '2026-11-22 14:15:02+00', '2026-11-22 14:15:02.123 UTC' or '2026-11-22T14:15:02Z'"
    )))
}

/// Checks `--type`, `--target`, `--target-exclusive` and `--target-action` together and
/// returns the target.
///
/// Errors: [`Error::Config`]: a target missing for time/lsn/xid/name or given for another
/// type, a value that does not parse, `--target-exclusive` where it means nothing.
pub fn parse_target(args: &RestoreOptions) -> Result<Target> {
    let needs = matches!(
        args.restore_type,
        RestoreType::Time | RestoreType::Lsn | RestoreType::Xid | RestoreType::Name
    );
    let v = match (&args.target, needs) {
        (Some(v), true) => v.clone(),
        (None, true) => {
            return Err(Error::Config(format!(
                "--type {} needs --target",
                type_name(args.restore_type)
            )))
        }
        (Some(_), false) => {
            return Err(Error::Config(format!(
                "--target is only for --type time, lsn, xid or name, not {}",
                type_name(args.restore_type)
            )))
        }
        (None, false) => String::new(),
    };
    if args.target_exclusive
        && !matches!(
            args.restore_type,
            RestoreType::Time | RestoreType::Lsn | RestoreType::Xid
        )
    {
        return Err(Error::Config(
            "--target-exclusive is only for --type time, lsn or xid".into(),
        ));
    }
    Ok(match args.restore_type {
        RestoreType::Immediate => Target::Immediate,
        RestoreType::Time => Target::Time(v.clone(), parse_target_time(&v)?),
        RestoreType::Lsn => Target::Lsn(v.parse().map_err(|_| {
            Error::Config(format!("--target '{v}' is not an LSN (e.g. 0/3000060)"))
        })?),
        RestoreType::Xid => Target::Xid(
            v.trim()
                .parse()
                .map_err(|_| Error::Config(format!("--target '{v}' is not a transaction ID")))?,
        ),
        RestoreType::Name => {
            if v.is_empty() || v.len() >= 64 {
                return Err(Error::Config(format!(
                    "--target '{v}' is not a restore point name (1 to 63 bytes)"
                )));
            }
            Target::Name(v)
        }
        _ => Target::None,
    })
}

/// `--type` as the flag spells it.
pub fn type_name(t: RestoreType) -> &'static str {
    match t {
        RestoreType::Default => "default",
        RestoreType::Immediate => "immediate",
        RestoreType::Time => "time",
        RestoreType::Lsn => "lsn",
        RestoreType::Xid => "xid",
        RestoreType::Name => "name",
        RestoreType::Standby => "standby",
        RestoreType::Preserve => "preserve",
        RestoreType::None => "none",
    }
}

/// The stop time of a backup as an instant (its summary's RFC 3339 `stop_time`).
fn stop_instant(b: &BackupSummary) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(&b.end.stop.stop_time)
        .map(|d| d.with_timezone(&Utc))
        .map_err(|e| {
            Error::Repo(format!(
                "backup {}: stop_time '{}' is not valid",
                b.header.label, b.end.stop.stop_time
            ))
            .because(e)
        })
}

/// True when backup `b` reaches consistency no later than `target`: its stop time (time) or
/// stop LSN (lsn) is not after it. Other targets cannot be placed before a restore.
pub fn ends_before(b: &BackupSummary, target: &Target) -> Result<bool> {
    Ok(match target {
        Target::Time(_, t) => stop_instant(b)? <= *t,
        Target::Lsn(l) => b.end.stop.stop_lsn <= *l,
        _ => true,
    })
}

/// Picks the backup to restore for `--set latest` and a time or LSN target: the newest one,
/// over every repository in scope, that ends before the target. Returns the stanza in its
/// repository, and its label.
///
/// Errors: no backup ends before the target (naming the oldest one's end); the stores'.
pub fn choose_backup(s: &RepoSet, target: &Target) -> Result<(Stanza, String)> {
    let stanza = s.stanza()?;
    let mut best: Option<(String, Stanza)> = None;
    let mut oldest: Option<(String, String)> = None;
    for st in open_stanzas(s)? {
        if !st.exists()? {
            continue;
        }
        for label in st.complete()? {
            let b = st.backup(&label).summary()?;
            let end = match target {
                Target::Lsn(_) => b.end.stop.stop_lsn.to_string(),
                _ => b.end.stop.stop_time.clone(),
            };
            if oldest.as_ref().map(|(l, _)| label < *l).unwrap_or(true) {
                oldest = Some((label.clone(), end));
            }
            if ends_before(&b, target)? && best.as_ref().map(|(l, _)| label > *l).unwrap_or(true) {
                best = Some((label, st.clone()));
            }
        }
    }
    match (best, oldest) {
        (Some((label, st)), _) => Ok((st, label)),
        (None, Some((label, end))) => Err(Error::Repo(format!(
            "no backup of stanza '{stanza}' ends before the target: the oldest, {label}, ends at {end}; a point-in-time recovery replays WAL forward from a backup, never back"
        ))),
        (None, None) => Err(Error::Repo(format!(
            "stanza '{stanza}' has no complete backup"
        ))),
    }
}

/// Refuses a recovery that would have to replay across a recorded gap of the WAL archive:
/// one after the backup's last segment and, for an LSN target, starting at or before the
/// target. Recovery from the archive (default, time, lsn, xid, name) would stop at the
/// gap's first segment; a time, xid or name target cannot be placed before a restore, so
/// any later gap refuses it. immediate, none and preserve need only the backup's own WAL;
/// standby warns (streaming may fill what the archive lacks).
///
/// Errors: [`Error::Unsafe`] naming the gap, when it dropped, why, and what to do instead.
pub fn check_gaps(
    restore_type: RestoreType,
    target: &Target,
    backup: &BackupSummary,
    gaps: &[crate::repo::wal::Gap],
) -> Result<()> {
    let seg = backup.header.wal_segment_size;
    let stop_seg = lsn::prev_segno_of(backup.end.stop.stop_lsn, seg);
    for g in gaps {
        let Some((_, first)) = lsn::parse_wal_segment_name(&g.first, seg) else {
            continue;
        };
        let Some((_, last)) = lsn::parse_wal_segment_name(&g.last, seg) else {
            continue;
        };
        if last <= stop_seg {
            continue;
        }
        let before = Lsn(first * seg);
        let blocks = match (restore_type, target) {
            (RestoreType::Immediate | RestoreType::None | RestoreType::Preserve, _) => false,
            (_, Target::Lsn(l)) => *l >= before,
            _ => true,
        };
        let what = format!(
            "the WAL archive has a gap after backup {}: {} to {} ({} segment(s)) were dropped {} ({})",
            backup.header.label, g.first, g.last, g.segments, g.recorded, g.reason
        );
        if restore_type == RestoreType::Standby {
            tracing::warn!("{what}; the standby must stream that WAL from its primary");
            continue;
        }
        if blocks {
            return Err(Error::Unsafe(format!(
                "{what}: recovery to this target would have to replay across it. Recover to a point before it (an LSN before {}, e.g. --type lsn --target {}: a record that runs into the gap cannot be replayed), or restore a backup taken after it",
                before,
                Lsn(before.0.saturating_sub(seg))
            )));
        }
    }
    Ok(())
}

/// The `restore_command` a restored cluster runs: this pgjet binary with the config file
/// (when one was read), the stanza, repository 1's options given as flags or `PGJET_*`
/// variables ([`Settings::carried_flags`]: the table's non-secret repository options), its
/// path too when it is a posix directory named otherwise, `--repo N`, and `--archive-async=y
/// --spool-path=...` when asynchronous archiving is on. Secrets are never written into the
/// cluster's configuration: they must come from the config file or the server's environment
/// ([`environment_warning`]); `--recovery-option restore_command=...` replaces the whole
/// command.
pub fn restore_command(s: &ArchiveConfig, stanza: &str) -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "pgjet".into());
    // PostgreSQL replaces %-escapes in restore_command: a literal % is written %%.
    let word = |w: &str| shell_word(w).replace('%', "%%");
    let mut cmd = vec![word(&exe)];
    if let Some(f) = s.config_file() {
        cmd.push(word(&format!("--config={}", f.display())));
    }
    cmd.push(word(&format!("--stanza={stanza}")));
    let carried = &s.carried_flags;
    cmd.extend(carried.iter().map(|w| word(w)));
    if !carried.iter().any(|w| w.starts_with("--repo-path=")) {
        for (n, cfg) in &s.repo_set.repos {
            if let crate::storage::config::RepoConfig::Posix { path } = cfg {
                if *n == 1 {
                    cmd.push(word(&format!("--repo-path={}", path.display())));
                }
            }
        }
    }
    if let Some(n) = s.repo_set.repo {
        cmd.push(format!("--repo={n}"));
    }
    if s.archive.asynchronous {
        cmd.push("--archive-async=y".into());
        cmd.push(word(&format!(
            "--spool-path={}",
            s.archive.spool_path.display()
        )));
    }
    cmd.push("archive-get %f \"%p\"".into());
    cmd.join(" ")
}

/// A warning for restore when repository settings come from this shell's environment that
/// restore_command does not carry (`PGJET_REPO*` variables of secrets, or of repositories
/// 2-4, which have no flag): the restored server runs restore_command with its own
/// environment, which may lack them. `names` are the environment's variable names. None
/// when there are none.
pub fn environment_warning(names: impl IntoIterator<Item = String>) -> Option<String> {
    use crate::options::table::{classify_env, Key};
    let mut names: Vec<String> = names
        .into_iter()
        .filter(|k| k.starts_with("PGJET_REPO"))
        .filter(|k| match classify_env(k) {
            Some((_, Key::Option { def, repo, .. })) => {
                def.repo && !(def.carried() && repo == Some(1))
            }
            _ => false,
        })
        .collect();
    if names.is_empty() {
        return None;
    }
    names.sort();
    Some(format!(
        "repository settings come from the environment ({}); restore_command does not carry them: the restored server needs them in its own environment or in the config file, or archive-get fails and recovery stops",
        names.join(", ")
    ))
}

/// Quotes a word for the shell that runs restore_command, when it needs quoting.
fn shell_word(w: &str) -> String {
    if w.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_=./:,@+".contains(&b))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// The settings (lines for postgresql.auto.conf) and signal file for a restore.
#[derive(Debug, Default, PartialEq)]
pub struct RecoveryPlan {
    /// `key = 'value'` lines, already quoted.
    pub lines: Vec<String>,
    /// `recovery.signal` or `standby.signal`, or None.
    pub signal: Option<&'static str>,
}

/// True for a backup taken on a standby (backup_label's `BACKUP FROM: standby`). Its end is
/// the copied pg_control's minimum recovery point, and recovery sees it reached only when it
/// reads a record past it: where the standby's WAL ends right there (its stop LSN the first
/// byte of a segment, or a primary that stopped sending: shut down, or cut off) there is
/// none, and with `recovery_target = 'immediate'` PostgreSQL ends with "recovery ended before
/// configured recovery target was reached" (PostgreSQL src/backend/access/transam/
/// xlogrecovery.c). Seen in tests with the primary stopped and with it firewalled off.
pub fn is_standby_backup(b: &crate::repo::BackupSummary) -> bool {
    b.end
        .stop
        .backup_label
        .lines()
        .any(|l| l.trim() == "BACKUP FROM: standby")
}

impl RecoveryPlan {
    /// True when a line sets `name` (`--target-timeline`, a `--recovery-option`).
    pub fn sets(&self, name: &str) -> bool {
        self.lines
            .iter()
            .any(|l| l.split('=').next().map(str::trim) == Some(name))
    }

    /// Recovery follows `timeline` (`current` or a number): `recovery_target_timeline`
    /// replaced.
    pub fn follow_timeline(&mut self, timeline: &str) {
        self.lines
            .retain(|l| !l.starts_with("recovery_target_timeline"));
        self.lines.push(format!(
            "recovery_target_timeline = {}",
            crate::pg::session::quote_conf_value(timeline)
        ));
    }

    /// Recovery to the end of the backup's own WAL and no further: no target, and a
    /// restore_command that finds nothing (`false`), so recovery ends, consistent, where
    /// the backup's WAL ends and the cluster is promoted. For an `immediate` restore of a
    /// backup of a standby ([`is_standby_backup`]): at most the rest of its last WAL segment
    /// past the consistent point is replayed.
    pub fn replay_own_wal_only(&mut self) {
        self.lines
            .retain(|l| !(l.starts_with("recovery_target") || l.starts_with("restore_command")));
        self.lines.insert(0, "restore_command = 'false'".into());
    }
}

/// Builds the recovery settings of `args` for backup `label`: `restore_command` for every
/// type that reads the archive, the target, its inclusiveness and action, the timeline, then
/// `--recovery-option` entries (which replace a generated key of the same name).
///
/// Errors: a malformed `--recovery-option`.
pub fn plan(args: &RestoreOptions, target: &Target, restore_command: &str) -> Result<RecoveryPlan> {
    use crate::pg::session::quote_conf_value as q;
    let mut kv: Vec<(String, String)> = Vec::new();
    let mut push = |k: &str, v: String| kv.push((k.to_string(), v));
    let signal = match args.restore_type {
        RestoreType::None | RestoreType::Preserve => None,
        RestoreType::Standby => Some("standby.signal"),
        _ => Some("recovery.signal"),
    };
    if signal.is_some() {
        push("restore_command", restore_command.to_string());
    }
    match target {
        Target::None => {}
        Target::Immediate => push("recovery_target", "immediate".into()),
        Target::Time(v, _) => push("recovery_target_time", v.clone()),
        Target::Lsn(l) => push("recovery_target_lsn", l.to_string()),
        Target::Xid(x) => push("recovery_target_xid", x.to_string()),
        Target::Name(n) => push("recovery_target_name", n.clone()),
    }
    if args.target_exclusive {
        push("recovery_target_inclusive", "false".into());
    }
    if !matches!(target, Target::None) {
        push(
            "recovery_target_action",
            match args.target_action {
                TargetAction::Pause => "pause",
                TargetAction::Promote => "promote",
                TargetAction::Shutdown => "shutdown",
            }
            .into(),
        );
    }
    if let Some(t) = &args.target_timeline {
        let t = t.trim();
        if !(t == "current" || t == "latest" || t.parse::<u32>().map(|n| n > 0).unwrap_or(false)) {
            return Err(Error::Config(format!(
                "--target-timeline '{t}' is not current, latest or a timeline number"
            )));
        }
        if signal.is_none() {
            return Err(Error::Config(
                "--target-timeline needs a type that recovers from the archive".into(),
            ));
        }
        push("recovery_target_timeline", t.to_string());
    }
    for o in &args.recovery_option {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| Error::Config(format!("--recovery-option '{o}' is not KEY=VALUE")))?;
        let k = k.trim();
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(Error::Config(format!(
                "--recovery-option '{o}': '{k}' is not a setting name"
            )));
        }
        kv.retain(|(name, _)| name != k);
        kv.push((k.to_string(), v.to_string()));
    }
    Ok(RecoveryPlan {
        lines: kv
            .into_iter()
            .map(|(k, v)| format!("{k} = {}", q(&v)))
            .collect(),
        signal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_backup_replays_its_own_wal() {
        let mut b: crate::repo::BackupSummary = serde_json::from_value(serde_json::json!({
            "format": 2, "label": "L", "type": "full", "stanza": "s",
            "system_identifier": "1", "pg_version": "15", "pg_version_num": 150000,
            "catalog_version": 1, "start_time": "", "stop_time": "",
            "start_lsn": "0/4000028", "stop_lsn": "0/5000000", "timeline": 1,
            "wal_segment_size": 16777216, "block_size": 8192, "data_checksums": true,
            "compression": {"type": "zstd", "level": 1},
            "backup_label": "START WAL LOCATION: 0/4000028\nBACKUP FROM: standby\n",
            "tablespace_map": null, "tablespaces": [], "wal_segments": [],
            "dirs": 0, "files": 0, "size": 0, "stored_size": 0,
            "manifest": {"object": "m", "stored_size": 0, "xxh3": "x"}
        }))
        .unwrap();
        assert!(is_standby_backup(&b));
        b.end.stop.stop_lsn = Lsn(0x5000060);
        assert!(is_standby_backup(&b));
        b.end.stop.backup_label = "BACKUP FROM: primary\n".into();
        assert!(!is_standby_backup(&b));
        let mut plan = RecoveryPlan {
            lines: vec![
                "restore_command = 'pgjet archive-get %f %p'".into(),
                "recovery_target = 'immediate'".into(),
                "recovery_target_action = 'promote'".into(),
            ],
            signal: Some("recovery.signal"),
        };
        plan.replay_own_wal_only();
        assert_eq!(plan.lines, vec!["restore_command = 'false'".to_string()]);
    }

    #[test]
    fn target_times_need_a_zone() {
        let want = DateTime::parse_from_rfc3339("2026-11-22T14:15:02Z")
            .unwrap()
            .with_timezone(&Utc);
        for ok in [
            "2026-11-22 14:15:02+00",
            "2026-11-22 14:15:02 UTC",
            "2026-11-22T14:15:02Z",
            "2026-11-22 16:15:02+02:00",
            "2026-11-22 16:15:02+02",
            "2026-11-22 12:15:02-02",
        ] {
            assert_eq!(parse_target_time(ok).unwrap(), want, "{ok}");
        }
        let frac = parse_target_time("2026-11-22 14:15:02.250+00").unwrap();
        assert_eq!(frac.timestamp_subsec_millis(), 250);
        for bad in [
            "2026-11-22 14:15:02",
            "yesterday",
            "",
            "2026-13-01 00:00:00+00",
        ] {
            assert!(parse_target_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn restore_command_carries_repository_flags_but_never_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgjet.conf");
        std::fs::write(
            &f,
            "[global]\nrepo1-s3-key=AKEY\nrepo1-s3-key-secret=ASECRET\n",
        )
        .unwrap();
        let s = crate::options::Settings::from_flags(&[
            ("config", f.display().to_string()),
            ("stanza", "main".into()),
            ("repo-type", "s3".into()),
            ("repo-path", "/pg jet%".into()),
            ("repo-s3-bucket", "bench".into()),
            ("repo-s3-endpoint", "s3.example.net".into()),
            ("repo-s3-region", "eu-west-1".into()),
        ])
        .unwrap();
        let c = restore_command(&s.archive_config(), "main");
        for w in [
            format!("--config={}", f.display()),
            "--stanza=main".into(),
            "--repo-type=s3".into(),
            "--repo-s3-bucket=bench".into(),
            "--repo-s3-endpoint=s3.example.net".into(),
            "--repo-s3-region=eu-west-1".into(),
            "'--repo-path=/pg jet%%'".into(),
        ] {
            assert!(c.contains(&w), "{w} missing from {c}");
        }
        assert_eq!(c.matches("--repo-path").count(), 1, "{c}");
        assert!(!c.contains("AKEY") && !c.contains("ASECRET"), "{c}");
        assert!(c.ends_with("archive-get %f \"%p\""), "{c}");
    }

    #[test]
    fn environment_warning_names_what_restore_command_cannot_carry() {
        let env = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            environment_warning(env(&[
                "HOME",
                "PGJET_REPO_S3_BUCKET",
                "PGJET_REPO",
                "PGJET_STANZA"
            ])),
            None
        );
        let w = environment_warning(env(&[
            "PGJET_REPO1_S3_KEY_SECRET",
            "PGJET_REPO_TYPE",
            "PGJET_REPO2_PATH",
        ]))
        .unwrap();
        assert!(
            w.contains("PGJET_REPO1_S3_KEY_SECRET, PGJET_REPO2_PATH")
                && !w.contains("PGJET_REPO_TYPE"),
            "{w}"
        );
        assert!(w.contains("config file"), "{w}");
    }

    /// The restore options `flags` give (`--name value` pairs, a lone `--name` a switch),
    /// resolved as the command line's would be, with no environment and no config file.
    fn restore_args(flags: &[&str]) -> RestoreOptions {
        use crate::options::resolve::{resolve_invocation, CliValues, NoEnv, Parsed};
        use crate::options::table::{self, Cmd, Kind};
        let mut values = CliValues::new();
        let mut it = flags.iter();
        while let Some(flag) = it.next() {
            let name = flag.trim_start_matches("--");
            let value = match table::find(name, Some(Cmd::Restore)) {
                Some(d) if d.kind == Kind::Switch => "true".to_string(),
                _ => it.next().expect("a value").to_string(),
            };
            values.entry(name.to_string()).or_default().push(value);
        }
        let parsed = Parsed {
            cmd: Cmd::Restore,
            values,
            args: Vec::new(),
        };
        match resolve_invocation(parsed, &NoEnv, &mut Vec::new())
            .unwrap()
            .command
        {
            crate::options::Command::Restore(a) => a,
            _ => unreachable!("resolved a restore"),
        }
    }

    #[test]
    fn targets_and_settings_are_checked_before_anything_is_written() {
        for (flags, message) in [
            (&["--type", "time"][..], "needs --target"),
            (&["--target", "0/1"][..], "only for --type time"),
            (&["--type", "lsn", "--target", "zz"][..], "is not an LSN"),
            (
                &["--type", "xid", "--target", "x1"][..],
                "not a transaction ID",
            ),
            (
                &["--type", "name", "--target", "rp", "--target-exclusive"][..],
                "only for --type time, lsn or xid",
            ),
            (
                &["--type", "time", "--target", "2026-11-22 14:15:02"][..],
                "with its time zone",
            ),
        ] {
            let e = parse_target(&restore_args(flags)).unwrap_err().to_string();
            assert!(e.contains(message), "{flags:?}: {e}");
        }
        let t = Target::None;
        for (flags, message) in [
            (&["--target-timeline", "next"][..], "is not current, latest"),
            (
                &["--type", "none", "--target-timeline", "2"][..],
                "needs a type that recovers",
            ),
            (&["--recovery-option", "novalue"][..], "is not KEY=VALUE"),
            (&["--recovery-option", "a b=1"][..], "is not a setting name"),
        ] {
            let e = plan(&restore_args(flags), &t, "cmd")
                .unwrap_err()
                .to_string();
            assert!(e.contains(message), "{flags:?}: {e}");
        }
        let p = plan(
            &restore_args(&["--recovery-option", "restore_command=x"]),
            &t,
            "cmd",
        )
        .unwrap();
        assert_eq!(p.lines, vec!["restore_command = 'x'".to_string()]);
        assert_eq!(p.signal, Some("recovery.signal"));
    }

    #[test]
    fn shell_words_are_quoted_when_needed() {
        assert_eq!(
            shell_word("--repo-path=/var/lib/pgjet"),
            "--repo-path=/var/lib/pgjet"
        );
        assert_eq!(shell_word("/a b/it's"), "'/a b/it'\\''s'");
    }
}
