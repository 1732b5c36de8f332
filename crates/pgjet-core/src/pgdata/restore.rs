//! A repository backup written into a prepared data directory (`restore`): the files, read
//! back and checked in parallel (`crate::repo::read_back`), PostgreSQL's own
//! `backup_manifest` written as they pass, then the one finish ([`super::finish`]) with
//! pg_control read from the repository last.
use super::finish::{finish, Finish};
use super::write::{allocate_pieces, DataDirWriter};
use super::{create_file, delta_target, remap_tablespace_map, TargetSync};
use crate::codec::CompressType;
use crate::error::{Error, Result};
use crate::io::direct::DIRECT_MIN_WRITE;
use crate::io::fs::set_mtime;
use crate::pg::pg_manifest::{PgManifestWriter, PgWalRange};
use crate::repo::read_back::{restore_one, PieceWant, ReadBack, Want};
use crate::repo::{Backup, FileEntry, ScannedManifest};
use crate::transfer::Progress;
use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where restore takes the files of the backup from.
pub enum Files {
    /// A second pass over the stored manifest ([`repo::ManifestReader`]); the targets are
    /// empty and each file is created as its line passes.
    Streamed,
    /// The manifest's files, read whole for a delta restore, and for each file what to do
    /// with each piece (`crate::repo::restore_delta::pieces_needed`).
    InMemory(Vec<FileEntry>, Vec<Vec<PieceWant>>),
}

/// A restore into a prepared data directory.
pub struct RestoreInto<'a> {
    /// The backup restored.
    pub backup: &'a Backup<'a>,
    /// The backup, its manifest checked whole.
    pub scan: &'a ScannedManifest,
    /// The older backups its pieces name ([`crate::repo::chain::open_chain`]).
    pub chain: &'a [(String, CompressType)],
    pub pg_path: &'a Path,
    /// (tablespace OID, chosen location).
    pub locations: &'a [(u32, PathBuf)],
    /// Threads that check and expand frames.
    pub jobs: usize,
    /// Lines for postgresql.auto.conf (the recovery settings and the like).
    pub auto_conf: Vec<String>,
    /// The note for commenting out inherited recovery settings; None keeps them (`--type
    /// preserve`).
    pub replace_recovery_settings: Option<String>,
    /// `recovery.signal`, `standby.signal` or none.
    pub signal: Option<&'static str>,
}

/// PostgreSQL's `backup_manifest` of the restored directory, so pg_verifybackup can check
/// it (written as the files pass, ended after backup_label and tablespace_map).
type PgManifest = PgManifestWriter<BufWriter<File>>;

/// Restores the backup into `r.pg_path`: the files of `files` (a delta: only the pieces it
/// marks, into files that may exist already), then the finish: backup_label, the settings,
/// PostgreSQL's backup_manifest, a sync, and pg_control last.
///
/// Errors: any read, check or write failure ([`Error::Corrupt`] names damaged files).
pub fn restore_into(r: &RestoreInto, files: Files, progress: &dyn Progress) -> Result<()> {
    // Phase times at debug level: what a slow restore spent its time on.
    let clock = std::time::Instant::now();
    let phase =
        |what: &str| tracing::debug!("restore: {what} at {} ms", clock.elapsed().as_millis());
    let sync = TargetSync::open(r.pg_path, r.locations)?;
    let pgm_path = r.pg_path.join("backup_manifest");
    let h = &r.scan.summary.header;
    let pgm_mode = super::DataDirModes::of_dir(r.pg_path)?.file;
    let pgm_file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(pgm_mode)
        .open(&pgm_path)
        .map_err(|e| Error::io("create", &pgm_path, e))?;
    crate::io::fs::set_exact_mode(&pgm_file, &pgm_path, pgm_mode)?;
    let mut pgm = PgManifestWriter::new(
        BufWriter::with_capacity(1 << 20, pgm_file),
        h.pg_version_num,
        h.system_identifier,
    )
    .map_err(|e| Error::io("write", &pgm_path, e))?;
    let created = write_files(r, files, &mut pgm, &pgm_path, progress)?;
    phase(&format!("{created} files created and written"));
    finish_restore(r, &sync, pgm, &pgm_path, &phase)?;
    phase("pg_control written");
    Ok(())
}

