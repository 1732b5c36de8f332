//! Before a point-in-time restore copies anything: can recovery reach the target along the
//! timeline it will follow? PostgreSQL finds out only after the copy, often after hours of
//! replay ("recovery ended before configured recovery target was reached", "requested
//! timeline is not a child of this server's history"); these checks use what the archive
//! and the repository already know.
//!
//! Facts from PostgreSQL (src/backend/access/transam/timeline.c, xlogrecovery.c): a
//! timeline's history file lists its ancestors, one line each, `parentTLI <tab> switchpoint
//! <tab> reason`, the switchpoint being the LSN where the child left that parent;
//! `recovery_target_timeline = 'latest'` (the default) is the highest timeline whose history
//! files exist one after another from the backup's timeline up (`findNewestTimeLine`), and
//! recovery refuses a timeline whose history does not contain the backup's checkpoint.
use super::recovery::Target;
use crate::pg::lsn::{parse_history, Lsn};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// The time in a history line's reason, when recovery branched "before" or "after" a time
/// (PostgreSQL writes e.g. `before 2026-11-26 02:00:00.123+00`).
fn reason_time(text: &str, parent: u32) -> Option<DateTime<Utc>> {
    let line = text.lines().find(|l| {
        l.split_whitespace()
            .next()
            .and_then(|t| t.parse::<u32>().ok())
            == Some(parent)
    })?;
    let reason = line.splitn(3, '\t').nth(2)?.trim();
    let rest = reason
        .strip_prefix("before ")
        .or_else(|| reason.strip_prefix("after "))?;
    super::recovery::parse_target_time(rest).ok()
}

/// What the checks need to know of the archive and the repository.
#[derive(Debug, Default)]
pub struct ArchiveView {
    /// Timeline history files by timeline: their text.
    pub histories: BTreeMap<u32, String>,
    /// The highest archived segment number per timeline (segments of `seg_size` bytes).
    pub last_segment: BTreeMap<u32, u64>,
    /// Complete backups: (timeline, start LSN, start time).
    pub backups: Vec<(u32, Lsn, DateTime<Utc>)>,
}

impl ArchiveView {
    /// Reads what the checks need from the archives and backups of `stanzas` (every
    /// repository restore_command reads): history files, the newest segment per timeline,
    /// and each complete backup's timeline and start. `seg_size`: the backup's segment size.
    ///
    /// Errors: the stores'.
    pub fn read(
        stanzas: &[crate::repo::Stanza],
        seg_size: u64,
    ) -> crate::error::Result<ArchiveView> {
        use crate::repo::wal::{self, WalFile, WalFileKind};
        let mut a = ArchiveView::default();
        for st in stanzas {
            if !st.exists()? {
                continue;
            }
            for tli in wal::timelines(st)? {
                for name in wal::list_timeline(st, tli)? {
                    let f = WalFile::parse(&name)?;
                    if f.kind == WalFileKind::TimelineHistory {
                        if let Some((_, bytes)) = wal::fetch(st, &f)? {
                            a.histories
                                .insert(tli, String::from_utf8_lossy(&bytes).into_owned());
                        }
                    } else if let Some((_, segno)) = f
                        .segment()
                        .and_then(|s| crate::pg::lsn::parse_wal_segment_name(s, seg_size))
                    {
                        let e = a.last_segment.entry(tli).or_insert(segno);
                        *e = (*e).max(segno);
                    }
                }
            }
            for label in st.complete()? {
                let s = st.backup(&label).summary()?;
                if let Ok(t) = DateTime::parse_from_rfc3339(&s.header.start_time) {
                    a.backups.push((
                        s.end.stop.timeline,
                        s.header.start_lsn,
                        t.with_timezone(&Utc),
                    ));
                }
            }
        }
        Ok(a)
    }
}

