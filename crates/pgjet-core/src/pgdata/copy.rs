//! A new data directory as the target of a base backup ([`DirTarget`]): directories and
//! tablespace links are made once the listing is known, every file is created sparse at its
//! size and written in place; with `delta`, an existing copy of the same cluster is
//! re-synced range by range instead.
use super::delta_target;
use super::write::DirSink;
use super::{create_files, prepare_target, TargetSync};
use crate::error::Result;
use crate::pg::checksum::BLCKSZ;
use crate::pg::conninfo::ConnTarget;
use crate::pg::datadir::Listing;
use crate::pg::exclude::is_main_fork_file;
use crate::pg::lsn::Lsn;
use crate::pg::session::{ServerInfo, Session};
use crate::pg::walscan;
use crate::pg::walsummary::SummarizedChanges;
use crate::transfer::range_delta::{plan_delta, range_units, ListedBlocks};
use crate::transfer::{
    copy_files, copy_units, BackupTarget, CopyOutcome, Progress, ReadOptions, Source, SourceFile,
};
use std::fs;
use std::path::{Path, PathBuf};

/// A new data directory as a [`BackupTarget`]: directories and tablespace links are made
/// once the listing is known, every file is created sparse at its size and written in place.
pub struct DirTarget<'a> {
    pub pg_path: &'a Path,
    pub tablespaces: &'a [(u32, String, String)],
    pub map: &'a [(String, PathBuf)],
    /// (oid, chosen location): checked before the backup starts, the tablespace
    /// directories made by `prepare`.
    pub locations: Vec<(u32, PathBuf)>,
    pub sync: Option<TargetSync>,
    /// Files written (path, mtime), to stamp their modification times at the end.
    pub written: Vec<(PathBuf, i64)>,
    /// The source's system identifier, for the marker kept while the directory is written.
    pub system_identifier: u64,
    /// Re-sync an existing copy: compare ranges and copy only what differs.
    pub delta: bool,
    /// Delta totals: bytes equal, bytes copied.
    pub same: u64,
    pub copied: u64,
    /// For a delta: where the primary's WAL summaries could list the changed blocks (read
    /// by `prepare`, once the start LSN is known).
    pub since: Option<DeltaSince<'a>>,
    /// The changes the WAL summaries list since the target's latest checkpoint, when they
    /// cover it: relation files are then neither read nor compared, only their listed
    /// blocks copied.
    pub changes: Option<SummarizedChanges>,
    /// Without them: the point before which a relation page's LSN proves the target holds
    /// it ([`DeltaSince::page_lsn_point`]); only the other pages are copied.
    pub page_lsn_since: Option<Lsn>,
    /// Without summaries, on one timeline: the changed blocks listed from the WAL between
    /// the target's redo point and the copy's start ([`crate::pg::walscan`]), as far as the
    /// target's own pg_wal holds it (read by `prepare`, before the delta clears pg_wal);
    /// the first `copy` reads the rest from the source. The page LSNs when it cannot tell.
    pub wal_scan: Option<WalScan>,
}

/// A WAL listing of a delta's changed blocks, begun on the target's own WAL
/// ([`DirTarget::wal_scan`]).
pub struct WalScan {
    pub timeline: u32,
    /// Where it started (the target's redo point) and must end (the copy's start).
    pub from: Lsn,
    pub to: Lsn,
    pub scan: walscan::Scan,
    /// Segments the target's own pg_wal gave.
    pub own_segments: u64,
}

// The target's own WAL is read when it is no larger than the data: reading it costs at most
// what reading the pages would. What the source must send is at most 1/8 of the data's
// bytes (`PGJET_DELTA_WAL_SHARE`): it crosses the link whole, where the page LSNs are read
// where the data lies (a disk several times faster than most links) and only block numbers
// cross.

/// The primary's session and facts, and where WAL replay of the target would start
/// ([`delta_target::summaries_since`]): what a delta needs to read the changed blocks from the
/// primary's WAL summaries.
pub struct DeltaSince<'a> {
    /// How to reach the primary: the summaries are read on a session of their own
    /// ([`Session::aside`]), so a query the role may not run leaves the copy's session and
    /// its slot alone.
    pub target: &'a ConnTarget,
    pub info: &'a ServerInfo,
    pub point: delta_target::TargetPoint,
    /// The target data directory (its own WAL: [`delta_target::own_wal`]).
    pub dir: &'a Path,
}

/// What the WAL summaries say for a delta: the changed blocks and the path of (timeline,
/// from, to) read, or why they cannot be used.
type Summarized = std::result::Result<(SummarizedChanges, Vec<(u32, Lsn, Lsn)>), String>;

