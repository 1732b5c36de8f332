//! Retention (`expire`, and every backup unless --no-expire): removes the backups past the retention policy and the archived WAL no kept
//! backup needs (pgBackRest's retention-full, retention-full-type and retention-archive).
//!
//! - retention-full (count): the newest N full backups stay. retention-full-type=time: the
//!   backups that stopped in the last N days stay, and the newest one before them, so every
//!   moment of the window can still be recovered to.
//! - retention-archive N: the newest N kept backups keep a continuous archive from their
//!   first WAL segment on (point-in-time recovery from any of them to any later moment);
//!   older kept backups keep only the segments from their start to their stop (enough to be
//!   consistent). Default: every kept backup keeps its continuous archive.
//! - Timeline history files are never removed; gap records before the retained archive go.
//!
//! A backup is removed summary first, so an interrupted expire leaves an incomplete backup
//! (which the next backup cleans up), never a complete-looking one with missing objects.
use super::wal::{self, WalFile, WalFileKind};
use super::{BackupSummary, Stanza};
use crate::error::{Error, Result};
use crate::options::{Retention, RetentionFullType};
use crate::pg::lsn;

/// The first segment number of a backup's WAL, and its last, in `seg_size` segments.
fn backup_segments(b: &BackupSummary, seg_size: u64) -> (u64, u64) {
    (
        lsn::segno_of(b.header.start_lsn, seg_size),
        lsn::prev_segno_of(b.end.stop.stop_lsn, seg_size),
    )
}

