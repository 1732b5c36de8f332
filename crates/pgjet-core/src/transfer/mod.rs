//! The parallel transfer engine.
//!
//! Files are cut into *units* of work: a file of at least [`CHUNK_SIZE`] bytes is split into
//! chunks that separate workers copy at once; smaller files are batched into *bundles* of up
//! to [`CHUNK_SIZE`] bytes, one stored object each, so small files cost no round trip or
//! object of their own. Units are ordered largest first and handed to the worker threads
//! through a shared cursor. A thread holds one unit at a time: a read buffer of the unit's
//! size, the sink's per-thread state (for a repository, an output buffer of about the same
//! size) and, for a network source, the reply being received. So memory is bounded by about
//! `threads * 3 * CHUNK_SIZE`, whatever the cluster size or file count; the source decides
//! the number of threads ([`Source::threads`]).
//!
//! Bytes come from a [`Source`] (this host's files, or the server over libpq). Per piece a
//! worker checks PostgreSQL page checksums (re-reading a failing page once to tell a torn
//! write from corruption), finds all-zero 8 KiB pages, and hashes the logical bytes (XXH3-128
//! and CRC32C); the [`UnitSink`] then stores or writes them. That per-piece step knows
//! neither where the bytes came from nor where they go.
pub mod assemble;
pub mod engine;
pub mod range_delta;
pub mod source;
pub mod stream_units;
pub mod target;
pub mod units;
pub mod zero_pages;

pub use crate::pg::datadir::SourceFile;
pub use assemble::*;
pub use engine::*;
pub use source::{Source, SourceReader};
pub use target::BackupTarget;
pub use units::*;
pub use zero_pages::*;

use crate::error::Result;

/// Receives progress; the library never draws on the terminal itself.
pub trait Progress: Sync {
    /// A phase starts with `total` bytes to move.
    fn begin(&self, phase: &str, total: u64);
    /// `bytes` more are done.
    fn advance(&self, bytes: u64);
    /// The phase is over.
    fn finish(&self);
}

/// Progress that goes nowhere.
pub struct NoProgress;
impl Progress for NoProgress {
    fn begin(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// Options of the read stage.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Worker threads.
    pub jobs: usize,
    /// Check page checksums of files with `checksum_segno`.
    pub verify_checksums: bool,
    /// Backup start LSN: pages with a newer LSN are not checked (WAL replay rewrites them).
    pub backup_start_lsn: u64,
}

/// A piece as read: its bytes and what the page checks found.
pub struct ReadPiece<'a> {
    pub spec: PieceSpec,
    /// The file's path (as in the manifest).
    pub path: &'a str,
    /// `spec.len` logical bytes.
    pub data: &'a [u8],
    /// Runs `[first, count]` of all-zero 8 KiB pages.
    pub zero_pages: Vec<[u32; 2]>,
    /// XXH3-128 hex of `data`.
    pub xxh3: String,
    /// CRC32C of `data`.
    pub crc32c: u32,
}

/// Where units go: a repository (compress and store) or a data directory (write in place).
pub trait UnitSink: Sync {
    /// Per-worker state (e.g. a compression context).
    type State;
    /// What the sink reports of each piece it stored (a repository: where the piece's frame
    /// is and its hashes, for the manifest; a data directory: nothing).
    type Piece: Send;
    /// Makes one worker's state.
    fn new_state(&self) -> Result<Self::State>;
    /// Stores one unit and returns what it reports of each read piece, in order. The
    /// caller holds one of the `jobs` CPU-stage tokens; `release` gives it back, for a sink
    /// whose last step only waits (an upload), so another thread's CPU work runs meanwhile.
    fn write_unit(
        &self,
        st: &mut Self::State,
        pieces: &[ReadPiece],
        release: &mut dyn FnMut(),
    ) -> Result<Vec<Self::Piece>>;
    /// The copy failed: stop waiting on slow writes (an object store's retries).
    fn abort(&self) {}
}

