//! `archive-get`: fetch one archived WAL file for PostgreSQL's
//! `restore_command = 'pgjet --stanza=NAME archive-get %f "%p"'`: from the repositories in
//! order ([`crate::archive::get`]), or, with `archive-async=y`, from the spool where the
//! prefetcher keeps the next segments ([`crate::archive::prefetcher`]).
use crate::archive::get::{fetch_direct, GetOutcome};
use crate::archive::prefetcher;
use crate::error::Result;
use crate::options::Settings;
use crate::repo::wal::WalFile;
use std::path::Path;

/// Runs `archive-get` for `wal_file` into `dest`.
///
/// Errors: a name that is not a WAL file name; as [`fetch_direct`].
pub fn run(s: &Settings, wal_file: &str, dest: &Path) -> Result<GetOutcome> {
    let file = WalFile::parse(wal_file)?;
    if s.archive.asynchronous {
        return prefetcher::get_foreground(&s.archive_config(), wal_file, dest);
    }
    fetch_direct(&s.archive_config(), &file, dest)
}
