//! A backup's copy into the repository, by transport: the primary's files (this host's, or
//! ranges over libpq) through the shared base-backup sequence ([`super::backup_sequence`]), or
//! the server's own `BASE_BACKUP` stream ([`super::stream_sequence`]) cut into the repository's units
//! as it arrives. Either way pg_control is stored last and listed in the manifest; the
//! caller writes the manifest's end line once everything is durable.
use super::backup_sequence::{run_base_backup, BaseBackupOptions};
use super::stream_sequence::{run_stream_backup, StreamOptions};
use super::{Primary, StreamPrimary};
use crate::error::{Error, Result};
use crate::options::{BackupOptions, PrimaryConn};
use crate::pg::lsn::{self, parse_backup_label, Lsn};
use crate::remote::basebackup::HeldFile;
use crate::repo::backup_target::{manifest_not_started, store_control, RepoTarget, StreamManifest};
use crate::repo::manifest_io::ManifestWriter;
use crate::repo::sink::RepoSink;
use crate::repo::ManifestHeader;
use crate::transfer::stream_units::{stream_units, StreamSink};
use crate::transfer::{bundle_limits, Progress, ReadOptions, SourceFile};
use std::sync::atomic::Ordering;

/// What a copy into the repository produced, whichever transport: the manifest so far
/// (pg_control stored and listed) and what its end line needs.
pub struct Copied {
    pub manifest: ManifestWriter,
    /// Bytes of the stored objects.
    pub stored_size: u64,
    pub start_lsn: Lsn,
    pub stop_lsn: Lsn,
    pub timeline: u32,
    pub backup_label: String,
    pub tablespace_map: Option<String>,
    /// WAL segment names stored under pg_wal/, first to last.
    pub wal_segments: Vec<String>,
    pub page_errors: usize,
    /// The databases after the backup stopped ([`crate::pg::session::Session::databases`]).
    pub databases: Vec<(u32, u32)>,
}

/// The copy over file ranges (this host's files, or libpq connections): the shared
/// base-backup sequence into a [`RepoTarget`], then pg_control.
pub fn copy_ranges(
    primary: Primary,
    sink: &RepoSink,
    header: ManifestHeader,
    spcs: &[(u32, String, String)],
    args: &BackupOptions,
    pg_label: &str,
    progress: &dyn Progress,
) -> Result<Copied> {
    let mut target = RepoTarget {
        sink,
        header,
        spcs,
        manifest: None,
        summaries_from: Some((&primary.target, &primary.info)),
        summaries: None,
    };
    let bb = run_base_backup(
        &primary.sess,
        &primary.info,
        primary.source.as_ref(),
        spcs,
        &mut target,
        &BaseBackupOptions {
            label: pg_label,
            start_fast: args.start_fast,
            jobs: primary.jobs,
            phase: "backup",
        },
        progress,
    )?;
    let control_entry = store_control(sink, &bb.control, &bb.control_bytes)?;
    let databases = primary.sess.databases()?;
    let manifest = target.manifest.take();
    drop(target);
    primary.close();
    let mut manifest = manifest.ok_or_else(manifest_not_started)?;
    manifest.file(&control_entry)?;
    Ok(Copied {
        manifest,
        stored_size: sink.stored.load(Ordering::Relaxed),
        start_lsn: bb.start_lsn,
        stop_lsn: bb.stop.lsn,
        timeline: bb.label.start_timeline,
        backup_label: bb.stop.backup_label,
        tablespace_map: bb.stop.tablespace_map,
        wal_segments: wal_segment_names(bb.wal.iter().map(|w| &*w.path)),
        page_errors: bb.out.page_error_count,
        databases,
    })
}

