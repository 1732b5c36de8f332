//! `archive-get`: fetch one archived WAL file for PostgreSQL's
//! `restore_command = 'pgjet --stanza=NAME archive-get %f "%p"'`.
//!
//! The repositories are tried in order (`--repo N` alone when given); the first that has the
//! file serves it, checked whole (checksums of the stored and the decompressed bytes) before a
//! byte reaches `%p`. A file no repository has is the normal end of the archive: the caller
//! exits with status 1 and says little. Any other failure is an error.
use super::push::resolve_path;
use crate::error::Result;
use crate::options::ArchiveConfig;
use crate::repo::wal::{self, WalFile, WalFileKind};
use crate::repo::wal_tail;
use crate::repo::Stanza;
use std::path::Path;

/// What `archive-get` did.
#[derive(Debug, PartialEq, Eq)]
pub enum GetOutcome {
    /// Written to the destination from repository N.
    Found(u8),
    /// Written to the destination from the spool, where the prefetcher had put it.
    FromSpool,
    /// No repository has it.
    Missing,
}

/// Fetches `file` from the repositories in order into `dest` (see [`run`]).
///
/// Errors: as [`run`].
pub fn fetch_direct(s: &ArchiveConfig, file: &WalFile, dest: &Path) -> Result<GetOutcome> {
    let stanza = s.stanza()?;
    let dest = resolve_path(dest);
    let mut failed = None;
    for (n, cfg) in crate::repo::open::repos_in_scope(&s.repo_set)? {
        let got = crate::repo::open::open_store(&s.repo_set, n, cfg).and_then(|store| {
            let st = Stanza::new(n, store, stanza);
            let got = wal::fetch(&st, file)?;
            // "Not archived" counts only from a repository that holds the stanza: a wrong
            // --stanza, bucket or path must not look like the end of the archive.
            if got.is_none() {
                st.info()?;
            }
            Ok(got)
        });
        match got {
            Ok(Some((_, data))) => {
                // %p: 0640 less PostgreSQL's umask, its own WAL file mode (see write_whole).
                crate::io::fs::write_whole(&dest, &data, crate::io::fs::FILE_MODE)?;
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
    if let Some(e) = failed {
        return Err(e);
    }
    if file.kind == WalFileKind::Segment {
        return fetch_tail(s, file, &dest);
    }
    Ok(GetOutcome::Missing)
}

/// The end of the WAL after the primary was lost: a segment no repository has complete,
/// served from the tail `archive-stream` made durable ([`wal_tail`]), zero-filled to the
/// segment's size as PostgreSQL fills a new segment, so recovery replays up to the last
/// byte received and ends there (the next record reads as invalid). Missing when no
/// repository has a tail of it.
///
/// Errors: a damaged tail chunk; the store's.
fn fetch_tail(s: &ArchiveConfig, file: &WalFile, dest: &Path) -> Result<GetOutcome> {
    let stanza = s.stanza()?;
    for (n, cfg) in crate::repo::open::repos_in_scope(&s.repo_set)? {
        let store = crate::repo::open::open_store(&s.repo_set, n, cfg)?;
        let st = Stanza::new(n, store, stanza);
        let Some(mut bytes) = wal_tail::read_tail(&st, &file.name)? else {
            continue;
        };
        let seg_size = st.info()?.wal_segment_size;
        let received = bytes.len();
        bytes.resize(seg_size as usize, 0);
        crate::io::fs::write_whole(dest, &bytes, crate::io::fs::FILE_MODE)?;
        tracing::info!(
            "{} is not archived whole: restored from repo{n} the {received} bytes archive-stream received of it (the end of the WAL)",
            file.name
        );
        return Ok(GetOutcome::Found(n));
    }
    Ok(GetOutcome::Missing)
}
