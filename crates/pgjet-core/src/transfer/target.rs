//! The [`BackupTarget`] seam: where a base backup's bytes go (a repository backup, or a
//! data directory). The base-backup sequence (`crate::primary::backup_sequence`) drives it.
use super::{CopyOutcome, Progress, ReadOptions, Source, SourceFile};
use crate::error::Result;
use crate::pg::datadir::Listing;
use crate::pg::lsn::Lsn;

/// Where a base backup's bytes go.
pub trait BackupTarget {
    /// The listing is known and nothing is copied yet: lay out what the copy needs.
    fn prepare(&mut self, listing: &Listing, start_lsn: Lsn) -> Result<()>;
    /// Copies `files` from `source` with the engine.
    fn copy(
        &mut self,
        source: &dyn Source,
        files: &[SourceFile],
        opts: &ReadOptions,
        progress: &dyn Progress,
    ) -> Result<CopyOutcome>;
}
