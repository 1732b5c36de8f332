//! `archive-get`: fetch one archived WAL file for PostgreSQL's
//! `restore_command = 'pgjet --stanza=NAME archive-get %f "%p"'`.
//!
//! The repositories are tried in order (`--repo N` alone when given); the first that has the
//! file serves it, checked whole (checksums of the stored and the decompressed bytes) before a
//! byte reaches `%p`. A file no repository has is the normal end of the archive: the caller
//! exits with status 1 and says little. Any other failure is an error.
use super::archive_push::resolve_path;
use super::*;
use crate::repo::wal::{self, WalFile};
use std::io::Write;

/// What `archive-get` did.
#[derive(Debug, PartialEq, Eq)]
pub enum GetOutcome {
    /// Written to the destination from repository N.
    Found(u8),
    /// No repository has it.
    Missing,
}

/// Writes `data` to `dest` through a temporary sibling (`<dest>.pgjet.tmp`) renamed into
/// place, so no reader (PostgreSQL, a foreground waiting on the spool) sees a half-written
/// file. Not fsynced: what it writes can be fetched again.
///
/// Errors: [`Error::Io`] naming the path.
pub fn write_whole(dest: &Path, data: &[u8]) -> Result<()> {
    write_whole_with(dest, data, false)
}

/// [`write_whole`], with the data written to disk (fdatasync) before the rename when `sync`.
///
/// For the prefetcher's segments: PostgreSQL keeps every segment restore_command gives it,
/// with a `durable_rename` that fsyncs it (KeepFileRestoredFromArchive in
/// src/backend/access/transam/xlogarchive.c), so recovery's startup process would otherwise
/// wait for each 16 MiB to reach the disk. Written to disk ahead, in the background, that
/// fsync finds nothing to write.
///
/// Errors: as [`write_whole`].
pub fn write_whole_with(dest: &Path, data: &[u8], sync: bool) -> Result<()> {
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".pgjet.tmp");
    let tmp = PathBuf::from(tmp);
    let r = fs::File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(data)?;
            if sync {
                f.sync_data()?;
            }
            Ok(())
        })
        .map_err(|e| Error::io("write", &tmp, e))
        .and_then(|_| fs::rename(&tmp, dest).map_err(|e| Error::io("rename", dest, e)));
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

/// Runs `archive-get` for `wal_file` into `dest`.
///
/// A repository that fails (unreachable, or a corrupt copy, [`Error::CorruptWal`]) is
/// logged and the next one tried: another repository's copy passes the same checks.
///
/// Errors: a name that is not a WAL file name; when no repository served the file and at
/// least one failed, the first failure (never "missing": PostgreSQL would take that for the
/// end of the archive and end recovery early).
pub fn run(s: &Settings, wal_file: &str, dest: &Path) -> Result<GetOutcome> {
    let file = WalFile::parse(wal_file)?;
    if s.archive.asynchronous {
        return super::archive_async::get_foreground(s, wal_file, dest);
    }
    fetch_direct(s, &file, dest)
}

/// Fetches `file` from the repositories in order into `dest` (see [`run`]).
///
/// Errors: as [`run`].
pub fn fetch_direct(s: &Settings, file: &WalFile, dest: &Path) -> Result<GetOutcome> {
    let stanza = s.stanza()?;
    let dest = resolve_path(dest);
    let mut failed = None;
    for (n, cfg) in repos_in_scope(s)? {
        let got = crate::storage::open(cfg).and_then(|store| {
            let got = wal::fetch(&*store, stanza, file)?;
            // "Not archived" counts only from a repository that holds the stanza: a wrong
            // --stanza, bucket or path must not look like the end of the archive.
            if got.is_none() {
                crate::repo::read_stanza(&*store, stanza)?;
            }
            Ok(got)
        });
        match got {
            Ok(Some((_, data))) => {
                write_whole(&dest, &data)?;
                tracing::debug!("{} restored from repo{n}", file.name);
                return Ok(GetOutcome::Found(n));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("repo{n}: cannot read {}: {e}", file.name);
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(GetOutcome::Missing),
    }
}
