//! A new data directory as the target of a base backup ([`DirTarget`]): directories and
//! tablespace links are made once the listing is known, every file is created sparse at its
//! size and written in place; with `delta`, an existing copy of the same cluster is
//! re-synced range by range instead.
use super::delta;
use super::{create_files, prepare_target, TargetSync};
use crate::error::Result;
use crate::pg::datadir::Listing;
use crate::pg::lsn::Lsn;
use crate::transfer::delta::{plan_delta, range_units};
use crate::transfer::sink::DirSink;
use crate::transfer::{
    copy_files, copy_units, BackupTarget, CopyOutcome, Progress, ReadOptions, Source, SourceFile,
};
use std::fs;
use std::path::{Path, PathBuf};

/// A new data directory as a [`BackupTarget`]: directories and tablespace links are made
/// once the listing is known, every file is created sparse at its size and written in place.
pub struct DirTarget<'a> {
    pub pg_path: &'a Path,
    pub tablespaces: &'a [(u32, String, String)],
    pub map: &'a [(String, PathBuf)],
    /// (oid, chosen location): checked before the backup starts, the tablespace
    /// directories made by `prepare`.
    pub locations: Vec<(u32, PathBuf)>,
    pub sync: Option<TargetSync>,
    /// Files written (path, mtime), to stamp their modification times at the end.
    pub written: Vec<(PathBuf, i64)>,
    /// The source's system identifier, for the marker kept while the directory is written.
    pub system_identifier: u64,
    /// Re-sync an existing copy: compare ranges and copy only what differs.
    pub delta: bool,
    /// Delta totals: bytes equal, bytes copied.
    pub same: u64,
    pub copied: u64,
}

impl BackupTarget for DirTarget<'_> {
    fn prepare(&mut self, listing: &Listing, _start_lsn: Lsn) -> Result<()> {
        if self.delta {
            let removed = delta::begin_delta(
                self.pg_path,
                self.system_identifier,
                &self.locations,
                listing,
            )?;
            tracing::info!(
                "delta: removed {removed} file(s) or directories the primary does not have"
            );
        } else {
            self.locations = prepare_target(
                self.pg_path,
                self.system_identifier,
                self.tablespaces,
                self.map,
                &listing.dirs,
            )?;
        }
        self.sync = Some(TargetSync::open(self.pg_path, &self.locations)?);
        Ok(())
    }

    fn copy(
        &mut self,
        source: &dyn Source,
        files: &[SourceFile],
        opts: &ReadOptions,
        progress: &dyn Progress,
    ) -> Result<CopyOutcome> {
        let specs: Vec<(&str, u64, u32)> =
            files.iter().map(|f| (&*f.path, f.size, f.mode)).collect();
        let (targets, out) = if self.delta {
            let (targets, before) = delta::size_files(self.pg_path, &specs)?;
            let plan = plan_delta(source, files, &targets, &before, opts.jobs, progress)?;
            self.same += plan.same_bytes;
            self.copied += plan.copy_bytes;
            let units = range_units(&plan.copy);
            progress.begin("copy", plan.copy_bytes);
            let sink = DirSink {
                targets: &targets,
                overwrite: true,
            };
            let out = copy_units(source, files, &units, opts, &sink, progress)?;
            progress.finish();
            (targets, out)
        } else {
            let targets = create_files(self.pg_path, &specs)?;
            let sink = DirSink {
                targets: &targets,
                overwrite: false,
            };
            self.copied += files.iter().map(|f| f.size).sum::<u64>();
            let out = copy_files(source, files, opts, &sink, progress)?;
            (targets, out)
        };
        for ((f, t), gone) in files.iter().zip(targets).zip(&out.vanished) {
            if *gone {
                let _ = fs::remove_file(&t);
            } else {
                self.written.push((t, f.mtime));
            }
        }
        Ok(out)
    }
}
