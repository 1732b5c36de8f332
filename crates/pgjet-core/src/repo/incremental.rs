//! Differential and incremental backups: what a range of a file stores when an older backup
//! (the *reference*) already holds most of it.
//!
//! The reference's manifest is read into memory by path ([`Reference::load`]), its pieces
//! resolved to the backup that stores each frame. Each range the copy reads is then planned
//! ([`Reference::plan`]):
//!
//! - a segment of a relation's main fork is compared block by block: an 8 KiB block changed
//!   when its page LSN (`pd_lsn`) is at or after the reference's start LSN, when it is all
//!   zeros, or when it lies past the reference's copy of the file; the changed blocks are
//!   stored together in one frame and the others become slices of the reference's frames;
//! - every other file (the free space map, the visibility map, SLRUs, configuration) is
//!   compared by range: a range whose XXH3-128 and bounds equal the reference's piece is
//!   that piece, any other is stored whole.
//!
//! Why the page LSN is exact (docs/repository-format.md, "Differential and incremental
//! backups"): every change of a relation page that WAL describes sets the page's LSN to
//! the record's end (PostgreSQL src/include/storage/bufpage.h, `PageSetLSN`); the
//! reference's start LSN is the redo point of its checkpoint, so a page whose LSN is older
//! had its last logged change before the reference began copying, and the reference's copy
//! of it is that page, repaired if torn by replaying the reference's own WAL (the changes
//! that tore it are at or after its start LSN, so the page counts as changed here). Changes
//! WAL does not describe are hint bits (harmless to lose) and the free space map (compared by
//! hash instead). A file not in the reference is stored whole.
//!
//! One change copies pages without giving them new LSNs: `CREATE DATABASE ... STRATEGY
//! FILE_COPY` (the only strategy before PostgreSQL 15) copies the template's files as they
//! are. A new database has a new directory, stored whole; but once the OID counter wraps, a
//! database dropped since the reference may come back under the same OID with old page LSNs.
//! So a database's blocks come from the reference only when its pg_database row is the same
//! one (OID and xmin) in the reference and now.
use super::{Backup, FileEntry, FrameSlice, Piece};
use crate::error::{Error, Result};
use crate::pg::checksum::{page_is_zero, page_lsn, BLCKSZ};
use crate::pg::lsn::Lsn;
use std::collections::HashMap;

/// A stored range changes to a whole new frame once more than this share of its blocks
/// changed (in 1/16ths): then one frame is cheaper to restore than many slices, and the
/// chain stops growing there.
const WHOLE_ABOVE_SIXTEENTHS: usize = 8;

/// The reference of a differential or incremental backup, in memory: about the size of its
/// file lines (1.2 KiB per file).
pub struct Reference {
    /// The reference backup's label.
    pub label: String,
    /// Its start LSN: a page whose LSN is older did not change since.
    pub start_lsn: Lsn,
    /// Its timeline (a diff or incr is taken only on the same one).
    pub timeline: u32,
    /// Files by path: size and pieces (each naming the backup that holds its frame).
    files: HashMap<String, (u64, Vec<Piece>)>,
    /// The databases whose blocks may come from the reference: same OID and same xmin of
    /// the pg_database row in the reference and now (see [`super::ManifestHeader::databases`]).
    same_databases: std::collections::HashSet<u32>,
    /// Files an interrupted attempt of a resumed backup stored that were not written since
    /// well before it started (see [`super::resume::Kept::trusted`]): (size, modification
    /// time) as listed then, by path. Such a file listed now with the same size and time is
    /// not read again where the attempt stored it.
    unchanged: HashMap<String, (u64, i64)>,
}

/// How one range read by the copy is stored ([`Reference::plan`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// As a new frame of its own: the range is new or changed too much.
    Whole,
    /// By the reference's pieces, unchanged: nothing is stored.
    Same(Vec<Piece>),
    /// Its changed blocks (true) in one new frame, the others from the reference.
    Blocks(Vec<bool>),
}

