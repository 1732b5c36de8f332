//! A repository backup as the target of a base backup ([`RepoTarget`]): every unit of the
//! copy becomes a stored object, and every file a manifest line as soon as all its bytes are
//! stored; pg_control is stored last, from bytes whose CRC was checked. A backup written from
//! the server's `BASE_BACKUP` stream keeps its manifest through [`StreamManifest`].
use super::manifest_io::ManifestWriter;
use super::sink::RepoSink;
use super::{DirEntry, FileEntry, ManifestHeader, Piece, Tablespace};
use crate::error::{Error, Result};
use crate::pg::datadir::Listing;
use crate::pg::lsn::Lsn;
use crate::transfer::stream_units::{StreamCollector, StreamStart};
use crate::transfer::{
    copy_units_into, BackupTarget, CopyOutcome, FileAssembler, PieceOffset, PieceSpec, Progress,
    ReadOptions, ReadPiece, Source, SourceFile, UnitSink, CHUNK_SIZE,
};

/// The repository as a [`BackupTarget`]: every unit becomes an object of the backup, and
/// every file a line of the manifest as soon as all its bytes are stored (nothing per file
/// is kept in memory beyond the listing).
pub struct RepoTarget<'a> {
    pub sink: &'a RepoSink<'a>,
    /// The manifest's header; `prepare` fills in the start LSN and the tablespaces.
    pub header: ManifestHeader,
    /// Names of the tablespaces by OID (the listing knows only OIDs and locations).
    pub spcs: &'a [(u32, String, String)],
    /// Started by `prepare`.
    pub manifest: Option<ManifestWriter>,
    /// For a diff or incr: how to reach the server, and its facts, to read WAL summaries
    /// (PostgreSQL 17+); `prepare` reads them once the start LSN is known, on a session of
    /// their own ([`crate::pg::session::Session::aside`]: a failing query must not end the
    /// backup's slot).
    pub summaries_from: Option<(
        &'a crate::pg::conninfo::ConnTarget,
        &'a crate::pg::session::ServerInfo,
    )>,
    /// The changes the WAL summaries list since the reference, when they cover it.
    pub summaries: Option<crate::pg::walsummary::SummarizedChanges>,
}

/// `RepoTarget::manifest` used before `prepare` started it (a bug, not a user error).
pub fn manifest_not_started() -> Error {
    Error::Other("the backup's manifest was not started".into())
}