/// The WAL from the target's redo point to a copy's start as (timeline, from, to) parts, or
/// why the target is not on the primary's history ([`delta_target::timeline_path`]).
type HistoryPath = std::result::Result<TimelinePath, String>;

/// (timeline, from, to) parts of the WAL from a target's redo point to a copy's start.
type TimelinePath = Vec<(u32, Lsn, Lsn)>;

impl DeltaSince<'_> {
    /// The blocks WAL changed from the target's redo point to `start_lsn` (this copy's
    /// start), from the primary's WAL summaries, along its timeline history when the target
    /// is on an ancestor timeline ([`delta_target::timeline_path`]). None, with the reason in the
    /// log, when they cannot tell (PostgreSQL before 17, `summarize_wal` off, summaries no
    /// longer kept from that far back, a query the role may not run) or must not be used
    /// (the target may hold WAL the primary never had): the delta then compares by hash.
    fn changes(&self, start_lsn: Lsn) -> Option<SummarizedChanges> {
        let why = match self.summarized(start_lsn) {
            Ok(Ok((c, path))) => {
                let along = match path.len() {
                    1 => String::new(),
                    _ => format!(
                        " along timelines {}",
                        path.iter()
                            .map(|p| p.0.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                tracing::info!(
                    "delta: WAL summaries from the target's redo point {} to {start_lsn}{along} list {} block changes (a block changed twice counts twice); the rest of the relation files is neither read nor compared",
                    self.point.redo,
                    c.blocks
                );
                return Some(c);
            }
            Ok(Err(why)) => why,
            Err(e) => e.with_causes(),
        };
        tracing::info!("delta: WAL summaries not used ({why})");
        None
    }

    /// Where a page's LSN tells whether the target holds the source's version of it
    /// (PostgreSQL before 17, or without summaries): the target's redo point, when it lies
    /// on the source's timeline history up to this copy's start `start_lsn`
    /// ([`delta_target::timeline_path`], the condition the summaries need too). None (with the
    /// reason in the log) otherwise: the delta then compares by hash.
    ///
    /// Why it is exact: every page on the target holds every change made before its redo
    /// point (the checkpoint flushed them), and a change after it is WAL with a later LSN.
    /// A source page whose LSN (`pd_lsn`, set by every WAL-logged change) is before that
    /// point was last changed before it, on the history both share, so the target holds
    /// that version, up to hint bits (which PostgreSQL sets again from the commit log and
    /// does not need copied). A page the target changed after its redo point was changed
    /// by WAL the source also has (the history is shared up to this copy's start), so its
    /// LSN on the source is later and it is copied. A target that may hold WAL the source
    /// never had (a former primary after a failover) fails the history test.
    ///
    /// Also returns the path of (timeline, from, to) from the redo point to `start_lsn`.
    fn page_lsn_point(&self, start_lsn: Lsn) -> Option<(Lsn, TimelinePath)> {
        if !crate::io::tuning::get().delta_page_lsn {
            tracing::info!("delta: comparing by hash (PGJET_DELTA_PAGE_LSN=0)");
            return None;
        }
        let why = match Session::aside(self.target, |sess| self.path_on(sess, start_lsn)) {
            Ok(Ok(path)) => {
                tracing::info!(
                    "delta: relation pages compared by their LSN against the target's redo point {} (a page the primary last changed before it is the target's already)",
                    self.point.redo
                );
                return Some((self.point.redo, path));
            }
            Ok(Err(why)) => why,
            Err(e) => e.with_causes(),
        };
        tracing::info!("delta: comparing by hash ({why})");
        None
    }

    /// [`DeltaSince::changes`] with the path of timelines read, or why not.
    ///
    /// Errors: the side session's connection, a query that fails.
    fn summarized(&self, start_lsn: Lsn) -> Result<Summarized> {
        if let Some(why) = crate::pg::walsummary::unavailable(self.info.version_num) {
            return Ok(Err(why));
        }
        if !crate::io::tuning::get().delta_summaries {
            return Ok(Err("PGJET_DELTA_SUMMARIES=0".into()));
        }
        Session::aside(self.target, |sess| self.summarized_on(sess, start_lsn))
    }

    /// [`DeltaSince::summarized`] on `sess`.
    fn summarized_on(&self, sess: &Session, start_lsn: Lsn) -> Result<Summarized> {
        let path = match self.path_on(sess, start_lsn)? {
            Ok(p) => p,
            Err(why) => return Ok(Err(why)),
        };
        Ok(crate::pg::walsummary::summarized_changes_along(
            sess,
            self.info.version_num,
            &path,
            &self.info.tablespace_dir(),
        )?
        .map(|c| (c, path)))
    }

    /// The WAL from the target's redo point to `start_lsn` along the primary's timeline
    /// history (read on `sess`), or why the target is not on that history.
    ///
    /// Errors: a query that fails.
    fn path_on(&self, sess: &Session, start_lsn: Lsn) -> Result<HistoryPath> {
        let row = sess.query_row(
            "read the primary's timeline",
            "SELECT timeline_id::text FROM pg_control_checkpoint()",
        )?;
        let Some(tli) = row
            .first()
            .cloned()
            .flatten()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            return Ok(Err("the primary's timeline could not be read".into()));
        };
        let history = if tli > 1 && tli != self.point.timeline {
            let name = crate::pg::lsn::history_file_name(tli);
            let r = sess.query_row(
                "read the primary's timeline history",
                &format!("SELECT convert_from(pg_read_binary_file('pg_wal/{name}'), 'UTF8')"),
            )?;
            crate::pg::lsn::parse_history(&r.first().cloned().flatten().unwrap_or_default())
        } else {
            Vec::new()
        };
        Ok(delta_target::timeline_path(
            &history,
            tli,
            &self.point,
            start_lsn,
            &delta_target::own_wal(self.dir, self.info.wal_segment_size),
        ))
    }
}

/// Begins the WAL listing of a delta's changed blocks (timeline `tli`, from the target's
/// redo point `from` to the copy's start `to`) on the target `dir`'s own pg_wal, before the
/// delta clears it. Returns the blocks when that WAL reaches `to`; else the scan to go on
/// from the source, when what is left is at most 1/`share` of `data` bytes; else nothing
/// (the page LSNs are compared). The log says which.
fn own_wal_scan(
    dir: &Path,
    info: &ServerInfo,
    (tli, from, to): (u32, Lsn, Lsn),
    data: u64,
    share: u64,
) -> (Option<SummarizedChanges>, Option<WalScan>) {
    let seg_size = info.wal_segment_size;
    if share == 0 || to.0.saturating_sub(from.0) > data {
        return (None, None);
    }
    let clock = std::time::Instant::now();
    let mut scan = walscan::Scan::new(from);
    let own = delta_target::own_segment(dir, tli, seg_size);
    let why = match scan.run(own, seg_size, to, &info.tablespace_dir()) {
        Ok(()) => {
            tracing::info!(
                "delta: the target's own WAL from its redo point {from} to {to} ({} segments, {:.1} s) lists {} block changes; only those blocks of the relation files are compared",
                scan.segments,
                clock.elapsed().as_secs_f64(),
                scan.changes.blocks
            );
            return (Some(scan.changes), None);
        }
        Err(why) => why,
    };
    let at = scan.at();
    let rest = to.0 - at.0;
    if rest > data / share {
        tracing::info!(
            "delta: the target's own WAL from its redo point {from} ends at {at} ({why}); the {} MiB from there to {to} is more than 1/{share} of the data: the page LSNs are compared",
            rest >> 20
        );
        return (None, None);
    }
    let own_segments = scan.segments;
    (
        None,
        Some(WalScan {
            timeline: tli,
            from,
            to,
            scan,
            own_segments,
        }),
    )
}

/// Ends a [`WalScan`] with the source's WAL: the blocks WAL changed from its `from` to `to`;
/// None, with the reason in the log, when the source does not serve a segment (recycled, or
/// a source that reads no WAL) or the WAL cannot tell: the page LSNs are compared then.
fn scan_wal(source: &dyn Source, info: &ServerInfo, w: WalScan) -> Option<SummarizedChanges> {
    let seg_size = info.wal_segment_size;
    let WalScan {
        timeline: tli,
        from,
        to,
        mut scan,
        own_segments,
    } = w;
    let at = scan.at();
    // Only the pages the scan reads cross the link.
    let fetch = |segno: u64| source.wal_for_scan(tli, segno, seg_size, (at, to));
    let clock = std::time::Instant::now();
    match scan.run(fetch, seg_size, to, &info.tablespace_dir()) {
        Ok(()) => {
            tracing::info!(
                "delta: the WAL from the target's redo point {from} to {to} ({own_segments} segments from the target's own pg_wal up to {at}, {} from the primary's, {:.1} s) lists {} block changes; only those blocks of the relation files are compared",
                scan.segments - own_segments,
                clock.elapsed().as_secs_f64(),
                scan.changes.blocks
            );
            Some(scan.changes)
        }
        Err(why) => {
            tracing::info!(
                "delta: the WAL from {from} to {to} cannot list the changed blocks (the target's own pg_wal ends at {at}; from the primary's: {why}): the page LSNs are compared"
            );
            None
        }
    }
}

impl BackupTarget for DirTarget<'_> {
    fn prepare(&mut self, listing: &Listing, start_lsn: Lsn) -> Result<()> {
        if self.delta {
            if let Some(since) = &self.since {
                self.changes = since.changes(start_lsn);
                if self.changes.is_none() {
                    if let Some((point, path)) = since.page_lsn_point(start_lsn) {
                        self.page_lsn_since = Some(point);
                        if let [part] = path[..] {
                            let total: u64 = listing.files.iter().map(|f| f.size).sum();
                            let share = crate::io::tuning::get().delta_wal_share;
                            (self.changes, self.wal_scan) =
                                own_wal_scan(since.dir, since.info, part, total, share);
                        }
                    }
                }
            }
            let removed = delta_target::begin_delta(
                self.pg_path,
                self.system_identifier,
                &self.locations,
                listing,
            )?;
            tracing::info!(
                "delta: removed {removed} file(s) or directories the primary does not have"
            );
        } else {
            self.locations = prepare_target(
                self.pg_path,
                self.system_identifier,
                self.tablespaces,
                self.map,
                &listing.dirs,
            )?;
        }
        self.sync = Some(TargetSync::open(self.pg_path, &self.locations)?);
        Ok(())
    }

    fn copy(
        &mut self,
        source: &dyn Source,
        files: &[SourceFile],
        opts: &ReadOptions,
        progress: &dyn Progress,
    ) -> Result<CopyOutcome> {
        let specs: Vec<(&str, u64, u32)> =
            files.iter().map(|f| (&*f.path, f.size, f.mode)).collect();
        if let Some(w) = self.wal_scan.take() {
            if let Some(since) = &self.since {
                self.changes = scan_wal(source, since.info, w);
            }
        }
        let (targets, out) = if self.delta {
            let (targets, before) = delta_target::size_files(self.pg_path, &specs)?;
            let bl = BLCKSZ as u64;
            let listable = |f: &SourceFile, target_size: u64| {
                is_main_fork_file(&f.path)
                    && f.size.is_multiple_of(bl)
                    && target_size.is_multiple_of(bl)
            };
            // Without summaries: the blocks whose LSN on the source is not before the
            // target's redo point, found where the bytes are (only block numbers cross).
            let by_lsn: Option<std::collections::HashMap<&str, Vec<u32>>> = match self
                .page_lsn_since
            {
                Some(since) if self.changes.is_none() => {
                    let asked: Vec<(usize, (String, u64))> = files
                        .iter()
                        .zip(&before)
                        .enumerate()
                        .filter_map(|(i, (f, t))| {
                            let t = (*t)?;
                            listable(f, t).then(|| (i, (f.path.to_string(), f.size.min(t) / bl)))
                        })
                        .collect();
                    let q: Vec<(String, u64)> = asked.iter().map(|a| a.1.clone()).collect();
                    source.changed_blocks(&q, since)?.map(|found| {
                        asked
                            .iter()
                            .zip(found)
                            .map(|((i, _), b)| (&*files[*i].path, b))
                            .collect()
                    })
                }
                _ => None,
            };
            let summaries = self.changes.as_ref();
            let listed = (summaries.is_some() || by_lsn.is_some()).then_some(
                move |f: &SourceFile, target_size: u64| -> Option<Vec<u32>> {
                    if !listable(f, target_size) {
                        return None;
                    }
                    match (summaries, &by_lsn) {
                        (Some(c), _) => Some(c.blocks_of(&f.path, f.size.min(target_size) / bl)),
                        (None, Some(m)) => m.get(&*f.path).cloned(),
                        (None, None) => None,
                    }
                },
            );
            let plan = plan_delta(
                source,
                files,
                &targets,
                &before,
                listed.as_ref().map(|l| l as &ListedBlocks<'_>),
                opts.jobs,
                progress,
            )?;
            self.same += plan.same_bytes;
            self.copied += plan.copy_bytes;
            let units = range_units(&plan.copy);
            progress.begin("copy", plan.copy_bytes);
            let sink = DirSink {
                targets: &targets,
                overwrite: true,
            };
            let out = copy_units(source, files, &units, opts, &sink, progress)?;
            progress.finish();
            (targets, out)
        } else {
            let targets = create_files(self.pg_path, &specs)?;
            let sink = DirSink {
                targets: &targets,
                overwrite: false,
            };
            self.copied += files.iter().map(|f| f.size).sum::<u64>();
            let out = copy_files(source, files, opts, &sink, progress)?;
            (targets, out)
        };
        for ((f, t), gone) in files.iter().zip(targets).zip(&out.vanished) {
            if *gone {
                let _ = fs::remove_file(&t);
            } else {
                self.written.push((t, f.mtime));
            }
        }
        Ok(out)
    }
}