impl Reference {
    /// Checks, after the copy, that the blocks compared with this reference could be: no
    /// database of `before` (the listing the copy compared against, (OID, its
    /// pg_database row's xmin)) was altered or created again under its OID by the backup's
    /// start (`after`), and the cluster stayed on this reference's timeline (`timeline`, the
    /// copy's). Changes after the start are replayed from the backup's WAL at restore.
    ///
    /// Errors ([`Error::Other`], run the backup again): a database changed, or the timeline
    /// switched (a standby promoted during the copy).
    pub fn still_holds(
        &self,
        before: &[(u32, u32)],
        after: &[(u32, u32)],
        timeline: u32,
    ) -> Result<()> {
        if let Some((oid, _)) = before
            .iter()
            .find(|(oid, x)| after.iter().any(|(o, y)| o == oid && y != x))
        {
            return Err(Error::Other(format!(
                "database {oid} was altered or created again during the backup; its blocks cannot be compared with backup {}: run the backup again",
                self.label
            )));
        }
        if timeline != self.timeline {
            return Err(Error::Other(format!(
                "the cluster switched to timeline {timeline} during the backup; its reference {} is of timeline {}: run the backup again (it will be a full)",
                self.label, self.timeline
            )));
        }
        Ok(())
    }

    /// Reads the manifest of `backup` into memory; `databases` are the cluster's now
    /// ((OID, xmin), [`crate::pg::session::Session::databases`]).
    ///
    /// Errors: as [`super::ManifestReader`].
    pub fn load(backup: &Backup, databases: &[(u32, u32)]) -> Result<Reference> {
        let reader = backup.manifest_reader()?;
        let start_lsn = reader.summary().header.start_lsn;
        let timeline = reader.summary().end.stop.timeline;
        let then = &reader.summary().header.databases;
        let same_databases = databases
            .iter()
            .filter(|d| then.contains(d))
            .map(|d| d.0)
            .collect();
        let label = backup.label().to_string();
        let mut files = HashMap::new();
        for f in reader.files() {
            let FileEntry {
                path, size, pieces, ..
            } = f?;
            let pieces = pieces
                .into_iter()
                .map(|p| Piece {
                    backup: Some(p.backup.clone().unwrap_or_else(|| label.clone())),
                    ..p
                })
                .collect();
            files.insert(path, (size, pieces));
        }
        Ok(Reference {
            label,
            start_lsn,
            timeline,
            files,
            same_databases,
            unchanged: HashMap::new(),
        })
    }

    /// The reference of a resumed backup ([`super::resume`]): the files its interrupted
    /// attempts stored (`kept`: their pieces without a backup name are the resumed backup's
    /// own frames; a file stored in part covers only its first bytes) over those of `base`
    /// (a diff's or incr's reference). `start_lsn`: the oldest attempt's; the older of it and
    /// the base's is the rule's (a page older than both is unchanged since either copy).
    /// `databases`: those (OID, xmin) every attempt recorded and the cluster has now.
    /// `label`: the resumed backup's, named when there is no base.
    pub fn resumed(
        base: Option<Reference>,
        label: &str,
        kept: impl IntoIterator<Item = super::resume::Kept>,
        start_lsn: Lsn,
        timeline: u32,
        databases: &[(u32, u32)],
    ) -> Reference {
        let oids: std::collections::HashSet<u32> = databases.iter().map(|d| d.0).collect();
        let (label, start_lsn, mut files, same_databases) = match base {
            Some(b) => (
                b.label,
                b.start_lsn.min(start_lsn),
                b.files,
                b.same_databases.intersection(&oids).copied().collect(),
            ),
            None => (label.to_string(), start_lsn, HashMap::new(), oids),
        };
        let mut unchanged = HashMap::new();
        for k in kept {
            let f = k.entry;
            if k.trusted {
                unchanged.insert(f.path.clone(), (f.size, f.mtime));
            }
            files.insert(f.path, (k.covered, f.pieces));
        }
        Reference {
            label,
            start_lsn,
            timeline,
            files,
            same_databases,
            unchanged,
        }
    }

    /// For a file an interrupted attempt stored and that is listed now with the size and
    /// modification time it had then, long before that attempt ([`Reference::resumed`]):
    /// the bytes stored from its start, which need not be read again.
    pub fn unchanged_prefix(&self, f: &crate::transfer::SourceFile) -> Option<u64> {
        if f.path.as_ref() == "global/pg_control" {
            return None;
        }
        let listed = self.unchanged.get(&*f.path)?;
        (*listed == (f.size, f.mtime)).then(|| self.files.get(&*f.path).map_or(0, |x| x.0))
    }

