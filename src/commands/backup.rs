//! `backup --type full`: a self-contained full backup of a running cluster on this host.
//!
//! Order of work (the same as PostgreSQL's base backup, src/backend/backup/basebackup.c):
//! a temporary replication slot reserves WAL; pg_backup_start; every file but pg_control is
//! copied in parallel; pg_control last; pg_backup_stop; the WAL from the start to the stop
//! LSN is copied from pg_wal (the slot kept it); all stored bytes are made durable; the
//! manifest is written last, and only its presence makes the backup complete.
use super::*;
use crate::cli::BackupArgs;
use crate::pg::datadir::{self, Listing};
use crate::pg::lsn::parse_backup_label;
use crate::repo::{self, BackupManifest, DirEntry, StanzaLock, Tablespace};
use crate::storage::Storage;
use crate::transfer::sink::RepoSink;
use crate::transfer::{
    copy_files, CopyOutcome, PieceSpec, Progress, ReadOptions, ReadPiece, SourceFile, UnitSink,
};
use serde::Serialize;

/// What `backup` reports at the end.
#[derive(Debug, Serialize)]
pub struct BackupSummary {
    pub label: String,
    /// Logical bytes.
    pub size: u64,
    /// Stored bytes.
    pub stored_size: u64,
    pub files: usize,
    pub seconds: f64,
    /// Logical MiB per second.
    pub mib_per_sec: f64,
    pub start_lsn: String,
    pub stop_lsn: String,
    pub page_errors: usize,
}

/// The files of a live cluster as the engine wants them: everything but pg_control, and
/// pg_control on its own (it is copied last).
pub fn source_files(listing: &Listing) -> (Vec<SourceFile>, Option<SourceFile>) {
    let mut files = Vec::with_capacity(listing.files.len());
    let mut control = None;
    for f in &listing.files {
        let sf = SourceFile {
            path: f.rel.clone(),
            abs: f.abs.clone(),
            size: f.size,
            mtime: f.mtime,
            mode: f.mode,
            checksum_segno: f.checksum_segno,
        };
        if f.rel == "global/pg_control" {
            control = Some(sf);
        } else {
            files.push(sf);
        }
    }
    (files, control)
}

/// Stores pg_control as an object of its own, from bytes whose CRC was checked (a torn read
/// is read again), so the backup never holds a control file PostgreSQL would reject.
fn store_control(sink: &RepoSink, control: &SourceFile) -> Result<repo::FileEntry> {
    let bytes = crate::pg::control::read_control_file(&control.abs)?;
    let piece = ReadPiece {
        spec: PieceSpec {
            file: 0,
            offset: 0,
            len: bytes.len() as u64,
        },
        data: &bytes,
        zero_pages: Vec::new(),
        xxh3: crate::codec::xxh3_hex(&bytes),
        crc32c: crate::codec::crc32c(&bytes),
    };
    let mut state = sink.new_state()?;
    let pieces = sink.write_unit(&mut state, &[piece])?;
    let f = SourceFile {
        size: bytes.len() as u64,
        ..control.clone()
    };
    Ok(file_entry(&f, pieces, Vec::new()))
}

/// Fails when any of `files` vanished during the copy: for pg_control and the backup's WAL
/// that means the backup cannot be restored (a WAL segment was removed or recycled).
pub fn require_all(files: &[SourceFile], vanished: &[bool]) -> Result<()> {
    match files.iter().zip(vanished).find(|(_, gone)| **gone) {
        Some((f, _)) => Err(Error::Unsafe(format!(
            "{} disappeared while it was being copied; the backup would not be restorable",
            f.abs.display()
        ))),
        None => Ok(()),
    }
}

/// Turns copied files and their outcome into manifest entries, leaving out vanished files.
pub fn entries(files: &[SourceFile], out: CopyOutcome) -> (Vec<repo::FileEntry>, usize) {
    let mut errors = 0;
    let mut v = Vec::with_capacity(files.len());
    for (((f, pieces), errs), vanished) in files
        .iter()
        .zip(out.pieces)
        .zip(out.page_errors)
        .zip(out.vanished)
    {
        if vanished {
            tracing::debug!("{} vanished during the copy (dropped); left out", f.path);
            continue;
        }
        errors += errs.len();
        v.push(file_entry(f, pieces, errs));
    }
    (v, errors)
}

