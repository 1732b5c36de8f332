//! The data-directory sink of the read pipeline: each piece written in place, zero pages
//! left as holes (the repository's sink is `crate::repo::sink`).
use super::{nonzero_runs, ReadPiece, UnitSink};
use crate::error::{Error, Result};
use crate::io::direct::{Writer, DIRECT_MIN_WRITE};
use std::path::{Path, PathBuf};

/// Writes pieces straight into files that already exist at their final size (sparse).
pub struct DirSink<'a> {
    /// Target path of each file of the list, by index.
    pub targets: &'a [PathBuf],
    /// The files held other bytes before (a delta): all-zero pages are punched out as holes
    /// instead of being skipped, so no old byte survives where the source has zeros.
    pub overwrite: bool,
}

impl UnitSink for DirSink<'_> {
    type State = ();
    type Piece = ();

    fn new_state(&self) -> Result<()> {
        Ok(())
    }

    fn write_unit(
        &self,
        _: &mut (),
        pieces: &[ReadPiece],
        _release: &mut dyn FnMut(),
    ) -> Result<Vec<()>> {
        for p in pieces {
            let path = &self.targets[p.spec.index()];
            write_runs(path, p.spec.offset, p.data, &p.zero_pages)?;
            if self.overwrite && !p.zero_pages.is_empty() {
                punch_zero_pages(path, p.spec.offset, &p.zero_pages)?;
            }
        }
        Ok(vec![(); pieces.len()])
    }
}

/// Writes the non-zero pages of `data` into the existing file `path` at `offset`: direct
/// I/O for the aligned part (see [`crate::io::direct`]) when they are at least
/// [`DIRECT_MIN_WRITE`] bytes, the page cache otherwise. The caller syncs at the end.
pub fn write_runs(path: &Path, offset: u64, data: &[u8], zero_pages: &[[u32; 2]]) -> Result<()> {
    let runs = nonzero_runs(data, zero_pages);
    if runs.is_empty() {
        return Ok(());
    }
    let total: usize = runs.iter().map(|(_, b)| b.len()).sum();
    let w = if total < DIRECT_MIN_WRITE {
        Writer::open_buffered(path)
    } else {
        Writer::open(path)
    }
    .map_err(|e| Error::io("open", path, e))?;
    for (off, bytes) in runs {
        w.write_at(bytes, offset + off as u64)
            .map_err(|e| Error::io("write", path, e))?;
    }
    Ok(())
}

/// Makes the all-zero pages `zero_pages` of a piece at `offset` read as zeros in the
/// existing file `path`: punched out as holes (fallocate PUNCH_HOLE, keeping the size), or
/// written as zeros where the filesystem cannot punch.
pub fn punch_zero_pages(path: &PathBuf, offset: u64, zero_pages: &[[u32; 2]]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    let page = crate::pg::checksum::BLCKSZ as u64;
    for [first, count] in zero_pages {
        let at = offset + *first as u64 * page;
        let len = *count as u64 * page;
        // SAFETY: fallocate on an open descriptor with valid offsets; errors are returned.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            let zeros = vec![0u8; len as usize];
            f.write_all_at(&zeros, at)
                .map_err(|e| Error::io("write", path, e))?;
        }
    }
    Ok(())
}
