//! `restore --delta`: which pieces of a backup a data directory already holds.
use super::BackupManifest;
use crate::error::{Error, Result};
use std::fs;
use std::path::Path;
use std::sync::Mutex;

/// For `restore --delta`: which pieces of each file of backup `m` the target in `pg_path`
/// does not already hold. A piece is kept (false) when the target file has the same size
/// as the backup's and the XXH3-128 of its range equals the manifest's; a missing or
/// resized file needs every piece. Hashing runs on `jobs` threads; pg_control is always
/// needed (it is written last), and so is every piece of a file whose manifest line has
/// no CRC32C (restore computes it from the bytes it writes).
///
/// Errors: a target file that exists but cannot be read.
pub fn pieces_needed(m: &BackupManifest, pg_path: &Path, jobs: usize) -> Result<Vec<Vec<bool>>> {
    use std::os::unix::fs::FileExt;
    let mut needed: Vec<Vec<bool>> = m.files.iter().map(|f| vec![true; f.pieces.len()]).collect();
    let mut work: Vec<(usize, usize)> = Vec::new();
    for (i, f) in m.files.iter().enumerate() {
        // pg_control is written last; a file without a CRC in the manifest (some pieces are
        // slices of an older backup's frames) is written whole, its CRC computed as it is.
        if f.path == "global/pg_control" || f.crc32c.is_none() {
            continue;
        }
        let same_size = fs::symlink_metadata(pg_path.join(&f.path))
            .map(|md| md.is_file() && md.len() == f.size)
            .unwrap_or(false);
        if same_size {
            work.extend((0..f.pieces.len()).map(|k| (i, k)));
        }
    }
    let equal: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    crate::io::parallel::for_each_with(
        work.len(),
        jobs,
        || Ok(Vec::new()),
        |buf, n| {
            let (i, k) = work[n];
            let f = &m.files[i];
            let p = &f.pieces[k];
            let path = pg_path.join(&f.path);
            fs::File::open(&path)
                .and_then(|h| {
                    buf.resize(p.logical_size as usize, 0);
                    h.read_exact_at(buf, p.logical_offset)
                })
                .map_err(|e| Error::io("read", &path, e))?;
            if p.xxh3.as_deref() == Some(crate::codec::xxh3_hex(buf).as_str()) {
                equal.lock().unwrap_or_else(|p| p.into_inner()).push((i, k));
            }
            Ok(())
        },
    )?;
    for (i, k) in equal.into_inner().unwrap_or_else(|p| p.into_inner()) {
        needed[i][k] = false;
    }
    Ok(needed)
}
