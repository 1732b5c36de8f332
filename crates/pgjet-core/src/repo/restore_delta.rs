//! `restore --delta`: which pieces of a backup a data directory already holds.
use super::read_back::PieceWant;
use super::BackupManifest;
use crate::error::{Error, Result};
use std::fs;
use std::path::Path;
use std::sync::Mutex;

/// For `restore --delta`: what to do with each piece of each file of backup `m`, given the
/// target in `pg_path` ([`PieceWant`]). When the target file has the backup's size, a piece
/// is kept when the XXH3-128 of its range there equals the manifest's, and a piece whose
/// logical hash the manifest lacks (a slice of an older backup's frame: an incremental
/// never reads its unchanged blocks) is compared byte for byte once read back, and written
/// only where it differs. A missing or resized file needs every piece written; so does
/// pg_control (it is written last). Hashing runs on `jobs` threads.
///
/// Errors: a target file that exists but cannot be read.
pub fn pieces_needed(
    m: &BackupManifest,
    pg_path: &Path,
    jobs: usize,
) -> Result<Vec<Vec<PieceWant>>> {
    use std::os::unix::fs::FileExt;
    let mut needed: Vec<Vec<PieceWant>> = m
        .files
        .iter()
        .map(|f| vec![PieceWant::Write; f.pieces.len()])
        .collect();
    let mut work: Vec<(usize, usize)> = Vec::new();
    for (i, f) in m.files.iter().enumerate() {
        // pg_control is written last, whatever the target holds.
        if f.path == "global/pg_control" {
            continue;
        }
        let same_size = fs::symlink_metadata(pg_path.join(&f.path))
            .map(|md| md.is_file() && md.len() == f.size)
            .unwrap_or(false);
        if same_size {
            for (k, p) in f.pieces.iter().enumerate() {
                match p.xxh3 {
                    Some(_) => work.push((i, k)),
                    None => needed[i][k] = PieceWant::Compare,
                }
            }
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
        needed[i][k] = PieceWant::Keep;
    }
    Ok(needed)
}