/// The timeline checks of a restore of backup `label` (summary `summary`) from `stanzas`,
/// before anything is copied: a time, LSN or transaction target must be reachable along
/// the timeline recovery follows ([`check`], refused with the `--target-timeline` values
/// that work); any other restore that recovers from the archive without a
/// `--target-timeline` is kept out of the timeline trap ([`timeline_trap`]: the timeline
/// that works is written into `plan`, with a warning).
///
/// Errors: [`Error::Config`] for an unreachable target; the stores'.
pub fn check_timelines(
    stanzas: &[crate::repo::Stanza],
    summary: &crate::repo::BackupSummary,
    label: &str,
    target: &Target,
    args: &crate::options::RestoreOptions,
    plan: &mut super::recovery::RecoveryPlan,
) -> crate::error::Result<()> {
    let from = FromBackup {
        timeline: summary.end.stop.timeline,
        stop_lsn: summary.end.stop.stop_lsn,
        seg_size: summary.header.wal_segment_size,
    };
    if matches!(target, Target::Time(..) | Target::Lsn(_) | Target::Xid(_)) {
        let view = ArchiveView::read(stanzas, from.seg_size)?;
        return check(&from, target, args.target_timeline.as_deref(), &view).map_err(|why| {
            crate::error::Error::Config(format!(
                "the recovery target {} cannot be reached from backup {label}: {why}",
                args.target.as_deref().unwrap_or("")
            ))
        });
    }
    if plan.signal.is_none() || plan.sets("recovery_target_timeline") {
        return Ok(());
    }
    let view = read_histories(stanzas, from.timeline)?;
    if let Some((tli, why)) = timeline_trap(&from, &view) {
        let v = if tli == from.timeline {
            "current".to_string()
        } else {
            tli.to_string()
        };
        tracing::warn!("{why}; recovery_target_timeline = '{v}' is written instead, the newest timeline backup {label} can follow (--target-timeline chooses another)");
        plan.follow_timeline(&v);
    }
    Ok(())
}

/// The backup being restored, as the checks see it.
pub struct FromBackup {
    pub timeline: u32,
    pub stop_lsn: Lsn,
    /// WAL segment size, bytes.
    pub seg_size: u64,
}

/// Refuses, with the reason and the `--target-timeline` values that work, a restore of `b`
/// to `target` following `target_timeline` (None or `latest`: the newest; `current`: the
/// backup's; a number) when recovery could not reach the target. Only time, LSN and
/// transaction targets are checked; others pass.
pub fn check(
    b: &FromBackup,
    target: &Target,
    target_timeline: Option<&str>,
    a: &ArchiveView,
) -> std::result::Result<(), String> {
    if !matches!(target, Target::Time(..) | Target::Lsn(_) | Target::Xid(_)) {
        return Ok(());
    }
    let followed = match target_timeline.map(str::trim) {
        None | Some("latest") => newest_timeline(b.timeline, a),
        Some("current") => b.timeline,
        Some(n) => n
            .parse()
            .map_err(|_| format!("--target-timeline '{n}' is not a number"))?,
    };
    let ancestors = |tli: u32| ancestors(a, tli);
    let leaves_at = |tli: u32| leaves_at(a, b.timeline, tli);
    // Timelines that would work: the backup's own, and its descendants it can follow.
    let reaches = |tli: u32| -> bool {
        match leaves_at(tli) {
            None => false,
            Some(None) => true,
            Some(Some(s)) => b.stop_lsn <= s && !target_after_branch(b, target, tli, s, a),
        }
    };
    let alternatives = || -> String {
        let mut ok: Vec<String> = std::iter::once(b.timeline)
            .chain(a.histories.keys().copied())
            .filter(|t| *t != followed && reaches(*t))
            .map(|t| {
                if t == b.timeline {
                    format!("{t} (current)")
                } else {
                    t.to_string()
                }
            })
            .collect();
        ok.dedup();
        if ok.is_empty() {
            "no archived timeline reaches it".into()
        } else {
            format!("--target-timeline {} would reach it", ok.join(" or "))
        }
    };
    let Some(leave) = leaves_at(followed) else {
        return Err(format!(
            "timeline {followed}, which recovery would follow, does not descend from the backup's timeline {} (PostgreSQL would stop with \"requested timeline is not a child of this server's history\"); {}",
            b.timeline,
            alternatives()
        ));
    };
    if let Some(s) = leave {
        if b.stop_lsn > s {
            return Err(format!(
                "timeline {followed} branched off the backup's timeline {} at {s}, before the backup ends ({}); {}",
                b.timeline,
                b.stop_lsn,
                alternatives()
            ));
        }
        if target_after_branch(b, target, followed, s, a) {
            return Err(format!(
                "timeline {followed}, which recovery would follow, branched off timeline {} at {s}, before the target: the target lies on timeline {} past the branch and would never be reached; {}",
                b.timeline,
                b.timeline,
                alternatives()
            ));
        }
    }
    // An LSN target past every archived segment on the path cannot be reached (yet).
    if let Target::Lsn(l) = target {
        let seg = l.0 / b.seg_size.max(1);
        let newest = std::iter::once(followed)
            .chain(ancestors(followed).into_iter().map(|(t, _)| t))
            .filter_map(|t| a.last_segment.get(&t).copied())
            // The backup's own WAL reaches the segment of its stop LSN.
            .chain(std::iter::once(
                b.stop_lsn.0.saturating_sub(1) / b.seg_size.max(1),
            ))
            .max();
        if newest.is_none_or(|n| n < seg) {
            return Err(format!(
                "the target LSN {l} is past the newest archived WAL on the timelines recovery follows ({}): recovery would end before it",
                match newest {
                    Some(n) => format!("segment number {n}"),
                    None => "none archived".into(),
                }
            ));
        }
    }
    Ok(())
}