    /// Number of files the reference holds.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when the reference holds no file.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// How to store `data`, the range at `offset` of the file `path` as read now, whose
    /// all-zero 8 KiB pages are `zero_pages` and whose XXH3-128 is `xxh3`.
    pub fn plan(
        &self,
        path: &str,
        offset: u64,
        data: &[u8],
        zero_pages: &[[u32; 2]],
        xxh3: &str,
    ) -> Plan {
        // pg_control is restored on its own, last, from this backup's own object.
        if path == "global/pg_control" {
            return Plan::Whole;
        }
        let Some((ref_size, pieces)) = self.files.get(path) else {
            return Plan::Whole;
        };
        let len = data.len() as u64;
        if !crate::pg::exclude::is_main_fork_file(path) {
            // By range: one of the reference's whole pieces with the same bounds and bytes.
            return match pieces.iter().find(|p| p.logical_offset == offset) {
                Some(p)
                    if p.logical_size == len
                        && p.frame.is_none()
                        && p.xxh3.as_deref() == Some(xxh3) =>
                {
                    Plan::Same(vec![p.clone()])
                }
                _ => Plan::Whole,
            };
        }
        // A database created again under the same OID since (by file copy, its pages
        // keep the template's LSNs): nothing of it comes from the reference.
        if crate::pg::exclude::database_of(path).is_some_and(|d| !self.same_databases.contains(&d))
        {
            return Plan::Whole;
        }
        let changed = changed_blocks(data, offset, zero_pages, *ref_size, self.start_lsn);
        let n = changed.iter().filter(|c| **c).count();
        if n == 0 {
            return Plan::Same(reference_pieces(pieces, offset, offset + len));
        }
        if n * 16 > changed.len() * WHOLE_ABOVE_SIXTEENTHS {
            return Plan::Whole;
        }
        Plan::Blocks(changed)
    }

    /// The reference's pieces of the file `path` (resolved), or none.
    pub fn pieces(&self, path: &str) -> &[Piece] {
        self.files.get(path).map_or(&[], |(_, p)| p.as_slice())
    }
}

/// What a differential or incremental copy reads ([`Reference::read_plan`]).
pub struct ReadPlan {
    /// Per file of the listing: the (offset, length) ranges to read, None for all of it.
    pub ranges: Vec<Option<Vec<(u64, u64)>>>,
    /// The pieces of the ranges not read: (file index, the reference's pieces of one gap).
    pub seeds: Vec<(usize, Vec<Piece>)>,
    /// Bytes not read.
    pub skipped: u64,
    /// Blocks looked at on the source, and blocks found changed there.
    pub blocks: (u64, u64),
}

/// Which blocks of each (path, blocks to look at) may have changed, per file; None when
/// the one asked cannot tell ([`Reference::read_plan`]).
pub type BlockLookup<'a> = dyn Fn(&[(String, u64)]) -> Result<Option<Vec<Vec<u32>>>> + 'a;