/// Applies the retention policy to one repository (the caller holds the stanza's lock).
/// Returns a line per removed backup and one for the WAL (prefixed "would" with `dry_run`).
///
/// Errors: backups with different WAL segment sizes; the stores'.
pub fn expire_repo(policy: &Retention, st: &Stanza, dry_run: bool) -> Result<Vec<String>> {
    let verb = Verb(dry_run);
    let info = st.info()?;
    let mut backups: Vec<BackupSummary> = Vec::new();
    for label in st.complete()? {
        backups.push(st.backup(&label).summary()?);
    }
    backups.sort_by(|a, b| a.header.label.cmp(&b.header.label));
    // The backups know the segment size for sure (a stanza made before the WAL archive
    // only assumes 16 MiB); names placed with a wrong size would look older than they are.
    let seg_size = backups
        .first()
        .map(|b| b.header.wal_segment_size)
        .unwrap_or(info.wal_segment_size);
    if let Some(b) = backups
        .iter()
        .find(|b| b.header.wal_segment_size != seg_size)
    {
        return Err(Error::Repo(format!(
            "backup {} has WAL segments of {} bytes, others of {seg_size}: expire leaves this stanza alone",
            b.header.label, b.header.wal_segment_size
        )));
    }
    let mut lines = Vec::new();
    if !policy.is_set() {
        lines.push("none of retention-full, retention-diff and retention-archive is set: every backup and all archived WAL are kept".into());
        return Ok(lines);
    }
    let expire = expire_flags(policy, &backups);
    let (mut expired, mut kept) = (Vec::new(), Vec::new());
    for (b, e) in backups.into_iter().zip(expire) {
        if e {
            expired.push(b);
        } else {
            kept.push(b);
        }
    }
    // Newest first: a backup goes before the older ones it depends on, so an interrupted
    // expire never leaves a complete backup whose reference is gone.
    for b in expired.iter().rev() {
        let label = &b.header.label;
        if !dry_run {
            st.backup(label).remove()?;
        }
        lines.push(format!(
            "{} backup {label} (stopped {})",
            verb.say("expired", "would expire"),
            b.end.stop.stop_time
        ));
    }
    if kept.is_empty() {
        lines.push("no backup is kept: the WAL archive is left as it is".into());
        return Ok(lines);
    }
    if expired.is_empty() {
        lines.push(format!("no backup expires under {}", describe(policy)));
    }
    lines.push(format!(
        "{} {} backup(s): {}",
        verb.say("kept", "would keep"),
        kept.len(),
        kept.iter()
            .map(|b| format!("{} ({})", b.header.label, b.header.backup_type))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    expire_wal(policy, st, &kept, seg_size, verb, &mut lines)?;
    Ok(lines)
}

/// The policy in words: `retention-full=2 (count)`, and the others set.
fn describe(policy: &Retention) -> String {
    let mut v = Vec::new();
    if let Some(n) = policy.full {
        v.push(match policy.full_type {
            RetentionFullType::Count => format!("retention-full={n} (the newest {n} full backups and those that depend on them)"),
            RetentionFullType::Time => format!("retention-full={n} with retention-full-type=time (the backups of the last {n} days and the newest full before them)"),
        });
    }
    if let Some(n) = policy.diff {
        v.push(format!("retention-diff={n}"));
    }
    if let Some(n) = policy.archive {
        v.push(format!("retention-archive={n}"));
    }
    v.join(", ")
}

/// "done" or "would", as a dry run says it.
#[derive(Clone, Copy)]
struct Verb(bool);

impl Verb {
    fn say(self, done: &str, would: &str) -> String {
        if self.0 { would } else { done }.to_string()
    }
}

/// Which of `backups` (oldest first, by label) expire:
///
/// - retention-full: every backup before the oldest kept full backup (count: the newest N
///   fulls stay; time: the fulls that stopped in the last N days stay, and the newest one
///   before them, so every moment of the window can still be recovered to); a full's diffs
///   and incrs sort between it and the next full and go with it;
/// - retention-diff: all differentials but the newest N kept ones;
/// - then every backup that depends on an expired one (its `references`), so no kept
///   backup ever names a removed one.
fn expire_flags(policy: &Retention, backups: &[BackupSummary]) -> Vec<bool> {
    let mut expire = vec![false; backups.len()];
    let of_type = |t: &str| -> Vec<usize> {
        (0..backups.len())
            .filter(|&i| backups[i].header.backup_type == t)
            .collect()
    };
    let fulls = of_type("full");
    let first_kept_full = match (policy.full, policy.full_type) {
        (None, _) => None,
        (Some(n), RetentionFullType::Count) => {
            fulls.len().checked_sub(n as usize).map(|k| fulls[k])
        }
        (Some(days), RetentionFullType::Time) => {
            let cutoff = chrono::Utc::now() - chrono::Duration::days(i64::from(days));
            let recent = fulls
                .iter()
                .position(|&i| {
                    chrono::DateTime::parse_from_rfc3339(&backups[i].end.stop.stop_time)
                        .map(|t| t >= cutoff)
                        .unwrap_or(true)
                })
                .unwrap_or(fulls.len());
            fulls.get(recent.saturating_sub(1)).copied()
        }
    };
    if let Some(k) = first_kept_full {
        expire[..k].iter_mut().for_each(|e| *e = true);
    }
    if let Some(n) = policy.diff {
        let diffs: Vec<usize> = of_type("diff")
            .into_iter()
            .filter(|&i| !expire[i])
            .collect();
        for &i in &diffs[..diffs.len().saturating_sub(n as usize)] {
            expire[i] = true;
        }
    }
    // References are older (they sort first): one pass in order closes the set.
    for i in 0..backups.len() {
        if !expire[i] {
            expire[i] = backups[i].end.references.iter().any(|r| {
                backups[..i]
                    .iter()
                    .zip(&expire)
                    .any(|(b, e)| *e && b.header.label == *r)
            });
        }
    }
    expire
}

/// Removes the archived WAL that none of the `kept` backups (oldest first, at least one)
/// needs, and the gap records before what stays; adds its lines to `lines`.
///
/// Errors: the store's.
fn expire_wal(
    policy: &Retention,
    st: &Stanza,
    kept: &[BackupSummary],
    seg_size: u64,
    verb: Verb,
    lines: &mut Vec<String>,
) -> Result<()> {
    // The archive: continuous from the oldest backup that keeps its PITR window; before
    // that, each kept backup's own range.
    let pitr_count = policy.archive.map(|n| n as usize).unwrap_or(kept.len());
    let pitr_from = kept.len().saturating_sub(pitr_count.max(1));
    // The archive is kept from the earliest start among those backups: after a
    // point-in-time recovery a newer backup (on a new timeline) may start earlier.
    let start = kept[pitr_from..]
        .iter()
        .map(|b| backup_segments(b, seg_size).0)
        .min()
        .unwrap_or(0);
    let own: Vec<(u64, u64)> = kept[..pitr_from]
        .iter()
        .map(|b| backup_segments(b, seg_size))
        .collect();
    let needed = |segno: u64| segno >= start || own.iter().any(|(a, z)| (*a..=*z).contains(&segno));
    let mut removed = 0u64;
    let mut last_removed = None;
    for tli in wal::timelines(st)? {
        for name in wal::list_timeline(st, tli)? {
            let f = WalFile::parse(&name)?;
            if f.kind == WalFileKind::TimelineHistory {
                continue;
            }
            let Some((_, segno)) = f
                .segment()
                .and_then(|seg| lsn::parse_wal_segment_name(seg, seg_size))
            else {
                continue;
            };
            if needed(segno) {
                continue;
            }
            if !verb.0 {
                wal::remove(st, &f)?;
            }
            removed += 1;
            last_removed = Some(name);
        }
    }
    for g in wal::gaps(st)? {
        let last = lsn::parse_wal_segment_name(&g.last, seg_size).map(|x| x.1);
        if last.map(|l| l < start).unwrap_or(false) {
            if !verb.0 {
                wal::remove_gap(st, &g)?;
            }
            lines.push(format!(
                "{} the gap record {} to {}",
                verb.say("removed", "would remove"),
                g.first,
                g.last
            ));
        }
    }
    let first_kept = lsn::wal_segment_name(kept[pitr_from].end.stop.timeline, start, seg_size);
    lines.push(match last_removed {
        Some(last) => format!(
            "{} {removed} archived WAL file(s) up to {last}; the archive is continuous from {first_kept} (backup {})",
            verb.say("removed", "would remove"),
            kept[pitr_from].header.label
        ),
        None => format!(
            "no archived WAL to remove; the archive is kept from {first_kept} (backup {})",
            kept[pitr_from].header.label
        ),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary of backup `label` that stopped `days_ago` days ago, depending on `refs`.
    fn summary(label: &str, days_ago: i64, refs: &[&str]) -> BackupSummary {
        let kind = match label.chars().last() {
            Some('D') => "diff",
            Some('I') => "incr",
            _ => "full",
        };
        let stop = crate::repo::rfc3339(chrono::Utc::now() - chrono::Duration::days(days_ago));
        serde_json::from_value(serde_json::json!({
            "format": 3, "label": label, "type": kind, "stanza": "s", "system_identifier": "1",
            "pg_version": "15", "pg_version_num": 150000, "catalog_version": 1,
            "start_time": "", "stop_time": stop, "start_lsn": "0/1", "stop_lsn": "0/2",
            "timeline": 1, "wal_segment_size": 16777216, "block_size": 8192,
            "data_checksums": true, "compression": {"type": "zstd", "level": 1},
            "backup_label": "", "tablespace_map": null, "tablespaces": [],
            "wal_segments": [], "dirs": 0, "files": 0, "size": 0, "stored_size": 0,
            "references": refs, "manifest": {"object": "m", "stored_size": 0, "xxh3": "x"}
        }))
        .unwrap()
    }

    fn policy(full: Option<u32>, time: bool, diff: Option<u32>) -> Retention {
        Retention {
            full,
            full_type: if time {
                RetentionFullType::Time
            } else {
                RetentionFullType::Count
            },
            diff,
            archive: None,
        }
    }

    /// The labels `expire_flags` expires.
    fn expired(p: &Retention, b: &[BackupSummary]) -> Vec<String> {
        b.iter()
            .zip(expire_flags(p, b))
            .filter(|(_, e)| *e)
            .map(|(b, _)| b.header.label.clone())
            .collect()
    }

    #[test]
    fn chains_expire_with_their_full_and_diffs_take_their_incrs() {
        let (f1, f2) = ("20260101-000000F", "20260108-000000F");
        let i1 = format!("{f1}_20260102-000000I");
        let d1 = format!("{f1}_20260103-000000D");
        let i2 = format!("{f1}_20260104-000000I");
        let d2 = format!("{f1}_20260105-000000D");
        let i3 = format!("{f2}_20260109-000000I");
        let b = vec![
            summary(f1, 30, &[]),
            summary(&i1, 29, &[f1]),
            summary(&d1, 28, &[f1]),
            summary(&i2, 27, &[f1, &d1]),
            summary(&d2, 26, &[f1]),
            summary(f2, 20, &[]),
            summary(&i3, 19, &[f2]),
        ];
        // retention-full 1: the first full and its whole chain go.
        assert_eq!(
            expired(&policy(Some(1), false, None), &b),
            vec![
                f1.to_string(),
                i1.clone(),
                d1.clone(),
                i2.clone(),
                d2.clone()
            ]
        );
        // retention-full 2 keeps everything.
        assert!(expired(&policy(Some(2), false, None), &b).is_empty());
        // retention-diff 1: the older diff goes, with the incr built on it; the incr on the
        // full alone stays.
        assert_eq!(
            expired(&policy(None, false, Some(1)), &b),
            vec![d1.clone(), i2.clone()]
        );
        // time: fulls of the last 25 days stay, and the newest one before them.
        assert!(expired(&policy(Some(25), true, None), &b).is_empty());
        assert_eq!(
            expired(&policy(Some(10), true, None), &b),
            vec![f1.to_string(), i1, d1, i2, d2]
        );
    }
}
