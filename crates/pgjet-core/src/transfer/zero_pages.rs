//! All-zero 8 KiB pages: found in a range's logical bytes, left out of its stored frame,
//! and the non-zero runs that remain.
use crate::pg::checksum::{self, BLCKSZ};

/// The runs `[first, count]` of all-zero 8 KiB pages of `data` (a trailing partial page is
/// never one).
pub fn zero_page_runs(data: &[u8]) -> Vec<[u32; 2]> {
    let mut runs: Vec<[u32; 2]> = Vec::new();
    for (i, page) in data.chunks_exact(BLCKSZ).enumerate() {
        let i = i as u32;
        if checksum::page_is_zero(page) {
            match runs.last_mut() {
                Some(r) if r[0] + r[1] == i => r[1] += 1,
                _ => runs.push([i, 1]),
            }
        }
    }
    runs
}

/// The (offset, length) ranges of a piece of `len` bytes that are not in `zero_pages`, in
/// order. None when the runs are out of order or reach past `len` (a damaged manifest).
pub fn nonzero_ranges(len: usize, zero_pages: &[[u32; 2]]) -> Option<Vec<(usize, usize)>> {
    let mut out = Vec::with_capacity(zero_pages.len() + 1);
    let mut pos = 0usize;
    for r in zero_pages {
        let start = (r[0] as usize).checked_mul(BLCKSZ)?;
        let end = (r[0] as usize)
            .checked_add(r[1] as usize)?
            .checked_mul(BLCKSZ)?;
        if start < pos || end > len {
            return None;
        }
        if start > pos {
            out.push((pos, start - pos));
        }
        pos = end;
    }
    if pos < len {
        out.push((pos, len - pos));
    }
    Some(out)
}

/// Splits `data` of a piece into (offset, bytes) runs of pages that are not all-zero.
/// `zero_pages` must come from [`scan_pages`] or a checked manifest.
pub fn nonzero_runs<'a>(data: &'a [u8], zero_pages: &[[u32; 2]]) -> Vec<(usize, &'a [u8])> {
    nonzero_ranges(data.len(), zero_pages)
        .unwrap_or_default()
        .into_iter()
        .map(|(o, n)| (o, &data[o..o + n]))
        .collect()
}
