//! WAL summaries (PostgreSQL 17+, `summarize_wal = on`): which blocks of which relations WAL
//! changed between two LSNs, as the server's own incremental backup reads them, so a
//! differential or incremental backup reads no unchanged file.
//!
//! Facts from PostgreSQL (src/backend/backup/walsummaryfuncs.c, the documentation of
//! pg_walsummary): `pg_available_wal_summaries()` lists the summary files as (tli,
//! start_lsn, end_lsn), each covering WAL of one timeline from start_lsn up to end_lsn;
//! `pg_wal_summary_contents(tli, start_lsn, end_lsn)` gives, per relation fork
//! (relfilenode, reltablespace, reldatabase, relforknumber), the blocks WAL modified in that
//! range and, as a row with `is_limit_block`, its *limit block*: 0 when the fork was created
//! or truncated to nothing in the range, else the shortest length it was truncated to;
//! `pg_get_wal_summarizer_state()` says up to which LSN WAL has been summarized.
use crate::error::Result;
use crate::pg::checksum::RELSEG_SIZE;
use crate::pg::lsn::Lsn;
use crate::pg::session::Session;
use std::collections::HashMap;

/// The default tablespace's and the global tablespace's OIDs (pg_tablespace.dat).
const DEFAULTTABLESPACE_OID: u32 = 1663;
const GLOBALTABLESPACE_OID: u32 = 1664;

/// How long a backup waits for the summarizer to reach its start LSN.
const WAIT_SECONDS: u64 = 60;

/// The changed blocks of main-fork segments, by segment path (as the manifest names files).
#[derive(Debug, Default)]
pub struct SummarizedChanges {
    /// Per segment file: the blocks changed (numbers within the segment).
    segments: HashMap<String, Vec<u32>>,
    /// Per relation (the path of its first segment): the smallest limit block, a block
    /// number in the whole relation from which on blocks may hold anything WAL did not
    /// describe (the fork was created, or truncated and extended again).
    limits: HashMap<String, u64>,
    /// (tablespace, database) pairs created or dropped in the range: every relation there
    /// has limit block 0.
    databases: std::collections::HashSet<(u32, u32)>,
    /// Changed blocks listed in all.
    pub blocks: u64,
}