/// The timeline `recovery_target_timeline = 'latest'` follows from timeline `from`: the
/// highest whose history files exist one after another from `from` up (PostgreSQL's
/// findNewestTimeLine, src/backend/access/transam/timeline.c).
fn newest_timeline(from: u32, a: &ArchiveView) -> u32 {
    let mut t = from;
    while a.histories.contains_key(&(t + 1)) {
        t += 1;
    }
    t
}

/// The ancestors timeline `tli`'s history file lists (none when it is not in `a`).
fn ancestors(a: &ArchiveView, tli: u32) -> Vec<(u32, Lsn)> {
    a.histories
        .get(&tli)
        .map(|h| parse_history(h))
        .unwrap_or_default()
}

/// Where timeline `tli` leaves timeline `from`: Some(None) when it is `from`, Some(switch
/// point) when it descends from it, None when it does not.
fn leaves_at(a: &ArchiveView, from: u32, tli: u32) -> Option<Option<Lsn>> {
    if tli == from {
        return Some(None);
    }
    ancestors(a, tli)
        .into_iter()
        .find(|(p, _)| *p == from)
        .map(|(_, s)| Some(s))
}

/// The timeline trap of a restore that follows the newest timeline to the end of the
/// archive (no time, LSN or transaction target, no `--target-timeline`): when the newest
/// timeline in the archive does not descend from backup `b`'s timeline after `b` ends
/// (typically a restored copy promoted with archive_mode on, which archived its new
/// timeline into production's repository), PostgreSQL would refuse to start ("requested
/// timeline N is not a child of this server's history"). Returns None when the newest one
/// works; else the highest timeline that does (at worst the backup's own) and why.
pub fn timeline_trap(b: &FromBackup, a: &ArchiveView) -> Option<(u32, String)> {
    let follows = |tli: u32| match leaves_at(a, b.timeline, tli) {
        None => false,
        Some(None) => true,
        Some(Some(s)) => b.stop_lsn <= s,
    };
    let latest = newest_timeline(b.timeline, a);
    if follows(latest) {
        return None;
    }
    let chosen = std::iter::once(b.timeline)
        .chain(a.histories.keys().copied())
        .filter(|t| follows(*t))
        .max()
        .unwrap_or(b.timeline);
    let how = match leaves_at(a, b.timeline, latest) {
        Some(Some(s)) => format!(
            "branched off the backup's timeline {} at {s}, before the backup ends ({})",
            b.timeline, b.stop_lsn
        ),
        _ => format!("does not descend from the backup's timeline {}", b.timeline),
    };
    Some((
        chosen,
        format!(
            "timeline {latest}, the newest in the archive, {how}: following it, PostgreSQL would stop with \"requested timeline {latest} is not a child of this server's history\" (a restored copy promoted with archive_mode on archives its new timeline into the same repository: restore test copies with --archive-mode off)"
        ),
    ))
}

/// Reads the history files of the timelines after `from` that PostgreSQL's
/// findNewestTimeLine would probe (from+1, from+2, ... while one exists in any of
/// `stanzas`): what [`timeline_trap`] needs, without listing the archive.
///
/// Errors: the stores'.
pub fn read_histories(
    stanzas: &[crate::repo::Stanza],
    from: u32,
) -> crate::error::Result<ArchiveView> {
    use crate::repo::wal::{self, WalFile};
    let mut a = ArchiveView::default();
    let mut tli = from;
    'next: loop {
        tli += 1;
        let file = WalFile::parse(&format!("{tli:08X}.history"))?;
        for st in stanzas {
            if let Some((_, bytes)) = wal::fetch(st, &file)? {
                a.histories
                    .insert(tli, String::from_utf8_lossy(&bytes).into_owned());
                continue 'next;
            }
        }
        return Ok(a);
    }
}

