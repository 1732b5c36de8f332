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
    if policy.full.is_none() && policy.archive.is_none() {
        lines.push("neither retention-full nor retention-archive is set: every backup and all archived WAL are kept".into());
        return Ok(lines);
    }
    let (expired, kept) = backups.split_at(keep_from(policy, &backups));
    for b in expired {
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
    expire_wal(policy, st, kept, seg_size, verb, &mut lines)?;
    Ok(lines)
}

/// "done" or "would", as a dry run says it.
#[derive(Clone, Copy)]
struct Verb(bool);

impl Verb {
    fn say(self, done: &str, would: &str) -> String {
        if self.0 { would } else { done }.to_string()
    }
}

/// How many of `backups` (oldest first) expire: the ones before the index returned.
fn keep_from(policy: &Retention, backups: &[BackupSummary]) -> usize {
    match (policy.full, policy.full_type) {
        (None, _) => 0,
        (Some(n), RetentionFullType::Count) => backups.len().saturating_sub(n as usize),
        (Some(days), RetentionFullType::Time) => {
            let cutoff = chrono::Utc::now() - chrono::Duration::days(i64::from(days));
            let recent = backups
                .iter()
                .position(|b| {
                    chrono::DateTime::parse_from_rfc3339(&b.end.stop.stop_time)
                        .map(|t| t >= cutoff)
                        .unwrap_or(true)
                })
                .unwrap_or(backups.len());
            // The newest backup older than the window stays: recovery into the window's
            // first moments starts from it.
            recent.saturating_sub(1)
        }
    }
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