impl BackupTarget for RepoTarget<'_> {
    fn prepare(&mut self, listing: &Listing, start_lsn: Lsn) -> Result<()> {
        self.header.start_lsn = start_lsn;
        self.header.tablespaces = listing
            .tablespaces
            .iter()
            .map(|t| Tablespace {
                oid: t.oid,
                name: self
                    .spcs
                    .iter()
                    .find(|(o, _, _)| *o == t.oid)
                    .map(|x| x.1.clone())
                    .unwrap_or_else(|| t.oid.to_string()),
                location: t.target.display().to_string(),
            })
            .collect();
        let mut w = self.sink.begin_manifest(self.header.clone())?;
        for (path, mode) in &listing.dirs {
            w.dir(&DirEntry {
                path: path.clone(),
                mode: *mode,
            })?;
        }
        self.manifest = Some(w);
        if let (Some(r), Some((target, info))) = (self.sink.reference, self.summaries_from) {
            // Before 17 there are none: no connection to be told so.
            let read = if let Some(why) = crate::pg::walsummary::unavailable(info.version_num) {
                Ok(Err(why))
            } else {
                crate::pg::session::Session::aside(target, |sess| {
                    crate::pg::walsummary::summarized_changes(
                        sess,
                        info.version_num,
                        r.timeline,
                        r.start_lsn,
                        start_lsn,
                        &info.tablespace_dir(),
                    )
                })
            };
            // A query the role may not run: the changed blocks are found without them.
            let read = read.unwrap_or_else(|e| Err(e.with_causes()));
            match read {
                Ok(c) => {
                    tracing::info!(
                        "WAL summaries from {} to {start_lsn}: {} block changes listed (a block changed twice counts twice); only the blocks changed are read",
                        r.start_lsn,
                        c.blocks
                    );
                    self.summaries = Some(c);
                }
                Err(why) => tracing::info!("WAL summaries not used ({why})"),
            }
        }
        Ok(())
    }

    fn copy(
        &mut self,
        source: &dyn Source,
        files: &[SourceFile],
        opts: &ReadOptions,
        progress: &dyn Progress,
    ) -> Result<CopyOutcome> {
        tracing::debug!("memory with the listing: {}", crate::io::mem::memory_note());
        let (bundle_bytes, bundle_files) = crate::transfer::bundle_limits();
        // A diff or incr whose source finds changed blocks where the bytes are reads only
        // those; the rest of such a file comes from the reference as it is (seeds).
        // Without WAL summaries, the WAL itself (pg_wal here, or the archive) may list the
        // changed blocks; else the source compares page LSNs.
        if let (Some(r), None) = (self.sink.reference, &self.summaries) {
            self.summaries = self.scan_wal(source, r, files.iter().map(|f| f.size).sum());
        }
        let plan = match (self.sink.reference, &self.summaries) {
            (Some(r), Some(c)) => r.read_plan(files, &|q: &[(String, u64)]| {
                Ok(Some(q.iter().map(|(p, n)| c.blocks_of(p, *n)).collect()))
            })?,
            (Some(r), None) => r.read_plan(files, &|q: &[(String, u64)]| {
                source.changed_blocks(q, r.start_lsn)
            })?,
            (None, _) => None,
        };
        let (units, seeds) = match plan {
            Some(p) => {
                let total: u64 = files.iter().map(|f| f.size).sum();
                let blocks = if p.blocks.0 > 0 {
                    format!(
                        "{} of {} blocks of relation files changed since the reference; ",
                        p.blocks.1, p.blocks.0
                    )
                } else {
                    String::new()
                };
                tracing::info!(
                    "{}: {blocks}{} of {} bytes to read",
                    source.describe(),
                    total - p.skipped,
                    total
                );
                progress.advance(p.skipped);
                let ranges = &p.ranges;
                let units = crate::transfer::plan_ranges_bundled(
                    files,
                    &|i| ranges[i].clone(),
                    CHUNK_SIZE,
                    bundle_bytes,
                    bundle_files,
                )?;
                (units, p.seeds)
            }
            None => (
                crate::transfer::plan_units_bundled(files, CHUNK_SIZE, bundle_bytes, bundle_files)?,
                Vec::new(),
            ),
        };
        tracing::debug!(
            "{} units planned; memory: {}",
            units.len(),
            crate::io::mem::memory_note()
        );
        let sink = self.sink;
        let manifest = self.manifest.as_mut().ok_or_else(manifest_not_started)?;
        manifest.journal_total(files.iter().map(|f| f.size).sum());
        let mut emit = |i: usize, pieces: Vec<Vec<Piece>>, errs: Vec<u32>, whole: bool| {
            let covered = pieces.last().map_or(0, |p| p.logical_end());
            let entry = super::manifest::file_entry(&files[i], pieces, errs);
            if whole {
                manifest.file(&entry)
            } else {
                manifest.partial(entry, covered)
            }
        };
        let mut asm = FileAssembler::with_seeds(files, &units, seeds, &mut emit)?;
        // A resume journal saves large files in part too.
        asm.prefixes = sink.journal.is_some();
        copy_units_into(source, files, &units, opts, sink, &mut asm, progress)?;
        tracing::debug!("units copied; memory: {}", crate::io::mem::memory_note());
        let mut out = CopyOutcome {
            vanished: vec![false; files.len()],
            page_error_count: asm.page_error_count,
            ..Default::default()
        };
        for i in asm.vanished {
            tracing::debug!(
                "{} vanished during the copy (dropped); left out",
                files[i].path
            );
            out.vanished[i] = true;
        }
        Ok(out)
    }
}

