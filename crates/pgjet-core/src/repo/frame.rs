//! A stored frame of a backup, both ways: encoding (the sink: a range's logical bytes, its
//! all-zero pages left out, compressed into the object being built) and decoding (read-back,
//! verify, the fuzz tests: the stored bytes checked against their XXH3-128, expanded, the
//! zero pages put back, the logical bytes checked). The format is docs/repository-format.md's
//! "frames".
use crate::codec::{self, CompressType, Compressor};
use crate::io::direct::{self, aligned_buf, AlignedBuf};
use crate::repo::Piece;
use crate::transfer::{nonzero_runs, CHUNK_SIZE};

/// Compresses `logical` as one frame appended to `object`, leaving out its all-zero pages
/// `zero_pages` (runs of [start, count] 8 KiB pages; the non-zero runs go back to back,
/// gathered in `scratch`). Returns nothing: the frame is `object[len before..]`.
///
/// Errors: the compressor's.
pub fn encode_frame(
    compressor: &mut Compressor,
    logical: &[u8],
    zero_pages: &[[u32; 2]],
    scratch: &mut Vec<u8>,
    object: &mut AlignedBuf,
) -> std::io::Result<()> {
    if zero_pages.is_empty() {
        return compressor.compress(logical, object);
    }
    scratch.clear();
    for (_, run) in nonzero_runs(logical, zero_pages) {
        scratch.extend_from_slice(run);
    }
    compressor.compress(scratch, object)
}

/// Checks one stored frame (`stored_size` bytes hashing to `stored_xxh3`) and expands it
/// into `out`: `size` logical bytes whose all-zero pages `zero_pages` were left out of the
/// frame, hashing to `xxh3` (None: not checked here). Errors say what did not match.
#[allow(clippy::too_many_arguments)]
fn decode_frame(
    kind: CompressType,
    frame: &[u8],
    stored: (u64, &str),
    size: u64,
    zero_pages: &[[u32; 2]],
    xxh3: Option<&str>,
    out: &mut AlignedBuf,
) -> std::result::Result<(), String> {
    if frame.len() as u64 != stored.0 || codec::xxh3_hex(frame) != stored.1 {
        return Err("stored bytes do not match their checksum".into());
    }
    let size = size as usize;
    let ranges = crate::repo::manifest::nonzero_ranges(size, zero_pages)
        .ok_or("the manifest's zero-page runs do not fit the piece")?;
    let payload_len: usize = ranges.iter().map(|r| r.1).sum();
    // The frame holds the non-zero runs back to back: expand it at the start of `out`,
    // then move each run up to its offset, last run first. A run never moves down (its
    // offset is at least the length of the runs before it), so moving the last run first
    // overwrites no run still to be moved; the gaps left behind are zeroed.
    direct::fit(out, payload_len);
    codec::decompress(kind, frame, out).map_err(|e| format!("cannot decompress: {e}"))?;
    if payload_len != size {
        out.resize(size, 0);
        let (mut src, mut placed) = (payload_len, size);
        for &(off, n) in ranges.iter().rev() {
            src -= n;
            out.copy_within(src..src + n, off);
            out[off + n..placed].fill(0);
            placed = off;
        }
        out[..placed].fill(0);
    }
    if xxh3.is_some_and(|h| codec::xxh3_hex(out) != h) {
        return Err("logical bytes do not match their checksum".into());
    }
    Ok(())
}

/// The last frame a decoder expanded for slices ([`decode_piece`]): the slices of one frame
/// come one after another, and the frame is checked and expanded once for all of them.
pub struct FrameCache {
    /// (backup, object, offset) of the frame `buf` holds.
    key: Option<(Option<String>, String, u64)>,
    buf: AlignedBuf,
}

impl FrameCache {
    /// An empty cache with room for one frame of up to [`CHUNK_SIZE`] bytes.
    pub fn new() -> FrameCache {
        FrameCache {
            key: None,
            buf: aligned_buf(CHUNK_SIZE as usize),
        }
    }
}

impl Default for FrameCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Checks one frame (`frame`, compressed with `kind`) against its piece and puts the piece's
/// logical bytes into `logical` (resized to the piece's logical size, zero pages filled with
/// zeros). A slice expands its whole frame into `cache` first (unless it is there already),
/// checks the frame's hash, then takes its part (and checks the part's hash when the
/// manifest has one). Errors say what did not match.
pub fn decode_piece(
    kind: CompressType,
    frame: &[u8],
    piece: &Piece,
    logical: &mut AlignedBuf,
    cache: &mut FrameCache,
) -> std::result::Result<(), String> {
    let stored = (piece.stored_size, piece.stored_xxh3.as_str());
    let Some(f) = &piece.frame else {
        if piece.xxh3.is_none() {
            return Err("the piece has no checksum".into());
        }
        return decode_frame(
            kind,
            frame,
            stored,
            piece.logical_size,
            &piece.zero_pages,
            piece.xxh3.as_deref(),
            logical,
        );
    };
    let key = (piece.backup.clone(), piece.object.clone(), piece.offset);
    if cache.key.as_ref() != Some(&key) {
        cache.key = None;
        decode_frame(
            kind,
            frame,
            stored,
            f.size,
            &f.zero_pages,
            Some(&f.xxh3),
            &mut cache.buf,
        )?;
        cache.key = Some(key);
    }
    let (a, n) = (f.skip as usize, piece.logical_size as usize);
    let part = cache
        .buf
        .get(a..a + n)
        .ok_or("the slice does not fit its frame")?;
    logical.clear();
    logical.extend_from_slice(part);
    if piece
        .xxh3
        .as_ref()
        .is_some_and(|h| codec::xxh3_hex(logical) != *h)
    {
        return Err("logical bytes do not match their checksum".into());
    }
    Ok(())
}