impl Reference {
    /// Asks `lookup` which blocks of the main-fork segments the reference holds may have
    /// changed (given (path, blocks to look at) per file, it answers the block numbers per
    /// file: [`crate::transfer::Source::changed_blocks`] by page LSN, or the WAL
    /// summaries), and plans to read only those, the blocks past the reference's copy of
    /// each file, and every other file whole. None when the lookup cannot tell (then every
    /// byte is read and the sink compares them) or no file qualifies.
    ///
    /// Errors: the lookup's; a reference whose pieces do not cover a gap.
    pub fn read_plan(
        &self,
        files: &[crate::transfer::SourceFile],
        lookup: &BlockLookup,
    ) -> Result<Option<ReadPlan>> {
        let bl = BLCKSZ as u64;
        let mut plan = ReadPlan {
            ranges: vec![None; files.len()],
            seeds: Vec::new(),
            skipped: 0,
            blocks: (0, 0),
        };
        let mut planned = false;
        let mut asked: Vec<(usize, u64)> = Vec::new();
        for (i, f) in files.iter().enumerate() {
            // Stored by an interrupted attempt and not written since: only the rest is read.
            if let Some(c) = self.unchanged_prefix(f) {
                let c = c.min(f.size);
                if c > 0 {
                    plan.seeds
                        .push((i, covering_pieces(self.pieces(&f.path), 0, c, &f.path)?));
                    plan.skipped += c;
                }
                plan.ranges[i] = Some(if f.size > c {
                    vec![(c, f.size - c)]
                } else {
                    Vec::new()
                });
                planned = true;
                continue;
            }
            let Some((ref_size, _)) = self.files.get(&*f.path) else {
                continue;
            };
            let same_db = crate::pg::exclude::database_of(&f.path)
                .is_none_or(|d| self.same_databases.contains(&d));
            let blocks = f.size.min(*ref_size) / bl;
            if same_db
                && crate::pg::exclude::is_main_fork_file(&f.path)
                && f.size % bl == 0
                && ref_size % bl == 0
                && blocks > 0
            {
                asked.push((i, blocks));
            }
        }
        let changed = if asked.is_empty() {
            None
        } else {
            let query: Vec<(String, u64)> = asked
                .iter()
                .map(|&(i, n)| (files[i].path.to_string(), n))
                .collect();
            lookup(&query)?
        };
        let Some(changed) = changed else {
            return Ok(planned.then_some(plan));
        };
        for (&(i, n), mut c) in asked.iter().zip(changed) {
            c.sort_unstable();
            c.dedup();
            c.retain(|b| u64::from(*b) < n);
            plan.blocks.0 += n;
            plan.blocks.1 += c.len() as u64;
            let f = &files[i];
            // Runs of changed blocks, then everything past the reference's copy.
            let mut ranges: Vec<(u64, u64)> = Vec::new();
            for b in c {
                let at = u64::from(b) * bl;
                match ranges.last_mut() {
                    Some(r) if r.0 + r.1 == at => r.1 += bl,
                    _ => ranges.push((at, bl)),
                }
            }
            let tail = n * bl;
            if f.size > tail {
                match ranges.last_mut() {
                    Some(r) if r.0 + r.1 == tail => r.1 += f.size - tail,
                    _ => ranges.push((tail, f.size - tail)),
                }
            }
            // The gaps come from the reference.
            let pieces = self.pieces(&f.path);
            let mut at = 0u64;
            for &(o, l) in ranges.iter().chain(std::iter::once(&(f.size, 0))) {
                if o > at {
                    plan.seeds
                        .push((i, covering_pieces(pieces, at, o, &f.path)?));
                    plan.skipped += o - at;
                }
                at = o + l;
            }
            plan.ranges[i] = Some(ranges);
        }
        Ok(Some(plan))
    }
}

/// Per 8 KiB block of `data` (the range at `offset` of a main-fork segment): whether it
/// changed since a reference that started at `start_lsn` and held `ref_size` bytes of the
/// file. A block changed when it is shorter than 8 KiB, lies past the reference's copy,
/// is all zeros (a block extended since, or truncated and extended again: never taken from
/// the reference), or carries a page LSN of zero (never WAL-logged) or at or after
/// `start_lsn`.
pub fn changed_blocks(
    data: &[u8],
    offset: u64,
    zero_pages: &[[u32; 2]],
    ref_size: u64,
    start_lsn: Lsn,
) -> Vec<bool> {
    let zero: std::collections::HashSet<u32> = zero_pages
        .iter()
        .flat_map(|[a, n]| *a..a.saturating_add(*n))
        .collect();
    data.chunks(BLCKSZ)
        .enumerate()
        .map(|(i, block)| {
            let at = offset + (i * BLCKSZ) as u64;
            block.len() < BLCKSZ
                || at + BLCKSZ as u64 > ref_size
                || zero.contains(&(i as u32))
                || page_is_zero(block)
                || {
                    let lsn = page_lsn(block);
                    lsn == 0 || lsn >= start_lsn.0
                }
        })
        .collect()
}

/// [`reference_pieces`] of `[start, end)` of the file `path`, which must cover it whole.
///
/// Errors: the reference does not cover the range (a planning bug).
fn covering_pieces(pieces: &[Piece], start: u64, end: u64, path: &str) -> Result<Vec<Piece>> {
    let refs = reference_pieces(pieces, start, end);
    let covered: u64 = refs.iter().map(|p| p.logical_size).sum();
    if covered != end - start {
        return Err(Error::Other(format!(
            "incremental: the reference covers {covered} of the {} bytes at {start} of {path}",
            end - start
        )));
    }
    Ok(refs)
}

