//! `archive-push`: archive one WAL file into every configured repository, for PostgreSQL's
//! `archive_command = 'pgjet --stanza=NAME archive-push %p'`: synchronously
//! ([`crate::archive::push`]), or through the spool with a background pusher
//! ([`crate::archive::pusher`]) when `archive-async=y`.
use crate::archive::{push, pusher};
use crate::config::Settings;
use crate::error::Result;
use std::path::Path;

/// Runs `archive-push` for the WAL file at `wal_path`: returns once it is durable in every
/// repository (asynchronously: acknowledged by the background pusher).
///
/// Errors: as [`push::push_sync`] and [`pusher::push_foreground`].
pub fn run(s: &Settings, wal_path: &Path) -> Result<()> {
    if let Some(dir) = std::env::var_os(pusher::BACKGROUND_ENV) {
        return pusher::push_background(s, Path::new(&dir));
    }
    if s.archive.asynchronous {
        return pusher::push_foreground(s, wal_path);
    }
    push::push_sync(s, wal_path)
}
