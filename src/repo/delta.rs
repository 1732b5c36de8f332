//! `restore --delta`: which pieces of a backup a data directory already holds.
use super::BackupManifest;
use crate::error::{Error, Result};
use std::fs;
use std::path::Path;

/// For `restore --delta`: which pieces of each file of backup `m` the target in `pg_path`
/// does not already hold. A piece is kept (false) when the target file has the same size
/// as the backup's and the XXH3-128 of its range equals the manifest's; a missing or
/// resized file needs every piece. Hashing runs on `jobs` threads; pg_control is always
/// needed (it is written last).
///
/// Errors: a target file that exists but cannot be read.
pub fn pieces_needed(m: &BackupManifest, pg_path: &Path, jobs: usize) -> Result<Vec<Vec<bool>>> {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut needed: Vec<Vec<bool>> = m.files.iter().map(|f| vec![true; f.pieces.len()]).collect();
    let mut work: Vec<(usize, usize)> = Vec::new();
    for (i, f) in m.files.iter().enumerate() {
        if f.path == "global/pg_control" {
            continue;
        }
        let same_size = fs::symlink_metadata(pg_path.join(&f.path))
            .map(|md| md.is_file() && md.len() == f.size)
            .unwrap_or(false);
        if same_size {
            work.extend((0..f.pieces.len()).map(|k| (i, k)));
        }
    }
    let next = AtomicUsize::new(0);
    let equal: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    let first_error: std::sync::Mutex<Option<Error>> = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                let mut buf = Vec::new();
                let mut local = Vec::new();
                while let Some(&(i, k)) = work.get(next.fetch_add(1, Ordering::SeqCst)) {
                    let f = &m.files[i];
                    let p = &f.pieces[k];
                    let path = pg_path.join(&f.path);
                    let res = fs::File::open(&path).and_then(|h| {
                        buf.resize(p.logical_size as usize, 0);
                        h.read_exact_at(&mut buf, p.logical_offset)
                    });
                    match res {
                        Ok(()) if crate::codec::xxh3_hex(&buf) == p.xxh3 => local.push((i, k)),
                        Ok(()) => {}
                        Err(e) => {
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(Error::io("read", &path, e));
                            break;
                        }
                    }
                }
                equal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(local);
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    for (i, k) in equal.into_inner().unwrap_or_else(|p| p.into_inner()) {
        needed[i][k] = false;
    }
    Ok(needed)
}
