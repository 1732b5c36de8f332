//! `archive-push`: archive one WAL file into every configured repository, for PostgreSQL's
//! `archive_command = 'pgjet --stanza=NAME archive-push %p'`: synchronously
//! ([`crate::archive::push`]), or through the spool with a background pusher
//! ([`crate::archive::pusher`]) when `archive-async=y`.
use crate::archive::spool::Spool;
use crate::archive::{push, pusher, queue};
use crate::error::Result;
use crate::options::Settings;
use std::path::Path;

/// Runs `archive-push` for the WAL file at `wal_path`: returns once it is durable in every
/// repository (asynchronously: acknowledged by the background pusher).
///
/// Errors: as [`push_sync`] and [`pusher::push_foreground`].
pub fn run(s: &Settings, wal_path: &Path) -> Result<()> {
    if s.archive.asynchronous {
        return pusher::push_foreground(&s.archive_config(), wal_path);
    }
    push_sync(s, wal_path)
}

/// Synchronous `archive-push` of the WAL file at `wal_path`: returns once it is durable in
/// every repository (or, past archive-push-queue-max, dropped with its gap recorded).
///
/// Errors: as [`push::Archiver::open`] and [`push::Archiver::push`].
fn push_sync(s: &Settings, wal_path: &Path) -> Result<()> {
    let archive_cfg = s.archive_config();
    let path = push::resolve_path(wal_path);
    let archiver = push::Archiver::open(&archive_cfg)?;
    if let Some(max) = s.archive.push_queue_max {
        // Gap records that could not reach a repository yet go first.
        queue::flush_gaps(&Spool::open(&archive_cfg, archiver.stanza())?, &archiver);
        if let Some(warning) = queue::drop_if_queue_full(&archive_cfg, &archiver, &path, max)? {
            tracing::warn!("{warning}");
            return Ok(());
        }
    }
    let mut c = archiver.compressor()?;
    archiver.push(&path, &mut c, &mut Vec::new())?;
    tracing::debug!("archived {}", path.display());
    Ok(())
}