/// The units as (file, offset, length) lists, for tests of the planners.
#[cfg(test)]
pub(crate) fn unit_shape(units: &[Unit]) -> Vec<Vec<(usize, u64, u64)>> {
    units
        .iter()
        .map(|u| {
            u.pieces
                .iter()
                .map(|p| (p.index(), p.offset, p.bytes()))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::checksum::BLCKSZ;

    fn f(path: &str, size: u64) -> SourceFile {
        SourceFile::plain(path, size)
    }

    /// A piece as (offset, length), for the assembler's tests.
    #[derive(Clone, Debug, PartialEq)]
    struct Span(u64, u64);

    impl PieceOffset for Span {
        fn logical_offset(&self) -> u64 {
            self.0
        }
        fn logical_end(&self) -> u64 {
            self.0 + self.1
        }
    }

    #[test]
    fn prefixes_come_every_step_and_the_whole_file_once() {
        // One file of 4096 pieces of 8 KiB (32 MiB), stored in order, one unit each.
        let blk = 8192u64;
        let n = 4096u64;
        let files = vec![f("rel", n * blk)];
        let units: Vec<Unit> = (0..n)
            .map(|k| Unit {
                pieces: vec![PieceSpec::new(0, k * blk, blk).unwrap()],
                bytes: blk,
            })
            .collect();
        let mut got: Vec<(u64, usize, bool)> = Vec::new();
        let mut emit = |_i: usize, pieces: Vec<Span>, _e: Vec<u32>, whole: bool| {
            got.push((
                pieces.last().map_or(0, |p| p.logical_end()),
                pieces.len(),
                whole,
            ));
            Ok(())
        };
        let mut asm = FileAssembler::new(&files, &units, &mut emit).unwrap();
        asm.prefixes = true;
        for k in 0..n {
            asm.unit_done(UnitDone {
                pieces: vec![(0, Span(k * blk, blk))],
                page_errors: Vec::new(),
                vanished: Vec::new(),
            })
            .unwrap();
        }
        drop(asm);
        // A prefix after every PREFIX_STEP bytes (3 of them: 8, 16, 24 MiB), then the whole.
        let step = (PREFIX_STEP / blk) as usize;
        assert_eq!(
            got,
            vec![
                (PREFIX_STEP, step, false),
                (2 * PREFIX_STEP, 2 * step, false),
                (3 * PREFIX_STEP, 3 * step, false),
                (n * blk, n as usize, true),
            ]
        );
    }

    #[test]
    fn large_files_chunked_small_bundled_largest_first() {
        let files = vec![f("a", 3), f("big", 20), f("b", 4), f("empty", 0), f("c", 9)];
        let units = plan_units(&files, 8).unwrap();
        assert_eq!(
            unit_shape(&units),
            vec![
                vec![(1, 0, 8)],
                vec![(1, 8, 8)],
                vec![(1, 16, 4)],
                vec![(4, 0, 8)],
                vec![(4, 8, 1)],
                vec![(2, 0, 4), (0, 0, 3)],
            ]
        );
        assert!(units
            .iter()
            .all(|u| u.bytes == u.pieces.iter().map(|p| p.bytes()).sum::<u64>()));
    }

    #[test]
    fn bundles_obey_their_own_limits() {
        let files = vec![f("a", 3), f("b", 3), f("c", 3), f("mid", 6), f("big", 20)];
        // chunks of 8, bundles of at most 5 bytes and 2 files: "mid" (6 bytes, under a
        // chunk) is a bundle of its own, and a, b, c (3 bytes each) go one per bundle.
        let units = plan_units_bundled(&files, 8, 5, 2).unwrap();
        assert_eq!(
            unit_shape(&units),
            vec![
                vec![(4, 0, 8)],
                vec![(4, 8, 8)],
                vec![(4, 16, 4)],
                vec![(3, 0, 6)],
                vec![(0, 0, 3)],
                vec![(1, 0, 3)],
                vec![(2, 0, 3)],
            ]
        );
        let units = plan_units_bundled(&files, 8, 8, 2).unwrap();
        assert_eq!(
            unit_shape(&units)[3..],
            [vec![(3, 0, 6)], vec![(0, 0, 3), (1, 0, 3)], vec![(2, 0, 3)]]
        );
    }

    #[test]
    fn ranges_are_cut_and_bundled_like_files() {
        let files = vec![f("a", 30), f("b", 5)];
        // Of a: 2 bytes at 4 and 12 bytes at 16; b whole.
        let ranges = |i: usize| (i == 0).then(|| vec![(4, 2), (16, 12)]);
        let units = plan_ranges_bundled(&files, &ranges, 8, 8, 4).unwrap();
        assert_eq!(
            unit_shape(&units),
            vec![
                vec![(0, 16, 8)],
                vec![(0, 24, 4)],
                vec![(1, 0, 5), (0, 4, 2)]
            ]
        );
    }

    #[test]
    fn nonzero_runs_skip_zero_pages() {
        let data = vec![1u8; BLCKSZ * 5 + 10];
        let runs = nonzero_runs(&data, &[[1, 2], [4, 1]]);
        let shape: Vec<(usize, usize)> = runs.iter().map(|(o, d)| (*o, d.len())).collect();
        assert_eq!(
            shape,
            vec![(0, BLCKSZ), (3 * BLCKSZ, BLCKSZ), (5 * BLCKSZ, 10)]
        );
    }

    #[test]
    fn zero_page_ranges() {
        assert_eq!(
            nonzero_ranges(5 * BLCKSZ + 10, &[[1, 2], [4, 1]]).unwrap(),
            vec![(0, BLCKSZ), (3 * BLCKSZ, BLCKSZ), (5 * BLCKSZ, 10)]
        );
        assert!(nonzero_ranges(BLCKSZ, &[[0, 2]]).is_none());
        assert!(nonzero_ranges(4 * BLCKSZ, &[[2, 1], [1, 1]]).is_none());
        assert!(nonzero_ranges(4 * BLCKSZ, &[[u32::MAX, u32::MAX]]).is_none());
    }
}