/// The files phase: each file, as its manifest line passes, goes into backup_manifest and is
/// created (or, for a delta, opened and sized), its ranges allocated; then read-back writes
/// the checked pieces. pg_control is left for the finish. Returns the files created.
fn write_files(
    r: &RestoreInto,
    files: Files,
    pgm: &mut PgManifest,
    pgm_path: &Path,
    progress: &dyn Progress,
) -> Result<u64> {
    let (h, end) = (&r.scan.summary.header, &r.scan.summary.end);
    let delta = matches!(files, Files::InMemory(..));
    let writer = DataDirWriter {
        root: r.pg_path,
        overwrite: delta,
    };
    let rb = ReadBack {
        backup: r.backup,
        kind: h.compression.kind,
        chain: r.chain,
        contiguous: r.scan.contiguous,
        target: Some(&writer),
        jobs: r.jobs,
    };
    let mut can_allocate = true;
    let mut created = 0u64;
    let (files, needed) = match files {
        Files::Streamed => (None, Vec::new()),
        Files::InMemory(f, n) => (Some(f), n),
    };
    let mut needed = needed.into_iter();
    let mut prepare = |f: &FileEntry| -> Result<Want> {
        let wanted = if delta { needed.next() } else { None };
        // A file whose pieces lie partly in an older backup's frames has no CRC in the
        // manifest: read-back computes it from the bytes written, and its line follows then.
        if let (false, Some(crc)) = (f.path.starts_with("pg_wal/"), f.crc32c) {
            pgm.file(&f.path, f.size, f.mtime, crc)
                .map_err(|e| Error::io("write", pgm_path, e))?;
        }
        if f.path == "global/pg_control" {
            return Ok(Want::Nothing);
        }
        // A small file of one piece is made by the writer of that piece, in one open.
        if !delta && f.pieces.len() == 1 && f.size < DIRECT_MIN_WRITE as u64 {
            created += 1;
            return Ok(Want::Create(f.mode));
        }
        let (path, file, want) = match wanted {
            Some(w) => {
                let (p, file, _) = delta_target::size_file(r.pg_path, &f.path, f.size, f.mode)?;
                (p, file, Want::Pieces(w))
            }
            None => {
                let (p, file) = create_file(r.pg_path, &f.path, f.size, f.mode)?;
                (p, file, Want::All)
            }
        };
        if can_allocate && !f.pieces.is_empty() {
            can_allocate = allocate_pieces(&file, &path, f)?;
        }
        created += 1;
        Ok(want)
    };
    progress.begin("restore", end.size);
    let outcome = match files {
        None => {
            let stream = r.backup.manifest_reader()?.files();
            rb.run(stream, &mut prepare, progress)?
        }
        Some(files) => rb.run(files.into_iter().map(Ok), &mut prepare, progress)?,
    };
    progress.finish();
    if outcome.equal_pieces > 0 {
        tracing::info!(
            "delta: {} more piece(s) ({}) read back and found equal to the target's bytes: not written",
            outcome.equal_pieces,
            crate::io::mib(outcome.equal_bytes)
        );
    }
    for (path, size, mtime, crc) in outcome.crcs {
        if !path.starts_with("pg_wal/") {
            pgm.file(&path, size, mtime, crc)
                .map_err(|e| Error::io("write", pgm_path, e))?;
        }
    }
    Ok(created)
}

/// The finish of a restore: backup_label, tablespace_map and the settings; backup_manifest
/// ended with those two files and the backup's WAL range; the sync; pg_control read from
/// the repository last.
fn finish_restore(
    r: &RestoreInto,
    sync: &TargetSync,
    mut pgm: PgManifest,
    pgm_path: &Path,
    phase: &dyn Fn(&str),
) -> Result<()> {
    let (h, stop) = (&r.scan.summary.header, &r.scan.summary.end.stop);
    let pgm_io = |e: std::io::Error| Error::io("write", pgm_path, e);
    let spcmap = (!h.tablespaces.is_empty()).then(|| remap_tablespace_map(r.locations));
    let label_text = stop.backup_label.as_bytes();
    let write_pg_manifest = || -> Result<()> {
        let now = chrono::Utc::now().timestamp();
        let crc = crate::codec::crc32c;
        pgm.file(
            "backup_label",
            label_text.len() as u64,
            now,
            crc(label_text),
        )
        .map_err(pgm_io)?;
        if let Some(text) = &spcmap {
            pgm.file(
                "tablespace_map",
                text.len() as u64,
                now,
                crc(text.as_bytes()),
            )
            .map_err(pgm_io)?;
        }
        let wal = [PgWalRange {
            timeline: stop.timeline,
            start: h.start_lsn,
            end: stop.stop_lsn,
        }];
        pgm.finish(&wal)
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .and_then(|f| f.sync_all())
            .map_err(pgm_io)?;
        phase("backup_label, settings and backup_manifest written");
        Ok(())
    };
    let write_control = || -> Result<()> {
        phase("syncfs done");
        let cf = &r.scan.control;
        let (path, _) = create_file(r.pg_path, &cf.path, cf.size, cf.mode)?;
        let writer = DataDirWriter {
            root: r.pg_path,
            overwrite: false,
        };
        restore_one(r.backup, h.compression.kind, cf, &writer)?;
        set_mtime(&path, cf.mtime)?;
        File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io("fsync", &path, e))
    };
    finish(
        r.pg_path,
        sync,
        &Finish {
            backup_label: label_text,
            tablespace_map: spcmap.clone(),
            replace_recovery_settings: r.replace_recovery_settings.clone(),
            auto_conf: r.auto_conf.clone(),
            signal: r.signal,
        },
        write_pg_manifest,
        write_control,
    )
}