/// The reference's pieces that cover `[start, end)` of the file, cut to it: a piece wholly
/// inside is taken as it is, one that sticks out becomes a slice of its frame (without
/// checksums of its own: the bytes read now may differ from the stored ones in hint bits,
/// so only the frame's hash checks them).
pub fn reference_pieces(pieces: &[Piece], start: u64, end: u64) -> Vec<Piece> {
    let first = pieces.partition_point(|p| p.logical_offset + p.logical_size <= start);
    let mut out = Vec::new();
    for r in &pieces[first..] {
        let (ra, rb) = (r.logical_offset, r.logical_offset + r.logical_size);
        if ra >= end {
            break;
        }
        let (x, y) = (ra.max(start), rb.min(end));
        if (x, y) == (ra, rb) {
            out.push(r.clone());
            continue;
        }
        let frame = match &r.frame {
            Some(f) => FrameSlice {
                skip: f.skip + (x - ra),
                ..f.clone()
            },
            None => FrameSlice {
                size: r.logical_size,
                skip: x - ra,
                zero_pages: r.zero_pages.clone(),
                xxh3: r.xxh3.clone().unwrap_or_default(),
            },
        };
        out.push(Piece {
            logical_offset: x,
            logical_size: y - x,
            zero_pages: Vec::new(),
            xxh3: None,
            crc32c: None,
            frame: Some(frame),
            ..r.clone()
        });
    }
    out
}