/// True when `target` lies on the backup's timeline after `branch`, the LSN where timeline
/// `child` left it: by LSN, when the backup's timeline has archived WAL up to the target
/// past the branch; by time, when a backup of the backup's timeline started past the branch
/// no later than the target, or the branch was made "before"/"after" a time earlier than the
/// target.
fn target_after_branch(
    b: &FromBackup,
    target: &Target,
    child: u32,
    branch: Lsn,
    a: &ArchiveView,
) -> bool {
    match target {
        Target::Lsn(l) => {
            *l > branch
                && a.last_segment
                    .get(&b.timeline)
                    .is_some_and(|n| *n >= l.0 / b.seg_size.max(1))
        }
        Target::Time(_, t) => {
            a.backups
                .iter()
                .any(|(tli, start, at)| *tli == b.timeline && *start > branch && at <= t)
                || a.histories
                    .get(&child)
                    .and_then(|h| reason_time(h, b.timeline))
                    .is_some_and(|bt| bt < *t)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// Production on timeline 1 to segment 9; a test restore promoted at 0/5000000 made
    /// timeline 2 ("before" a time), which archived segments 5 and 6.
    fn archive() -> ArchiveView {
        ArchiveView {
            histories: [(
                2,
                "1\t0/5000000\tbefore 2026-11-26 01:00:00+00\n".to_string(),
            )]
            .into_iter()
            .collect(),
            last_segment: [(1, 9), (2, 6)].into_iter().collect(),
            backups: vec![
                (1, Lsn(0x2000028), at("2026-11-26T00:00:00Z")),
                (1, Lsn(0x7000028), at("2026-11-26T02:00:00Z")),
            ],
        }
    }

    fn backup() -> FromBackup {
        FromBackup {
            timeline: 1,
            stop_lsn: Lsn(0x2000100),
            seg_size: 16 << 20,
        }
    }

    #[test]
    fn histories_parse() {
        let h = "1\t0/5000000\tno recovery target specified\n\n2\t1/A0\tat restore point x\n";
        assert_eq!(
            parse_history(h),
            vec![(1, Lsn(0x5000000)), (2, Lsn(0x1_0000_00A0))]
        );
    }

    #[test]
    fn a_target_past_the_branch_on_the_old_timeline_is_refused() {
        let (a, b) = (archive(), backup());
        // An LSN on timeline 1 past the branch (its WAL is archived to segment 9).
        let e = check(&b, &Target::Lsn(Lsn(0x8000000)), None, &a).unwrap_err();
        assert!(
            e.contains("branched off") && e.contains("1 (current)"),
            "{e}"
        );
        assert!(check(&b, &Target::Lsn(Lsn(0x8000000)), Some("current"), &a).is_ok());
        // A time after the branch's time.
        let t = Target::Time("x".into(), at("2026-11-26T01:30:00Z"));
        assert!(check(&b, &t, None, &a).is_err());
        assert!(check(&b, &t, Some("1"), &a).is_ok());
        // Before the branch: timeline 2 reaches it.
        let t = Target::Time("x".into(), at("2026-11-26T00:30:00Z"));
        assert!(check(&b, &t, None, &a).is_ok());
        assert!(check(&b, &Target::Lsn(Lsn(0x4000000)), None, &a).is_ok());
    }

    #[test]
    fn the_timeline_trap_follows_the_newest_timeline_that_descends_after_the_backup() {
        let a = archive();
        // Backup ends before timeline 2's branch: latest (2) works.
        assert_eq!(timeline_trap(&backup(), &a), None);
        // A newer backup on timeline 1 ends after it: the trap; timeline 1 is followed.
        let late = FromBackup {
            stop_lsn: Lsn(0x7000100),
            ..backup()
        };
        let (t, why) = timeline_trap(&late, &a).unwrap();
        assert_eq!(t, 1);
        assert!(
            why.contains("not a child") && why.contains("--archive-mode off"),
            "{why}"
        );
        // A later, proper failover to timeline 3 (from 1, after the backup): 3 is the newest
        // and works.
        let mut a3 = archive();
        a3.histories
            .insert(3, "1\t0/9000000\tno recovery target specified\n".into());
        assert_eq!(timeline_trap(&late, &a3), None);
        // Timeline 3 descending from 2 (the bad branch): 1 is followed.
        a3.histories
            .insert(3, "1\t0/5000000\tx\n2\t0/9000000\ty\n".into());
        assert_eq!(timeline_trap(&late, &a3).map(|(t, _)| t), Some(1));
    }

    #[test]
    fn unreachable_timelines_and_lsns_are_refused() {
        let (a, b) = (archive(), backup());
        // Timeline 3 does not exist: no history, not a descendant.
        let e = check(&b, &Target::Lsn(Lsn(0x3000000)), Some("3"), &a).unwrap_err();
        assert!(e.contains("does not descend"), "{e}");
        // Past the newest archived segment of timeline 1.
        let e = check(&b, &Target::Lsn(Lsn(0x20000000)), Some("current"), &a).unwrap_err();
        assert!(e.contains("past the newest archived WAL"), "{e}");
        // A backup that ends after the branch cannot follow timeline 2.
        let late = FromBackup {
            stop_lsn: Lsn(0x7000100),
            ..backup()
        };
        let e = check(&late, &Target::Lsn(Lsn(0x8000000)), Some("2"), &a).unwrap_err();
        assert!(e.contains("before the backup ends"), "{e}");
        // Other targets are not checked.
        assert!(check(&b, &Target::Immediate, Some("3"), &a).is_ok());
    }
}