/// Runs `backup`.
pub fn run(s: &Settings, args: &BackupArgs, progress: &dyn Progress) -> Result<BackupSummary> {
    // Only full backups exist so far; args.backup_type can only be Full.
    let stanza = s.stanza()?;
    let pg_path = s.pg_path()?;
    let store = open_repo(s)?;
    let stanza_info = repo::read_stanza(&store, stanza)?;
    let sess = connect_local(s)?;
    let info = sess.server_info()?;
    let pgdata = check_pg_path(pg_path, &info)?;
    repo::check_same_cluster(&stanza_info, info.system_identifier, &info.major())?;
    if info.in_recovery {
        return Err(Error::Unsafe("the cluster is a standby: backups from a standby are not supported yet; back up the primary".into()));
    }
    let _lock = StanzaLock::acquire(s.repo_path()?, stanza)?;
    for stale in repo::list_incomplete(&store, stanza)? {
        tracing::warn!("removing interrupted backup {stale} (it has no manifest)");
        store.remove_all(&repo::backup_dir(stanza, &stale))?;
    }
    let mut started = chrono::Utc::now();
    let mut label = new_label(started);
    while store.exists(&repo::backup_dir(stanza, &label))?
        || repo::list_complete(&store, stanza)?.contains(&label)
    {
        std::thread::sleep(std::time::Duration::from_millis(250));
        started = chrono::Utc::now();
        label = new_label(started);
    }
    let clock = std::time::Instant::now();
    let spcs = sess.tablespaces()?;

    // Keep the WAL from here to the end of the backup; the slot dies with the session.
    let slot = format!("pgjet_{}", std::process::id());
    sess.create_physical_slot(&slot, true)?;
    let start_lsn = sess.backup_start(&format!("pgjet {label}"), args.start_fast)?;
    tracing::info!("backup {label} started at LSN {start_lsn}");

    let listing = datadir::list_data_directory(
        &pgdata,
        info.version_num,
        &info.tablespace_dir(),
        info.data_checksums,
    )?;
    let (files, control) = source_files(&listing);
    let control = control
        .ok_or_else(|| Error::Unsafe(format!("{} has no global/pg_control", pgdata.display())))?;
    let opts = ReadOptions {
        jobs: s.jobs,
        verify_checksums: info.data_checksums,
        backup_start_lsn: start_lsn.0,
    };
    let sink = RepoSink::new(&store, stanza, &label, s.compression);
    let total: u64 = files.iter().map(|f| f.size).sum::<u64>() + control.size;
    progress.begin("backup", total);
    let out = copy_files(&files, &opts, &sink, progress)?;
    let control_entry = store_control(&sink, &control)?;
    progress.advance(control.size);
    let stop = sess.backup_stop()?;
    let label_info = parse_backup_label(&stop.backup_label).map_err(|e| {
        Error::Other(format!(
            "pg_backup_stop returned a backup_label pgjet cannot read: {e}"
        ))
    })?;
    tracing::info!("backup {label} stopped at LSN {}", stop.lsn);

    let wal = wal_source_files(
        &pgdata,
        label_info.start_timeline,
        start_lsn,
        stop.lsn,
        info.wal_segment_size,
        info.system_identifier,
    )?;
    let wal_opts = ReadOptions {
        verify_checksums: false,
        ..opts
    };
    progress.finish();
    // The WAL's size is known only after pg_backup_stop: a phase of its own.
    progress.begin("WAL", wal.iter().map(|f| f.size).sum());
    let out_wal = copy_files(&wal, &wal_opts, &sink, progress)?;
    require_all(&wal, &out_wal.vanished)?;
    sess.check_slot_holds(&slot)?;
    progress.finish();
    sess.close();

    let (mut file_entries, page_errors) = entries(&files, out);
    file_entries.push(control_entry);
    file_entries.extend(entries(&wal, out_wal).0);
    file_entries.sort_by(|a, b| a.path.cmp(&b.path));
    let size: u64 = file_entries.iter().map(|f| f.size).sum();
    let stored_size = sink.stored.load(std::sync::atomic::Ordering::Relaxed);
    let tablespaces = listing
        .tablespaces
        .iter()
        .map(|t| Tablespace {
            oid: t.oid,
            name: spcs
                .iter()
                .find(|(o, _, _)| *o == t.oid)
                .map(|x| x.1.clone())
                .unwrap_or_else(|| t.oid.to_string()),
            location: t.target.display().to_string(),
        })
        .collect();
    let stopped = chrono::Utc::now();
    let manifest = BackupManifest {
        format: repo::REPO_FORMAT,
        label: label.clone(),
        backup_type: "full".into(),
        stanza: stanza.into(),
        system_identifier: info.system_identifier,
        pg_version: info.major(),
        pg_version_num: info.version_num,
        catalog_version: info.catalog_version,
        start_time: rfc3339(started),
        stop_time: rfc3339(stopped),
        start_lsn,
        stop_lsn: stop.lsn,
        timeline: label_info.start_timeline,
        wal_segment_size: info.wal_segment_size,
        block_size: info.block_size,
        data_checksums: info.data_checksums,
        compression: s.compression,
        backup_label: stop.backup_label,
        tablespace_map: stop.tablespace_map,
        tablespaces,
        wal_segments: wal
            .iter()
            .filter_map(|w| w.path.strip_prefix("pg_wal/"))
            .filter(|n| lsn::is_wal_segment_name(n))
            .map(str::to_owned)
            .collect(),
        size,
        stored_size,
        directories: listing
            .dirs
            .iter()
            .map(|(p, m)| DirEntry {
                path: p.clone(),
                mode: *m,
            })
            .collect(),
        files: file_entries,
    };
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::Other(format!("cannot encode the manifest: {e}")))?;
    // Every object first, then the manifest: a backup is complete only once both are durable.
    store.sync()?;
    store.put_durable(&repo::manifest_name(stanza, &label), &json)?;
    let seconds = clock.elapsed().as_secs_f64();
    if page_errors > 0 {
        tracing::warn!("backup {label}: {page_errors} page(s) failed checksum validation; they are listed in the manifest");
    }
    Ok(BackupSummary {
        label,
        size,
        stored_size,
        files: manifest.files.len(),
        seconds,
        mib_per_sec: size as f64 / (1 << 20) as f64 / seconds.max(1e-6),
        start_lsn: start_lsn.to_string(),
        stop_lsn: stop.lsn.to_string(),
        page_errors,
    })
}