impl RepoTarget<'_> {
    /// The blocks WAL changed between the reference's start and this backup's, read from
    /// the WAL segments ([`crate::pg::walscan`]): the source's `pg_wal` first (this host's
    /// files), then the stanza's archive. None, with the reason logged, when they cannot
    /// tell (a segment missing or recycled, no server facts), or when there is more WAL than
    /// `total`, the bytes of the files (reading the pages is cheaper then).
    fn scan_wal(
        &self,
        source: &dyn Source,
        r: &super::incremental::Reference,
        total: u64,
    ) -> Option<crate::pg::walsummary::SummarizedChanges> {
        let (_, info) = self.summaries_from?;
        let (from, to) = (r.start_lsn, self.header.start_lsn);
        let seg_size = info.wal_segment_size;
        if to.0.saturating_sub(from.0) > total {
            tracing::info!(
                "the WAL from {from} to {to} is larger than the data: the changed blocks are found by page LSN"
            );
            return None;
        }
        // The WAL up to this backup's start is in pg_wal only (not archived yet): a source
        // that does not read pg_wal cannot scan it.
        // Only the pages the scan reads are read.
        let last_segno = to.0 / seg_size;
        let last = crate::pg::lsn::wal_segment_name(r.timeline, last_segno, seg_size);
        let mut last_bytes = match source.wal_for_scan(r.timeline, last_segno, seg_size, (from, to))
        {
            Ok(Some(b)) => Some(b),
            Ok(None) => {
                tracing::debug!("{}: no pg_wal/{last} to scan", source.describe());
                return None;
            }
            Err(e) => {
                tracing::info!(
                    "pg_wal/{last} cannot be read ({e}): the changed blocks are found by page LSN"
                );
                return None;
            }
        };
        let stanza = self.sink.backup.stanza();
        let fetch = |segno: u64| -> Result<Option<Vec<u8>>> {
            if segno == last_segno {
                if let Some(b) = last_bytes.take() {
                    return Ok(Some(b));
                }
            }
            if let Some(b) = source.wal_for_scan(r.timeline, segno, seg_size, (from, to))? {
                return Ok(Some(b));
            }
            let name = crate::pg::lsn::wal_segment_name(r.timeline, segno, seg_size);
            let file = super::wal::WalFile::parse(&name)?;
            Ok(super::wal::fetch(stanza, &file)?.map(|(_, b)| b))
        };
        let clock = std::time::Instant::now();
        let (scanned, segments) =
            crate::pg::walscan::scan(fetch, seg_size, from, to, &info.tablespace_dir());
        match scanned {
            Ok(c) => {
                tracing::info!(
                    "WAL from {from} to {to} ({segments} segments, {:.1} s): {} block changes listed (a block changed twice counts twice); only the blocks changed are read",
                    clock.elapsed().as_secs_f64(),
                    c.blocks
                );
                Some(c)
            }
            Err(why) => {
                tracing::info!(
                    "the WAL from {from} to {to} cannot list the changed blocks ({why}): they are found by page LSN"
                );
                None
            }
        }
    }
}

/// Stores pg_control as an object of its own, from bytes whose CRC was checked, so the
/// backup never holds a control file PostgreSQL would reject.
pub fn store_control(sink: &RepoSink, control: &SourceFile, bytes: &[u8]) -> Result<FileEntry> {
    let piece = ReadPiece {
        spec: PieceSpec::new(0, 0, bytes.len() as u64)?,
        path: &control.path,
        data: bytes,
        zero_pages: Vec::new(),
        xxh3: crate::codec::xxh3_hex(bytes),
        crc32c: crate::codec::crc32c(bytes),
    };
    let mut state = sink.new_state()?;
    let pieces = sink.write_unit(&mut state, &[piece], &mut || {})?;
    let f = SourceFile {
        size: bytes.len() as u64,
        ..control.clone()
    };
    Ok(super::manifest::file_entry(&f, pieces, Vec::new()))
}

/// The manifest of a backup written from a stream ([`crate::transfer::stream_units`]): the header
/// once the stream announces its start LSN and tablespaces, then each directory and file
/// as it is stored.
pub struct StreamManifest<'a> {
    sink: &'a RepoSink<'a>,
    /// The manifest's header; `started` fills in the start LSN and the tablespaces.
    header: ManifestHeader,
    /// Names of the tablespaces by OID: (oid, name, location) from pg_tablespace.
    spcs: &'a [(u32, String, String)],
    /// Started by `started`.
    pub manifest: Option<ManifestWriter>,
}

impl<'a> StreamManifest<'a> {
    pub fn new(
        sink: &'a RepoSink<'a>,
        header: ManifestHeader,
        spcs: &'a [(u32, String, String)],
    ) -> StreamManifest<'a> {
        StreamManifest {
            sink,
            header,
            spcs,
            manifest: None,
        }
    }
}

impl StreamCollector<Vec<Piece>> for StreamManifest<'_> {
    fn started(&mut self, start: &StreamStart) -> Result<()> {
        self.header.start_lsn = start.start_lsn;
        self.header.tablespaces = start
            .tablespaces
            .iter()
            .map(|(oid, location)| Tablespace {
                oid: *oid,
                name: self
                    .spcs
                    .iter()
                    .find(|(o, _, _)| o == oid)
                    .map(|x| x.1.clone())
                    .unwrap_or_else(|| oid.to_string()),
                location: location.clone(),
            })
            .collect();
        self.manifest = Some(self.sink.begin_manifest(self.header.clone())?);
        Ok(())
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.manifest
            .as_mut()
            .ok_or_else(manifest_not_started)?
            .dir(&DirEntry {
                path: path.to_string(),
                mode,
            })
    }

    fn file(
        &mut self,
        f: &SourceFile,
        pieces: Vec<Vec<Piece>>,
        page_errors: Vec<u32>,
    ) -> Result<()> {
        self.manifest
            .as_mut()
            .ok_or_else(manifest_not_started)?
            .file(&super::manifest::file_entry(f, pieces, page_errors))
    }
}
