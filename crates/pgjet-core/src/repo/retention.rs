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
        // archive-stream's tails of segments no backup needs (a segment left incomplete at
        // a timeline's end, or on a branch a failover abandoned).
        for seg in super::wal_tail::tails(st, tli)? {
            match lsn::parse_wal_segment_name(&seg, seg_size) {
                Some((_, segno)) if !needed(segno) && !verb.0 => {
                    super::wal_tail::remove_tail(st, &seg)?;
                }
                _ => {}
            }
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
    use crate::error::StorageFault;
    use crate::repo::chain::open_chain;
    use crate::repo::stanza::tests::{faulty, info, manifest, memory, D1, F1, F2, I1, I2};
    use crate::repo::wal::Gap;
    use crate::storage::fault::{Fault, Op};

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

    /// A second diff of F1's chain, after I1.
    const D2: &str = "20260101-000000F_20260104-000000D";
    const SEG: u64 = 16 << 20;

    /// Name of WAL segment `n` of timeline 1.
    fn seg(n: u64) -> String {
        lsn::wal_segment_name(1, n, SEG)
    }

    /// Writes complete backup `label` (pieces naming `refs`) whose WAL runs from LSN
    /// `start` to `stop`, stopped `days_ago` days ago.
    fn backup(st: &Stanza, label: &str, refs: &[&str], start: &str, stop: &str, days_ago: i64) {
        let mut m = manifest(label, refs);
        m.header.start_lsn = start.parse().unwrap();
        m.stop.stop_lsn = stop.parse().unwrap();
        m.stop.stop_time =
            crate::repo::rfc3339(chrono::Utc::now() - chrono::Duration::days(days_ago));
        st.backup(label).put_object("000001", b"frames").unwrap();
        st.backup(label).write_manifest(&m).unwrap();
    }

    /// Stanza `s` with F1 (WAL segments 1-2, stopped 30 days ago), D1 of F1 (segment 3,
    /// 29 days), F2 (segments 5-6, 20 days) and I2 of F2 (segment 7, 19 days); the
    /// archive holds segments 1 to 8 of timeline 1, F1's backup history file and
    /// timeline 2's history file.
    fn populate(st: &Stanza) {
        st.create(&info("s")).unwrap();
        backup(st, F1, &[], "0/1000028", "0/2000100", 30);
        backup(st, D1, &[F1], "0/3000028", "0/3000100", 29);
        backup(st, F2, &[], "0/5000028", "0/6000100", 20);
        backup(st, I2, &[F2], "0/7000028", "0/7000100", 19);
        let mut names: Vec<String> = (1..=8).map(seg).collect();
        names.push(format!("{}.00000028.backup", seg(1)));
        names.push("00000002.history".into());
        for n in names {
            let f = WalFile::parse(&n).unwrap();
            st.store().put(&f.object_name(st.name()), b"wal").unwrap();
        }
    }

    /// Records a gap of segment `n` of timeline 1.
    fn gap(st: &Stanza, n: u64) {
        wal::record_gap(
            st,
            &Gap {
                first: seg(n),
                last: seg(n),
                segments: 1,
                recorded: "2026-01-01T00:00:00Z".into(),
                reason: "test".into(),
            },
        )
        .unwrap();
    }

    /// Every archived WAL file name, timeline by timeline.
    fn archived(st: &Stanza) -> Vec<String> {
        let mut out = Vec::new();
        for tli in wal::timelines(st).unwrap() {
            out.extend(wal::list_timeline(st, tli).unwrap());
        }
        out
    }

    /// Every complete backup's chain opens: no kept backup names a removed one.
    fn chains_whole(st: &Stanza) {
        for label in st.complete().unwrap() {
            let b = st.backup(&label);
            open_chain(&b, &b.summary().unwrap()).unwrap();
        }
    }

    #[test]
    fn without_a_retention_policy_every_backup_and_all_wal_are_kept() {
        let st = Stanza::new(1, memory(), "s");
        populate(&st);
        let (labels, wal) = (st.labels().unwrap(), archived(&st));
        let lines = expire_repo(&policy(None, false, None), &st, false).unwrap();
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("none of retention-full"), "{lines:?}");
        assert_eq!(st.labels().unwrap(), labels);
        assert_eq!(archived(&st), wal);
    }

    #[test]
    fn retention_full_expires_the_older_full_with_its_chain_and_the_wal_before_the_kept_backups() {
        let st = Stanza::new(1, memory(), "s");
        populate(&st);
        gap(&st, 3);
        gap(&st, 7);
        let lines = expire_repo(&policy(Some(1), false, None), &st, false).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F2, I2]);
        assert_eq!(st.complete().unwrap(), vec![F2, I2]);
        chains_whole(&st);
        // The diff goes before the full it depends on.
        assert!(
            lines[0].starts_with(&format!("expired backup {D1} (stopped ")),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with(&format!("expired backup {F1} (stopped ")),
            "{lines:?}"
        );
        assert_eq!(
            lines[2],
            format!("kept 2 backup(s): {F2} (full), {I2} (incr)")
        );
        // The archive stays from F2's first segment on; F1's backup history file goes,
        // the timeline history file stays, as does the gap after the kept start.
        let mut left: Vec<String> = (5..=8).map(seg).collect();
        left.push("00000002.history".into());
        assert_eq!(archived(&st), left);
        let gaps: Vec<String> = wal::gaps(&st)
            .unwrap()
            .into_iter()
            .map(|g| g.first)
            .collect();
        assert_eq!(gaps, vec![seg(7)]);
        assert!(lines.contains(&format!("removed the gap record {} to {}", seg(3), seg(3))));
        assert_eq!(
            lines.last().unwrap(),
            &format!(
                "removed 5 archived WAL file(s) up to {}; the archive is continuous from {} (backup {F2})",
                seg(4),
                seg(5)
            )
        );
    }

    #[test]
    fn a_dry_run_says_what_expire_would_do_and_changes_nothing() {
        let st = Stanza::new(1, memory(), "s");
        populate(&st);
        gap(&st, 3);
        let (labels, wal) = (st.labels().unwrap(), archived(&st));
        let p = policy(Some(1), false, None);
        let dry = expire_repo(&p, &st, true).unwrap();
        assert_eq!(st.labels().unwrap(), labels);
        assert_eq!(archived(&st), wal);
        assert_eq!(wal::gaps(&st).unwrap().len(), 1);
        assert!(
            dry[0].starts_with(&format!("would expire backup {D1}")),
            "{dry:?}"
        );
        // The real run does what the dry run said, line for line.
        let done = expire_repo(&p, &st, false).unwrap();
        let said: Vec<String> = dry
            .iter()
            .map(|l| {
                l.replace("would expire", "expired")
                    .replace("would keep", "kept")
                    .replace("would remove", "removed")
            })
            .collect();
        assert_eq!(said, done);
        assert_ne!(archived(&st), wal);
    }

    #[test]
    fn retention_archive_keeps_only_their_own_wal_for_older_kept_backups() {
        let st = Stanza::new(1, memory(), "s");
        populate(&st);
        let lines = expire_repo(
            &Retention {
                archive: Some(1),
                ..policy(Some(2), false, None)
            },
            &st,
            false,
        )
        .unwrap();
        assert_eq!(st.complete().unwrap(), vec![F1, D1, F2, I2]);
        assert!(
            lines[0].starts_with("no backup expires under retention-full=2"),
            "{lines:?}"
        );
        assert!(lines[0].contains("retention-archive=1"), "{lines:?}");
        // Only I2 keeps a continuous archive (from segment 7); F1, D1 and F2 keep their
        // own segments (1-2 with F1's backup history file, 3, 5-6): segment 4 goes.
        let mut left: Vec<String> = vec![
            seg(1),
            format!("{}.00000028.backup", seg(1)),
            seg(2),
            seg(3),
        ];
        left.extend((5..=8).map(seg));
        left.push("00000002.history".into());
        assert_eq!(archived(&st), left);
        assert_eq!(
            lines.last().unwrap(),
            &format!(
                "removed 1 archived WAL file(s) up to {}; the archive is continuous from {} (backup {I2})",
                seg(4),
                seg(7)
            )
        );
    }

    #[test]
    fn retention_diff_expires_older_diffs_with_the_incrs_built_on_them() {
        let st = Stanza::new(1, memory(), "s");
        st.create(&info("s")).unwrap();
        backup(&st, F1, &[], "0/1000028", "0/1000100", 10);
        backup(&st, D1, &[F1], "0/2000028", "0/2000100", 9);
        backup(&st, I1, &[F1, D1], "0/3000028", "0/3000100", 8);
        backup(&st, D2, &[F1], "0/4000028", "0/4000100", 7);
        let lines = expire_repo(&policy(None, false, Some(1)), &st, false).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F1, D2]);
        chains_whole(&st);
        assert!(
            lines[0].starts_with(&format!("expired backup {I1}")),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with(&format!("expired backup {D1}")),
            "{lines:?}"
        );
        assert_eq!(
            lines[2],
            format!("kept 2 backup(s): {F1} (full), {D2} (diff)")
        );
    }

    #[test]
    fn retention_full_time_keeps_the_newest_full_before_the_window() {
        let st = Stanza::new(1, memory(), "s");
        populate(&st);
        let time = |days| policy(Some(days), true, None);
        // F2 stopped within 25 days, F1 is the newest full before: both stay.
        let lines = expire_repo(&time(25), &st, false).unwrap();
        assert!(
            lines[0].starts_with(
                "no backup expires under retention-full=25 with retention-full-type=time"
            ),
            "{lines:?}"
        );
        assert_eq!(st.complete().unwrap(), vec![F1, D1, F2, I2]);
        // No full within 10 days: F2 is the newest before the window, F1's chain goes.
        expire_repo(&time(10), &st, false).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F2, I2]);
        chains_whole(&st);
    }

    #[test]
    fn backups_of_different_wal_segment_sizes_are_left_alone() {
        let st = Stanza::new(1, memory(), "s");
        st.create(&info("s")).unwrap();
        backup(&st, F1, &[], "0/1000028", "0/1000100", 10);
        let mut m = manifest(F2, &[]);
        m.header.wal_segment_size = 64 << 20;
        st.backup(F2).write_manifest(&m).unwrap();
        let e = expire_repo(&policy(Some(1), false, None), &st, false).unwrap_err();
        assert!(matches!(e, Error::Repo(_)), "{e:?}");
        assert!(
            e.to_string().contains(&format!(
                "backup {F2} has WAL segments of 67108864 bytes, others of 16777216"
            )),
            "{e}"
        );
        assert_eq!(st.complete().unwrap(), vec![F1, F2]);
    }

    #[test]
    fn a_failed_removal_stops_expire_without_a_complete_backup_missing_its_reference() {
        // The full's summary cannot be deleted: its diff is already gone (newest first),
        // the full is still whole, the archive untouched.
        let (f, st) = faulty();
        populate(&st);
        let wal = archived(&st);
        f.inject(
            Op::Delete,
            "20260101-000000F/summary.json",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = expire_repo(&policy(Some(1), false, None), &st, false).unwrap_err();
        assert!(
            e.to_string()
                .contains("s/backup/20260101-000000F/summary.json"),
            "{e}"
        );
        assert_eq!(st.labels().unwrap(), vec![F1, F2, I2]);
        assert_eq!(st.complete().unwrap(), vec![F1, F2, I2]);
        chains_whole(&st);
        assert_eq!(f.calls(Op::Delete, "/archive/"), 0);
        assert_eq!(archived(&st), wal);
        // Healed, the next expire finishes the job.
        f.heal();
        expire_repo(&policy(Some(1), false, None), &st, false).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F2, I2]);
        assert_eq!(archived(&st)[0], seg(5));

        // The diff's directory cannot be removed once its summary is gone: it is left
        // incomplete (for the next backup to remove), never complete-looking.
        let (f, st) = faulty();
        populate(&st);
        f.inject(Op::Delete, D1, 2, 1, Fault::Fail(StorageFault::Transient));
        let e = expire_repo(&policy(Some(1), false, None), &st, false).unwrap_err();
        assert!(e.to_string().contains(&format!("s/backup/{D1}")), "{e}");
        assert_eq!(st.complete().unwrap(), vec![F1, F2, I2]);
        assert_eq!(st.incomplete().unwrap(), vec![D1]);
        chains_whole(&st);
        f.heal();
        expire_repo(&policy(Some(1), false, None), &st, false).unwrap();
        assert_eq!(st.complete().unwrap(), vec![F2, I2]);
        assert_eq!(st.incomplete().unwrap(), vec![D1]);
        st.remove_incomplete(None).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F2, I2]);
    }
}