/// The pieces of the range at `offset` (`data`, as read) of the file `path` in a
/// block-level backup: runs of
/// unchanged blocks from the reference's `pieces`, runs of changed ones as slices of the
/// new frame `new` (a whole-frame piece whose logical bytes are the changed blocks in order,
/// its `logical_offset` meaningless). A single run that is the whole frame is the frame
/// itself.
///
/// Errors: the reference does not cover a run of unchanged blocks (a planning bug).
pub fn block_pieces(
    path: &str,
    pieces: &[Piece],
    offset: u64,
    data: &[u8],
    changed: &[bool],
    new: &Piece,
) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut skip = 0u64;
    let mut i = 0;
    while i < changed.len() {
        let mut j = i;
        while j < changed.len() && changed[j] == changed[i] {
            j += 1;
        }
        let (a, b) = (i * BLCKSZ, (j * BLCKSZ).min(data.len()));
        let (start, end) = (offset + a as u64, offset + b as u64);
        if changed[i] {
            let bytes = &data[a..b];
            let len = bytes.len() as u64;
            let whole = skip == 0 && len == new.logical_size;
            out.push(Piece {
                logical_offset: start,
                logical_size: len,
                zero_pages: if whole {
                    new.zero_pages.clone()
                } else {
                    Vec::new()
                },
                xxh3: Some(crate::codec::xxh3_hex(bytes)),
                crc32c: Some(crate::codec::crc32c(bytes)),
                frame: (!whole).then(|| FrameSlice {
                    size: new.logical_size,
                    skip,
                    zero_pages: new.zero_pages.clone(),
                    xxh3: new.xxh3.clone().unwrap_or_default(),
                }),
                ..new.clone()
            });
            skip += len;
        } else {
            out.extend(covering_pieces(pieces, start, end, path)?);
        }
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(lsn: u64, fill: u8) -> Vec<u8> {
        let mut p = vec![fill; BLCKSZ];
        p[..4].copy_from_slice(&((lsn >> 32) as u32).to_le_bytes());
        p[4..8].copy_from_slice(&(lsn as u32).to_le_bytes());
        p
    }

    fn whole(object: &str, off: u64, len: u64) -> Piece {
        Piece {
            backup: Some("20260101-000000F".into()),
            object: object.into(),
            offset: 0,
            stored_size: 10,
            stored_xxh3: "s".into(),
            logical_offset: off,
            logical_size: len,
            zero_pages: vec![[1, 1]],
            xxh3: Some("h".into()),
            crc32c: Some(1),
            frame: None,
        }
    }

    #[test]
    fn blocks_change_by_page_lsn_zeros_and_length() {
        let start = Lsn(0x1_0000_0000);
        let mut data = page(0x0_9000_0000, 1); // older: unchanged
        data.extend(page(0x1_0000_0000, 2)); // at the start LSN: changed
        data.extend(vec![0u8; BLCKSZ]); // zeros: changed
        data.extend(page(5, 3)); // past the reference's length: changed
        let c = changed_blocks(&data, 0, &[], 3 * BLCKSZ as u64, start);
        assert_eq!(c, vec![false, true, true, true]);
        let c = changed_blocks(&data[..BLCKSZ], 0, &[[0, 1]], 8 * BLCKSZ as u64, start);
        assert_eq!(c, vec![true]);
    }

    #[test]
    fn plans_by_file_kind_and_database_identity() {
        let r = Reference {
            label: "20260101-000000F".into(),
            start_lsn: Lsn(0x1_0000_0000),
            timeline: 1,
            files: [
                "base/5/16384",
                "base/7/16384",
                "base/5/16384_vm",
                "global/pg_control",
            ]
            .into_iter()
            .map(|p| {
                (
                    p.to_string(),
                    (
                        2 * BLCKSZ as u64,
                        vec![whole("000001", 0, 2 * BLCKSZ as u64)],
                    ),
                )
            })
            .collect(),
            same_databases: [5].into_iter().collect(),
            unchanged: HashMap::new(),
        };
        let mut data = page(0x0_9000_0000, 1);
        data.extend(page(0x0_9000_0000, 2));
        let h = crate::codec::xxh3_hex(&data);
        // Old page LSNs in database 5: the reference's piece, nothing stored.
        assert!(matches!(
            r.plan("base/5/16384", 0, &data, &[], &h),
            Plan::Same(_)
        ));
        // Database 7 is not the same one as in the reference: whole.
        assert_eq!(r.plan("base/7/16384", 0, &data, &[], &h), Plan::Whole);
        // Not a main fork: by hash ("h" in the reference, not this).
        assert_eq!(r.plan("base/5/16384_vm", 0, &data, &[], &h), Plan::Whole);
        assert!(matches!(
            r.plan("base/5/16384_vm", 0, &data, &[], "h"),
            Plan::Same(_)
        ));
        // pg_control and files the reference lacks: whole.
        assert_eq!(r.plan("global/pg_control", 0, &data, &[], "h"), Plan::Whole);
        assert_eq!(r.plan("base/5/99999", 0, &data, &[], &h), Plan::Whole);
    }

    #[test]
    fn unchanged_runs_become_slices_of_the_reference() {
        let b = BLCKSZ as u64;
        let refs = vec![whole("000001", 0, 4 * b), whole("000002", 4 * b, 4 * b)];
        // Inside: whole pieces as they are.
        assert_eq!(reference_pieces(&refs, 0, 8 * b), refs);
        // Across the boundary: two slices.
        let s = reference_pieces(&refs, 3 * b, 5 * b);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].logical_offset, s[0].logical_size), (3 * b, b));
        let f0 = s[0].frame.as_ref().unwrap();
        assert_eq!(
            (f0.size, f0.skip, f0.zero_pages.clone()),
            (4 * b, 3 * b, vec![[1, 1]])
        );
        assert_eq!(s[1].frame.as_ref().unwrap().skip, 0);
        assert!(s[0].xxh3.is_none() && s[0].crc32c.is_none() && s[0].zero_pages.is_empty());
        // A slice of a slice keeps the frame and moves the skip.
        let again = reference_pieces(&s, 3 * b, 4 * b);
        assert_eq!(again, vec![s[0].clone()]);
    }

    #[test]
    fn changed_blocks_are_slices_of_one_new_frame() {
        let b = BLCKSZ as u64;
        let refs = vec![whole("000001", 0, 4 * b)];
        let data: Vec<u8> = (0..4).flat_map(|i| page(i, i as u8 + 1)).collect();
        let changed = [false, true, false, true];
        let new = Piece {
            backup: None,
            logical_offset: 0,
            logical_size: 2 * b,
            zero_pages: Vec::new(),
            ..whole("000009", 0, 2 * b)
        };
        let p = block_pieces("base/5/1", &refs, 0, &data, &changed, &new).unwrap();
        // (backup, object, logical offset, logical size, frame skip) of each piece
        type Layout<'a> = (Option<&'a str>, &'a str, u64, u64, Option<u64>);
        let layout: Vec<Layout> = p
            .iter()
            .map(|p| {
                (
                    p.backup.as_deref(),
                    p.object.as_str(),
                    p.logical_offset,
                    p.logical_size,
                    p.frame.as_ref().map(|f| f.skip),
                )
            })
            .collect();
        assert_eq!(
            layout,
            vec![
                (Some("20260101-000000F"), "000001", 0, b, Some(0)),
                (None, "000009", b, b, Some(0)),
                (Some("20260101-000000F"), "000001", 2 * b, b, Some(2 * b)),
                (None, "000009", 3 * b, b, Some(b)),
            ]
        );
        assert_eq!(
            p[1].xxh3,
            Some(crate::codec::xxh3_hex(&data[BLCKSZ..2 * BLCKSZ]))
        );
        // One run that is the whole new frame: the frame itself.
        let new1 = Piece {
            logical_size: 4 * b,
            ..new.clone()
        };
        let p = block_pieces("base/5/1", &refs, 0, &data, &[true; 4], &new1).unwrap();
        assert_eq!(p.len(), 1);
        assert!(p[0].frame.is_none());
    }
}