impl SummarizedChanges {
    /// The blocks of the segment `path` (its first `nblocks`) that may differ from a backup
    /// taken at the summaries' start: the changed ones and every one from the limit on.
    pub fn blocks_of(&self, path: &str, nblocks: u64) -> Vec<u32> {
        let n = u32::try_from(nblocks).unwrap_or(u32::MAX);
        if database_of_path(path).is_some_and(|d| self.databases.contains(&d)) {
            return (0..n).collect();
        }
        let mut v: Vec<u32> = self
            .segments
            .get(path)
            .map(|c| c.iter().copied().filter(|b| *b < n).collect())
            .unwrap_or_default();
        let (base, seg) = match path.rsplit_once('.') {
            Some((b, s)) if s.bytes().all(|c| c.is_ascii_digit()) => {
                (b, s.parse::<u64>().unwrap_or(0))
            }
            _ => (path, 0),
        };
        if let Some(limit) = self.limits.get(base) {
            let first = limit.saturating_sub(seg * u64::from(RELSEG_SIZE));
            if first < u64::from(n) {
                v.extend(first as u32..n);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

impl SummarizedChanges {
    /// Block `block` of the main fork of `rel` (tablespace, database, relfilenumber) changed.
    pub fn add_block(&mut self, rel: (u32, u32, u32), block: u32, tablespace_dir: &str) {
        let (path, within) = segment_of(rel.0, rel.1, rel.2, u64::from(block), tablespace_dir);
        self.segments.entry(path).or_default().push(within);
        self.blocks += 1;
    }

    /// The main fork of `rel` was created (`limit` 0) or truncated to `limit` blocks: from
    /// there on its blocks may hold anything.
    pub fn add_limit(&mut self, rel: (u32, u32, u32), limit: u32, tablespace_dir: &str) {
        let (first, _) = segment_of(rel.0, rel.1, rel.2, 0, tablespace_dir);
        let l = self.limits.entry(first).or_insert(u64::from(limit));
        *l = (*l).min(u64::from(limit));
    }

    /// The database `db` in tablespace `spc` was created or dropped: all of it may differ.
    pub fn add_database(&mut self, spc: u32, db: u32) {
        self.databases.insert((spc, db));
    }
}

/// (tablespace, database) of a relation file's path as the manifest names it.
fn database_of_path(path: &str) -> Option<(u32, u32)> {
    let mut parts = path.split('/');
    match parts.next()? {
        "global" => Some((GLOBALTABLESPACE_OID, 0)),
        "base" => Some((DEFAULTTABLESPACE_OID, parts.next()?.parse().ok()?)),
        "pg_tblspc" => {
            let spc = parts.next()?.parse().ok()?;
            let _version_dir = parts.next()?;
            Some((spc, parts.next()?.parse().ok()?))
        }
        _ => None,
    }
}

/// The segment path of block `block` of a main fork, and the block's number in it.
fn segment_of(spc: u32, db: u32, rel: u32, block: u64, tablespace_dir: &str) -> (String, u32) {
    let seg = block / u64::from(RELSEG_SIZE);
    let within = (block % u64::from(RELSEG_SIZE)) as u32;
    let base = match spc {
        GLOBALTABLESPACE_OID => format!("global/{rel}"),
        DEFAULTTABLESPACE_OID => format!("base/{db}/{rel}"),
        _ => format!("pg_tblspc/{spc}/{tablespace_dir}/{db}/{rel}"),
    };
    let path = if seg == 0 {
        base
    } else {
        format!("{base}.{seg}")
    };
    (path, within)
}

/// Why a server of `version_num` (server_version_num) has no WAL summaries: PostgreSQL
/// before 17, which has no WAL summarizer (src/backend/postmaster/walsummarizer.c is new in
/// 17). None from 17 on. Checked before a connection is opened only to ask for them.
pub fn unavailable(version_num: u32) -> Option<String> {
    (version_num < 170000).then(|| "WAL summaries need PostgreSQL 17 or later".to_string())
}

/// The main-fork changes WAL made on timeline `tli` from `from` (a reference backup's start
/// LSN) to `to` (this backup's start), read from the server's WAL summaries after waiting
/// (up to a minute) for the summarizer to reach `to`. `Ok(Err(reason))` when summaries
/// cannot tell (PostgreSQL before 17, `summarize_wal` off, a gap in the summaries, a
/// segment size other than 1 GiB): the backup then reads every page and compares LSNs.
///
/// Errors: a query that fails for another reason.
pub fn summarized_changes(
    sess: &Session,
    version_num: u32,
    tli: u32,
    from: Lsn,
    to: Lsn,
    tablespace_dir: &str,
) -> Result<std::result::Result<SummarizedChanges, String>> {
    summarized_changes_along(sess, version_num, &[(tli, from, to)], tablespace_dir)
}

/// [`summarized_changes`] along a path of timelines: `path` holds (timeline, from, to)
/// parts, oldest first, each ending where the next timeline branched off (a timeline's
/// summaries end at its switch point, `pg_available_wal_summaries` lists each with its
/// timeline); the summarizer must have reached the last part's end. `Ok(Err(reason))` as
/// there, also when a part is not covered.
///
/// Errors: a query that fails for another reason.
pub fn summarized_changes_along(
    sess: &Session,
    version_num: u32,
    path: &[(u32, Lsn, Lsn)],
    tablespace_dir: &str,
) -> Result<std::result::Result<SummarizedChanges, String>> {
    if let Some(why) = unavailable(version_num) {
        return Ok(Err(why));
    }
    let Some(&(tli, _, to)) = path.last() else {
        return Ok(Err("no WAL to summarize".into()));
    };
    let row = sess.query_row(
        "read summarize_wal",
        "SELECT current_setting('summarize_wal'), current_setting('segment_size')",
    )?;
    let setting = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    if setting(0) != "on" {
        return Ok(Err("summarize_wal is off".into()));
    }
    if setting(1) != "1GB" {
        return Ok(Err(format!("the relation segment size is {}", setting(1))));
    }
    // The summarizer must have reached this backup's start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(WAIT_SECONDS);
    // It is usually a few milliseconds behind the checkpoint that started the backup: look
    // again after 5 ms, doubling up to 200 ms (a fixed 200 ms cost every incremental a
    // fifth of its time).
    let mut pause = crate::io::pace::Backoff::new(std::time::Duration::from_millis(200));
    loop {
        let r = sess.query_row(
            "read the WAL summarizer's state",
            "SELECT summarized_tli::text, summarized_lsn::text FROM pg_get_wal_summarizer_state()",
        )?;
        let done: Option<Lsn> = r.get(1).cloned().flatten().and_then(|l| l.parse().ok());
        let done_tli: Option<u32> = r.first().cloned().flatten().and_then(|t| t.parse().ok());
        if done_tli == Some(tli) && done.is_some_and(|l| l >= to) || done_tli > Some(tli) {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Ok(Err(format!(
                "the WAL summarizer has not reached {to} after {WAIT_SECONDS} s (it is at {})",
                done.map(|l| l.to_string())
                    .unwrap_or_else(|| "nothing".into())
            )));
        }
        pause.sleep();
    }
    let mut out = SummarizedChanges::default();
    for &(tli, from, to) in path {
        if from >= to {
            continue;
        }
        if let Err(why) = add_summaries(sess, tli, from, to, tablespace_dir, &mut out)? {
            return Ok(Err(why));
        }
    }
    Ok(Ok(out))
}

/// Adds to `out` what the summary files of timeline `tli` that together cover [from, to)
/// list; `Ok(Err(reason))` when they do not cover it.
fn add_summaries(
    sess: &Session,
    tli: u32,
    from: Lsn,
    to: Lsn,
    tablespace_dir: &str,
    out: &mut SummarizedChanges,
) -> Result<std::result::Result<(), String>> {
    // Summary files of the timeline that together cover [from, to).
    let rows = sess.query_strings(
        "list the WAL summaries",
        &format!(
            "SELECT start_lsn::text, end_lsn::text FROM pg_available_wal_summaries() \
             WHERE tli = {tli} ORDER BY start_lsn, end_lsn DESC"
        ),
    )?;
    let mut ranges: Vec<(Lsn, Lsn)> = rows
        .iter()
        .filter_map(|r| {
            let a: Lsn = r.first()?.as_ref()?.parse().ok()?;
            let b: Lsn = r.get(1)?.as_ref()?.parse().ok()?;
            (b > from && a < to).then_some((a, b))
        })
        .collect();
    ranges.sort();
    let mut at = from;
    let mut used = Vec::new();
    for (a, b) in ranges {
        if a <= at && b > at {
            used.push((a, b));
            at = b;
        }
        if at >= to {
            break;
        }
    }
    if at < to {
        return Ok(Err(format!(
            "the WAL summaries of timeline {tli} do not cover {from} to {to} (they reach {at})"
        )));
    }
    for (a, b) in used {
        let rows = sess.query_strings(
            "read a WAL summary",
            &format!(
                "SELECT reltablespace::text, reldatabase::text, relfilenode::text, \
                 relblocknumber::text, is_limit_block::text \
                 FROM pg_wal_summary_contents({tli}, '{a}', '{b}') WHERE relforknumber = 0"
            ),
        )?;
        for r in rows {
            let num = |i: usize| -> Option<u64> { r.get(i)?.as_ref()?.parse().ok() };
            let (Some(spc), Some(db), Some(rel), Some(block)) = (num(0), num(1), num(2), num(3))
            else {
                continue;
            };
            let is_limit = r.get(4).cloned().flatten().as_deref() == Some("true");
            let r = (spc as u32, db as u32, rel as u32);
            let block = u32::try_from(block).unwrap_or(u32::MAX);
            if is_limit {
                out.add_limit(r, block, tablespace_dir);
            } else {
                out.add_block(r, block, tablespace_dir);
            }
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_limits() {
        assert_eq!(
            segment_of(1663, 5, 16384, 131072 + 7, "PG_17_1"),
            ("base/5/16384.1".to_string(), 7)
        );
        assert_eq!(
            segment_of(1664, 0, 1262, 3, "x"),
            ("global/1262".to_string(), 3)
        );
        assert_eq!(
            segment_of(16400, 5, 16401, 1, "PG_17_1").0,
            "pg_tblspc/16400/PG_17_1/5/16401"
        );
        let mut c = SummarizedChanges::default();
        c.segments.insert("base/5/16384".into(), vec![9, 2, 500]);
        c.limits.insert("base/5/16384".into(), 131072 + 4);
        assert_eq!(c.blocks_of("base/5/16384", 10), vec![2, 9]);
        assert_eq!(c.blocks_of("base/5/16384.1", 6), vec![4, 5]);
        assert_eq!(c.blocks_of("base/5/16384.2", 3), vec![0, 1, 2]);
        assert!(c.blocks_of("base/5/99", 3).is_empty());
    }
}
