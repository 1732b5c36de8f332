//! Delta: which ranges of an existing data directory differ from the source, so that only
//! those cross the wire.
//!
//! Every file is cut into ranges of [`DELTA_RANGE`] bytes. For the part a target file shares
//! with its source file (up to the shorter of the two), the destination hashes its own
//! ranges (SHA-256) and the source hashes the same ranges where the bytes are
//! ([`super::SourceReader::hash_ranges`]: server-side `sha256(pg_read_binary_file(...))`
//! over libpq); ranges whose hashes differ, and everything past the target's end, are
//! copied. The comparison is by content, not by modification time or LSN, so it also finds
//! what a diverged former primary wrote after a failover.
//!
//! It runs in two levels: a range whose hashes differ is compared again block by block
//! ([`DELTA_BLOCK`], the 8 KiB page), in one more request per batch, and only the blocks that
//! differ are copied: an update that touched one row in a range moves one page, not the
//! range.
use super::{PieceSpec, Progress, Source, SourceFile, Unit, CHUNK_SIZE};
use crate::error::{Error, Result};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Size of a compared range: 32 KiB (a multiple of the 8 KiB page, so copied ranges keep
/// page checks). Measured on the network lab (1 Gbit/s, 20 ms RTT, 2 GiB cluster, 1% of
/// pgbench_accounts' pages updated; docs/libpq-source.md): the bytes on the wire were 2.6,
/// 5.6, 9.9, 16.7, 26.8 and 56% of a full copy for 8, 32, 64, 128, 256 and 1024 KiB ranges;
/// 32 KiB took 5.5 s against 23.6 s for a full copy, while smaller ranges multiply the
/// hashes the server computes and sends.
pub const DELTA_RANGE: u64 = 32 << 10;

/// Size of a block of the second level: 8 KiB, PostgreSQL's page (`BLCKSZ`,
/// [`crate::pg::checksum::BLCKSZ`]), so that a changed page is copied alone.
pub const DELTA_BLOCK: u64 = crate::pg::checksum::BLCKSZ as u64;

/// The range size in use: [`DELTA_RANGE`], or `PGJET_DELTA_RANGE_KIB` for the benchmark
/// that chooses it ([`crate::io::tuning`]).
pub fn delta_range() -> u64 {
    crate::io::tuning::get().delta_range.unwrap_or(DELTA_RANGE)
}

/// Bytes of ranges hashed per request: 64 MiB, so each connection has a few seconds of
/// server work per round trip and several connections hash at once.
const HASH_BATCH_BYTES: u64 = 64 << 20;

/// For a source file and the size its target had: the numbers of the [`DELTA_BLOCK`] blocks
/// of their common part that may differ, when something other than a comparison knows them
/// (the primary's WAL summaries); None to compare that file by hash.
pub type ListedBlocks<'a> = dyn Fn(&SourceFile, u64) -> Option<Vec<u32>> + 'a;

/// What a delta comparison found.
#[derive(Debug, Default)]
pub struct DeltaPlan {
    /// Ranges to copy, merged where adjacent, in file order.
    pub copy: Vec<PieceSpec>,
    /// Bytes compared by hash and found equal.
    pub same_bytes: u64,
    /// Bytes to copy.
    pub copy_bytes: u64,
    /// Bytes of ranges that differed, compared again block by block (the second level).
    pub reblocked_bytes: u64,
    /// Bytes whose changed blocks were listed ([`ListedBlocks`]): neither side read them.
    pub listed_bytes: u64,
}

/// Compares `files` of `source` with the existing target files `targets` (same index;
/// a target that does not exist is copied whole). `target_sizes[i]` is the size the target
/// file had before it was resized to the source size (None: it did not exist). Where
/// `listed` knows a file's changed blocks, only those are copied and nothing of the file
/// is read on either side.
///
/// Errors: a target range cannot be read, a source error.
pub fn plan_delta(
    source: &dyn Source,
    files: &[SourceFile],
    targets: &[PathBuf],
    target_sizes: &[Option<u64>],
    listed: Option<&ListedBlocks<'_>>,
    jobs: usize,
    progress: &dyn Progress,
) -> Result<DeltaPlan> {
    let range = delta_range();
    let mut compare: Vec<PieceSpec> = Vec::new();
    let mut plan = DeltaPlan::default();
    for (i, f) in files.iter().enumerate() {
        let common = target_sizes[i].unwrap_or(0).min(f.size);
        let known = match (listed, target_sizes[i]) {
            (Some(l), Some(t)) => l(f, t),
            _ => None,
        };
        if let Some(mut blocks) = known {
            blocks.sort_unstable();
            blocks.dedup();
            let mut changed = 0;
            for b in blocks {
                let off = u64::from(b) * DELTA_BLOCK;
                if off < common {
                    let len = DELTA_BLOCK.min(common - off);
                    plan.copy.push(PieceSpec::new(i, off, len)?);
                    changed += len;
                }
            }
            plan.listed_bytes += common;
            plan.same_bytes += common - changed;
        } else {
            let mut off = 0;
            while off < common {
                let len = range.min(common - off);
                compare.push(PieceSpec::new(i, off, len)?);
                off += len;
            }
        }
        // The new tail, in pieces of at most MAX_PIECE bytes.
        let mut off = common;
        while off < f.size {
            let len = super::MAX_PIECE.min(f.size - off);
            plan.copy.push(PieceSpec::new(i, off, len)?);
            off += len;
        }
    }
    // Batches of consecutive ranges for the worker threads.
    let mut batches: Vec<std::ops::Range<usize>> = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (k, p) in compare.iter().enumerate() {
        if bytes + p.bytes() > HASH_BATCH_BYTES && k > start {
            batches.push(start..k);
            start = k;
            bytes = 0;
        }
        bytes += p.bytes();
    }
    if start < compare.len() {
        batches.push(start..compare.len());
    }
    let total: u64 = compare.iter().map(PieceSpec::bytes).sum();
    progress.begin("compare", total);
    let differ: Mutex<Vec<PieceSpec>> = Mutex::new(Vec::new());
    let same = std::sync::atomic::AtomicU64::new(0);
    let reblocked = std::sync::atomic::AtomicU64::new(0);
    let compared = crate::io::parallel::for_each_with(
        batches.len(),
        source.threads(jobs),
        || Ok((source.reader()?, Vec::new())),
        |(reader, buf), n| {
            let ranges = &compare[batches[n].clone()];
            let theirs = reader.hash_ranges(files, ranges)?;
            let mut open: Option<(usize, std::fs::File)> = None;
            let mut local_differ = Vec::new();
            // The second level: the blocks of differing ranges, with their hashes here.
            let mut blocks: Vec<(PieceSpec, [u8; 32])> = Vec::new();
            for (p, h) in ranges.iter().zip(theirs) {
                let t = &targets[p.index()];
                let f = match open.take() {
                    Some((i, f)) if i == p.index() => f,
                    _ => std::fs::File::open(t).map_err(|e| Error::io("open", t, e))?,
                };
                buf.resize(p.len as usize, 0);
                f.read_exact_at(buf, p.offset)
                    .map_err(|e| Error::io("read", t, e))?;
                open = Some((p.index(), f));
                if h == Some(super::source::sha256(buf)) {
                    same.fetch_add(p.bytes(), Ordering::Relaxed);
                } else if h.is_some() && p.bytes() > DELTA_BLOCK {
                    let mut off = 0;
                    while off < p.bytes() {
                        let len = DELTA_BLOCK.min(p.bytes() - off);
                        let b = PieceSpec::new(p.index(), p.offset + off, len)?;
                        let at = off as usize..(off + len) as usize;
                        blocks.push((b, super::source::sha256(&buf[at])));
                        off += len;
                    }
                } else {
                    local_differ.push(*p);
                }
                progress.advance(p.bytes());
            }
            if !blocks.is_empty() {
                let specs: Vec<PieceSpec> = blocks.iter().map(|(b, _)| *b).collect();
                let theirs = reader.hash_ranges(files, &specs)?;
                for ((b, mine), h) in blocks.iter().zip(theirs) {
                    reblocked.fetch_add(b.bytes(), Ordering::Relaxed);
                    if h == Some(*mine) {
                        same.fetch_add(b.bytes(), Ordering::Relaxed);
                    } else {
                        local_differ.push(*b);
                    }
                }
            }
            differ
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(local_differ);
            Ok(())
        },
    );
    progress.finish();
    compared?;
    plan.copy
        .extend(differ.into_inner().unwrap_or_else(|p| p.into_inner()));
    plan.copy = merge_adjacent(plan.copy);
    plan.same_bytes += same.into_inner();
    plan.reblocked_bytes = reblocked.into_inner();
    plan.copy_bytes = plan.copy.iter().map(PieceSpec::bytes).sum();
    Ok(plan)
}

/// Sorts ranges by (file, offset) and joins those that touch, up to
/// [`super::MAX_PIECE`] bytes per range.
fn merge_adjacent(mut v: Vec<PieceSpec>) -> Vec<PieceSpec> {
    v.sort_by_key(|p| (p.file, p.offset));
    let mut out: Vec<PieceSpec> = Vec::with_capacity(v.len());
    for p in v {
        match out.last_mut() {
            Some(l)
                if l.file == p.file
                    && l.offset + l.bytes() == p.offset
                    && l.bytes() + p.bytes() <= super::MAX_PIECE =>
            {
                l.len += p.len
            }
            _ => out.push(p),
        }
    }
    out
}

/// Units of work for ranges: a range of at least `chunk` bytes is cut into chunks of its
/// own; smaller ones are bundled up to `chunk` bytes per unit. Largest units first.
pub fn plan_range_units(ranges: &[PieceSpec], chunk: u64) -> Vec<Unit> {
    let mut big = Vec::new();
    let mut small: Vec<PieceSpec> = Vec::new();
    for r in ranges {
        if r.bytes() >= chunk {
            let mut off = 0u32;
            while off < r.len {
                // at most r.len - off, a u32
                let len = chunk.min(u64::from(r.len - off)) as u32;
                big.push(Unit {
                    pieces: vec![PieceSpec {
                        file: r.file,
                        offset: r.offset + u64::from(off),
                        len,
                    }],
                    bytes: u64::from(len),
                });
                off += len;
            }
        } else if r.len > 0 {
            small.push(*r);
        }
    }
    let mut units = big;
    let mut bundle = Unit::default();
    for r in small {
        if bundle.bytes + r.bytes() > chunk || bundle.pieces.len() >= super::BUNDLE_MAX_FILES {
            units.push(std::mem::take(&mut bundle));
        }
        bundle.bytes += r.bytes();
        bundle.pieces.push(r);
    }
    if !bundle.pieces.is_empty() {
        units.push(bundle);
    }
    units
}

/// [`plan_range_units`] with the engine's chunk size.
pub fn range_units(ranges: &[PieceSpec]) -> Vec<Unit> {
    plan_range_units(ranges, CHUNK_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(file: usize, offset: u64, len: u64) -> PieceSpec {
        PieceSpec::new(file, offset, len).unwrap()
    }

    #[test]
    fn adjacent_ranges_merge_and_units_bundle() {
        let m = merge_adjacent(vec![r(1, 8, 8), r(0, 0, 4), r(1, 0, 8), r(1, 24, 8)]);
        let shape: Vec<(usize, u64, u64)> =
            m.iter().map(|p| (p.index(), p.offset, p.bytes())).collect();
        assert_eq!(shape, vec![(0, 0, 4), (1, 0, 16), (1, 24, 8)]);
        let units = plan_range_units(&m, 10);
        assert_eq!(
            crate::transfer::unit_shape(&units),
            vec![
                vec![(1, 0, 10)],
                vec![(1, 10, 6)],
                vec![(0, 0, 4)],
                vec![(1, 24, 8)],
            ]
        );
    }

    #[test]
    fn only_differing_ranges_are_copied() {
        use crate::transfer::source::LocalSource;
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        let mut a = vec![7u8; (DELTA_RANGE * 3) as usize];
        std::fs::write(src.join("f"), &a).unwrap();
        // The target differs in the second range and is one range shorter.
        a[DELTA_RANGE as usize + 5] = 1;
        a.truncate((DELTA_RANGE * 2) as usize);
        let t = d.path().join("t");
        std::fs::write(&t, &a).unwrap();
        let files = vec![SourceFile::plain("f", DELTA_RANGE * 3)];
        let source = LocalSource::new(&src);
        let plan = plan_delta(
            &source,
            &files,
            &[t],
            &[Some(DELTA_RANGE * 2)],
            None,
            2,
            &crate::transfer::NoProgress,
        )
        .unwrap();
        // The changed block of the second range, then the new tail.
        let shape: Vec<(u64, u64)> = plan.copy.iter().map(|p| (p.offset, p.bytes())).collect();
        assert_eq!(
            shape,
            vec![(DELTA_RANGE, DELTA_BLOCK), (DELTA_RANGE * 2, DELTA_RANGE)]
        );
        assert_eq!(plan.same_bytes, DELTA_RANGE * 2 - DELTA_BLOCK);
        assert_eq!(plan.reblocked_bytes, DELTA_RANGE);
    }

    #[test]
    fn a_range_differing_in_scattered_blocks_copies_those_blocks() {
        use crate::transfer::source::LocalSource;
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        let blocks = (DELTA_RANGE / DELTA_BLOCK) as usize;
        assert!(blocks >= 4, "a range holds several blocks");
        let size = DELTA_RANGE as usize * 2 + 100;
        let a: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.join("f"), &a).unwrap();
        let mut b = a.clone();
        let blk = DELTA_BLOCK as usize;
        b[3] ^= 1; // block 0
        b[2 * blk + 9] ^= 1; // block 2
        b[size - 1] ^= 1; // the short last block
        let t = d.path().join("t");
        std::fs::write(&t, &b).unwrap();
        let files = vec![SourceFile::plain("f", size as u64)];
        let plan = plan_delta(
            &LocalSource::new(&src),
            &files,
            &[t],
            &[Some(size as u64)],
            None,
            1,
            &crate::transfer::NoProgress,
        )
        .unwrap();
        let shape: Vec<(u64, u64)> = plan.copy.iter().map(|p| (p.offset, p.bytes())).collect();
        assert_eq!(
            shape,
            vec![
                (0, DELTA_BLOCK),
                (2 * DELTA_BLOCK, DELTA_BLOCK),
                (size as u64 - 100, 100)
            ]
        );
        assert_eq!(plan.copy_bytes, 2 * DELTA_BLOCK + 100);
        assert_eq!(plan.same_bytes + plan.copy_bytes, size as u64);
    }

    /// Blocks listed by something that knows them (WAL summaries): only those and the new
    /// tail are copied, and the file is not read on either side (the target here differs
    /// in an unlisted block too, which a listing is trusted to exclude, and is unreadable
    /// to prove nothing reads it); a file the listing does not know is compared by hash.
    #[test]
    fn listed_blocks_are_copied_without_reading() {
        use crate::transfer::source::LocalSource;
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        let blk = DELTA_BLOCK as usize;
        std::fs::write(src.join("rel"), vec![1u8; blk * 6]).unwrap();
        std::fs::write(src.join("other"), vec![2u8; blk * 2]).unwrap();
        let rel_t = d.path().join("rel.t");
        std::fs::create_dir(&rel_t).unwrap(); // not readable as a file
        let other_t = d.path().join("other.t");
        let mut o = vec![2u8; blk * 2];
        o[blk + 1] = 9;
        std::fs::write(&other_t, &o).unwrap();
        let files = vec![
            SourceFile::plain("rel", (blk * 6) as u64),
            SourceFile::plain("other", (blk * 2) as u64),
        ];
        let listed = |f: &SourceFile, t: u64| -> Option<Vec<u32>> {
            assert_eq!(t, (blk * 4) as u64);
            (&*f.path == "rel").then(|| vec![3, 1, 3, 7])
        };
        let plan = plan_delta(
            &LocalSource::new(&src),
            &files,
            &[rel_t, other_t],
            &[Some((blk * 4) as u64), Some((blk * 2) as u64)],
            Some(&|f: &SourceFile, t: u64| {
                if &*f.path == "rel" {
                    listed(f, t)
                } else {
                    None
                }
            }),
            1,
            &crate::transfer::NoProgress,
        )
        .unwrap();
        let shape: Vec<(usize, u64, u64)> = plan
            .copy
            .iter()
            .map(|p| (p.index(), p.offset, p.bytes()))
            .collect();
        let b = DELTA_BLOCK;
        assert_eq!(
            shape,
            vec![(0, b, b), (0, 3 * b, 3 * b), (1, b, b)],
            "block 1, block 3 with the new tail (blocks 4 and 5), and other's changed block"
        );
        assert_eq!(plan.listed_bytes, 4 * b);
        assert_eq!(plan.same_bytes, 2 * b + b);
    }
}
