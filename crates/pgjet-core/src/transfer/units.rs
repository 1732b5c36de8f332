//! Units of work: files cut into chunks of large files and bundles of small ones, in the
//! order workers take them (largest first); the sizes that bound them.
use super::*;
use crate::error::{Error, Result};

/// Size of a chunk of a large file and the most logical bytes a bundle holds: 8 MiB.
/// Measured on this project's benchmark: 8 MiB keeps two workers busy on one 1 GiB segment
/// while the per-unit memory (read buffer plus frame) stays at 16 MiB per worker.
pub const CHUNK_SIZE: u64 = 8 << 20;
/// Most files in one bundle (bounds the manifest work per object).
pub const BUNDLE_MAX_FILES: usize = 4096;
/// Most parts of files (ranges of a diff's or incr's changed blocks) in one bundle
/// ([`plan_ranges_bundled`]).
pub const SCATTERED_PER_UNIT: usize = 64;

/// A range of one file inside a unit: 16 bytes, as a backup of a million files plans a
/// million of them.
#[derive(Debug, Clone, Copy)]
pub struct PieceSpec {
    /// Offset in the file, bytes.
    pub offset: u64,
    /// Index into the file list.
    pub file: u32,
    /// Length, bytes: at most [`MAX_PIECE`].
    pub len: u32,
}

/// The longest piece, bytes (1 GiB: a relation segment of the default size, far above
/// any unit size).
pub const MAX_PIECE: u64 = 1 << 30;

impl PieceSpec {
    /// The piece of file `file` at `offset`, `len` bytes. Callers cut longer ranges
    /// (see [`MAX_PIECE`]); a longer `len` or an index past `u32` is a planning bug and
    /// gives an error rather than a short copy.
    pub fn new(file: usize, offset: u64, len: u64) -> Result<PieceSpec> {
        match (u32::try_from(file), u32::try_from(len)) {
            (Ok(file), Ok(len)) if u64::from(len) <= MAX_PIECE => {
                Ok(PieceSpec { offset, file, len })
            }
            _ => Err(Error::Other(format!(
                "internal: piece of file #{file} at {offset} with {len} bytes is out of range"
            ))),
        }
    }

    /// Index into the file list.
    pub fn index(&self) -> usize {
        self.file as usize
    }

    /// Length, bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.len)
    }
}

/// A unit of work: one chunk of a large file, or a bundle of small files.
#[derive(Debug, Clone, Default)]
pub struct Unit {
    pub pieces: Vec<PieceSpec>,
    /// Sum of the piece lengths.
    pub bytes: u64,
}

/// Splits `files` into units: chunks of the large files first (largest file first), then
/// bundles of the small ones, `chunk` bytes at most (capped at [`MAX_PIECE`]) and
/// [`BUNDLE_MAX_FILES`] files. Empty files get no unit. Errors: more than 2^32 files.
pub fn plan_units(files: &[SourceFile], chunk: u64) -> Result<Vec<Unit>> {
    plan_units_bundled(files, chunk, chunk, BUNDLE_MAX_FILES)
}

/// [`plan_units`] with bundles of at most `bundle_bytes` logical bytes (at most `chunk`)
/// and `bundle_files` files: a file smaller than `chunk` still goes into a bundle, alone
/// when it is larger than `bundle_bytes`. For the benchmarks that measure bundle sizes
/// ([`bundle_limits`]).
pub fn plan_units_bundled(
    files: &[SourceFile],
    chunk: u64,
    bundle_bytes: u64,
    bundle_files: usize,
) -> Result<Vec<Unit>> {
    plan_ranges_bundled(files, &|_| None, chunk, bundle_bytes, bundle_files)
}

/// [`plan_units_bundled`] reading only some ranges of some files: `ranges(i)` gives the
/// (offset, length) ranges of file `i` to read, in order and apart (None: the whole file).
/// A range is cut and bundled as a file of its length would be, but a bundle holds at most
/// [`SCATTERED_PER_UNIT`] parts of files: scattered blocks are read one request each, and
/// many small units keep every reader thread busy (a diff's 1317 changed blocks in 2 units
/// of 4096 took 0.44 s to read from a cold cache, in 21 units 0.18 s).
pub fn plan_ranges_bundled(
    files: &[SourceFile],
    ranges: &dyn Fn(usize) -> Option<Vec<(u64, u64)>>,
    chunk: u64,
    bundle_bytes: u64,
    bundle_files: usize,
) -> Result<Vec<Unit>> {
    let chunk = chunk.clamp(1, MAX_PIECE);
    let bundle_bytes = bundle_bytes.clamp(1, chunk);
    let bundle_files = bundle_files.max(1);
    // (file, offset, length) of every range to read.
    let mut items: Vec<(usize, u64, u64)> = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        match ranges(i) {
            None => items.push((i, 0, f.size)),
            Some(r) => items.extend(r.into_iter().map(|(o, l)| (i, o, l))),
        }
    }
    items.retain(|it| it.2 > 0);
    items.sort_by(|a, b| {
        b.2.cmp(&a.2)
            .then(files[a.0].path.cmp(&files[b.0].path))
            .then(a.1.cmp(&b.1))
    });
    let mut units = Vec::new();
    let mut bundle = Unit::default();
    // Parts of files (not whole ones) in the bundle.
    let mut parts = 0usize;
    for (i, start, size) in items {
        if size >= chunk {
            let mut off = 0;
            while off < size {
                let len = chunk.min(size - off);
                units.push(Unit {
                    pieces: vec![PieceSpec::new(i, start + off, len)?],
                    bytes: len,
                });
                off += len;
            }
        } else {
            let part = (start, size) != (0, files[i].size);
            let full = bundle.bytes + size > bundle_bytes
                || bundle.pieces.len() >= bundle_files
                || (part && parts >= SCATTERED_PER_UNIT);
            if full && !bundle.pieces.is_empty() {
                units.push(std::mem::take(&mut bundle));
                parts = 0;
            }
            bundle.pieces.push(PieceSpec::new(i, start, size)?);
            bundle.bytes += size;
            parts += usize::from(part);
        }
    }
    if !bundle.pieces.is_empty() {
        units.push(bundle);
    }
    Ok(units)
}

/// Bundle limits of a backup: logical bytes (at most [`CHUNK_SIZE`]) and files;
/// [`CHUNK_SIZE`] and [`BUNDLE_MAX_FILES`] unless the benchmarks that measure them set
/// `PGJET_BUNDLE_KIB` / `PGJET_BUNDLE_FILES` ([`crate::io::tuning`]).
pub fn bundle_limits() -> (u64, usize) {
    let t = crate::io::tuning::get();
    (
        t.bundle_bytes.unwrap_or(CHUNK_SIZE).min(CHUNK_SIZE),
        t.bundle_files.unwrap_or(BUNDLE_MAX_FILES),
    )
}