/// The copy over the server's `BASE_BACKUP` stream (`--transport basebackup`): compressed on
/// the primary, decoded here and cut into the repository's units as it arrives
/// ([`stream_units`]), every file checked against the server's backup_manifest, the WAL from
/// the stream; then pg_control (CRC checked).
#[allow(clippy::too_many_arguments)]
pub fn copy_stream(
    s: &PrimaryConn,
    stream: &StreamPrimary,
    sink: &RepoSink,
    header: ManifestHeader,
    spcs: &[(u32, String, String)],
    args: &BackupOptions,
    pg_label: &str,
    progress: &dyn Progress,
) -> Result<Copied> {
    let info = &stream.info;
    let catalog_version = header.catalog_version;
    let mut collector = StreamManifest::new(sink, header, spcs);
    let read_opts = ReadOptions {
        jobs: s.jobs,
        verify_checksums: info.data_checksums,
        backup_start_lsn: 0,
    };
    let opts = StreamOptions {
        label: pg_label.to_string(),
        fast: args.start_fast,
        compress: stream.compress,
        level: stream.level,
        max_rate: s.max_rate,
        wal: true,
        tablespace_map: true,
        workers: stream.workers,
        incremental: None,
    };
    let run = |units: &mut dyn StreamSink| {
        let early = stream.early.lock().ok().and_then(|mut e| e.take());
        run_stream_backup(&*stream.ctl, info, &stream.target, early, &opts, units)
    };
    let streamed = stream_units(
        sink,
        &read_opts,
        bundle_limits(),
        &mut collector,
        progress,
        "backup",
        run,
    );
    progress.finish();
    let (sb, copied) = streamed?;
    let d = &sb.outcome.decoded;
    let text = |f: &Option<HeldFile>| {
        f.as_ref()
            .map(|f| String::from_utf8_lossy(&f.bytes).into_owned())
    };
    let backup_label = text(&d.backup_label).unwrap_or_default();
    let label = parse_backup_label(&backup_label)
        .map_err(|e| Error::Other("the stream's backup_label cannot be read".into()).because(e))?;
    let control = d.control.clone().unwrap_or_default();
    // The manifest's catalog version is the stanza's when no session could read it
    // (replication only): the copy's own pg_control must agree.
    if let Some(c) = crate::pg::control::parse_control(&control.bytes) {
        if c.catalog_version != catalog_version {
            return Err(Error::Unsafe(format!(
                "the copy's pg_control has catalog version {}, the stanza {catalog_version}: the cluster is not the stanza's",
                c.catalog_version
            )));
        }
    }
    let control_file = SourceFile {
        mtime: control.mtime,
        mode: if control.mode == 0 {
            0o600
        } else {
            control.mode
        },
        ..SourceFile::plain("global/pg_control", control.bytes.len() as u64)
    };
    let control_entry = store_control(sink, &control_file, &control.bytes)?;
    // Without a session (replication only) the databases are not known: the backup is a
    // full (commands/backup.rs), which compares none.
    let databases = match stream.ctl.session() {
        Some(sess) => sess.databases()?,
        None => Vec::new(),
    };
    let mut manifest = collector.manifest.take().ok_or_else(manifest_not_started)?;
    manifest.file(&control_entry)?;
    tracing::info!(
        "backup over the BASE_BACKUP stream ({}): {} files, {} bytes in {} bytes on the wire",
        sb.codec.name(),
        copied.files,
        d.logical_bytes,
        d.wire_bytes
    );
    Ok(Copied {
        manifest,
        stored_size: sink.stored.load(Ordering::Relaxed),
        start_lsn: sb.outcome.start_lsn,
        stop_lsn: sb.outcome.end_lsn,
        timeline: label.start_timeline,
        backup_label,
        tablespace_map: text(&d.tablespace_map).filter(|t| !t.is_empty()),
        wal_segments: wal_segment_names(d.received.wal.iter().map(String::as_str)),
        page_errors: copied.page_error_count,
        databases,
    })
}

/// The WAL segment names among `paths` under pg_wal/, sorted (first to last).
fn wal_segment_names<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<String> = paths
        .filter_map(|p| p.strip_prefix("pg_wal/"))
        .filter(|n| lsn::is_wal_segment_name(n))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}
