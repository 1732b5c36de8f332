//! `backup --type full|diff|incr`: a backup of a running cluster, on this host or (with
//! --source) on another one over libpq. A full is self-contained; a diff or incr stores only
//! the blocks and files changed since its reference ([`crate::repo::incremental`]) and names
//! the older backups that hold the rest.
//!
//! The copy is the shared base-backup sequence ([`crate::primary::backup_sequence`]); then all stored
//! bytes are made durable and the manifest is written last: only its presence makes the
//! backup complete.
use crate::error::Result;
use crate::options::Settings;
use crate::options::{BackupOptions, BackupType};
use crate::pg::lsn::Lsn;
use crate::primary::archiving::{
    archive_command_line, backup_waits_for_archive, wait_for_backup_wal,
};
use crate::primary::repo_copy::{copy_ranges, copy_stream};
use crate::primary::Copier;
use crate::repo;
use crate::repo::incremental::Reference;
use crate::repo::open::{open_other_stanzas, open_stanza};
use crate::repo::resume::{self, JournalStart};
use crate::repo::sink::RepoSink;
use crate::repo::{ManifestHeader, StopInfo};
use crate::transfer::Progress;
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
    /// True when an interrupted backup was resumed into this one.
    pub resumed: bool,
    /// Logical bytes kept from the interrupted attempts of a resumed backup.
    pub reused: u64,
}

/// Runs `backup`.
///
/// One function on purpose (over 120 lines): it is the backup's sequence, in the order the
/// repository's guarantees need: the stanza and the cluster agree, the lock, interrupted
/// backups removed, a label unique in every repository, the copy (file ranges, or the
/// server's stream), the WAL in the archive, every object durable, the lock checked, the
/// manifest and summary last, then expire. Split up, that order would be hidden.
pub fn run(s: &Settings, args: &BackupOptions, progress: &dyn Progress) -> Result<BackupSummary> {
    let repo_set = &s.repo_set;
    let primary_conn = &s.primary;
    let stanza = open_stanza(repo_set)?;
    let stanza_info = stanza.info()?;
    let copier = Copier::open(primary_conn)?;
    let ctl = copier.ctl();
    // None: pg_hba.conf lets the role in for replication only; the stream runs on
    // replication connections alone (docs/commands.md, "With the replication line alone").
    let sess = ctl.session();
    let replication_only = sess.is_none();
    let mut info = copier.info().clone();
    if info.catalog_version == 0 {
        // No replication command gives it; the stanza's is the cluster's (same system
        // identifier and major, checked below), and the copy's pg_control is compared with
        // it after the copy.
        info.catalog_version = stanza_info.catalog_version;
    }
    let info = &info;
    let spcs = match sess {
        Some(sess) => sess.tablespaces()?,
        None => Vec::new(),
    };
    repo::check_same_cluster(&stanza_info, info.system_identifier, &info.major())?;
    // When the cluster archives WAL, the backup's WAL must reach the archive too (a
    // point-in-time recovery starts from it); the backup still holds its own WAL.
    let archive_check = backup_waits_for_archive(
        &ctl.archiving()?,
        info,
        s.archive.check,
        &archive_command_line(s.config_file(), stanza.name()),
    )?;
    let lock = stanza.lock("backup")?;
    // The databases now: a diff or incr takes a database's blocks from its reference only
    // while the database is the same one (checked again after the copy).
    let databases = match sess {
        Some(sess) => sess.databases()?,
        None => Vec::new(),
    };
    let timeline = ctl.timeline()?;
    // A diff or incr: its reference, read into memory, or the reason it is a full after all.
    let reference = match args.backup_type {
        BackupType::Full => None,
        t if sess.is_none() => {
            tracing::warn!(
                "backup --type {}: the role may connect for replication only, so the databases (pg_database) cannot be listed to compare with a reference; taking a full backup instead",
                t.as_str()
            );
            None
        }
        t => {
            repo::chain::reference_for(&stanza, info, timeline, &databases, t == BackupType::Diff)?
        }
    };
    let (backup_type, format) = match (&reference, args.backup_type) {
        (None, _) => (BackupType::Full, repo::REPO_FORMAT),
        (Some(_), t) => (t, repo::CHAIN_FORMAT),
    };
    let mut header = ManifestHeader {
        format,
        label: String::new(),
        backup_type: backup_type.as_str().into(),
        reference: reference.as_ref().map(|r| r.label.clone()),
        stanza: stanza.name().into(),
        system_identifier: info.system_identifier,
        pg_version: info.major(),
        pg_version_num: info.version_num,
        catalog_version: info.catalog_version,
        start_time: String::new(),
        start_lsn: Lsn(0),
        wal_segment_size: info.wal_segment_size,
        block_size: info.block_size,
        data_checksums: info.data_checksums,
        compression: s.compression,
        tablespaces: Vec::new(),
        databases: databases.clone(),
    };
    // The newest interrupted backup of the same kind is resumed into its own label; any
    // other is removed.
    let resumed = if s.resume && !args.no_resume {
        resume::find(&stanza, &header, timeline, s.jobs())?
    } else {
        None
    };
    stanza.remove_incomplete(resumed.as_ref().map(|(it, _)| it.label.as_str()))?;
    // The label is unique across every configured repository (the backup's own included).
    let (started, label) = match &resumed {
        Some((it, _)) => (chrono::Utc::now(), it.label.clone()),
        None => {
            let others = open_other_stanzas(repo_set, stanza.repo())?;
            let (reference, diff) = (reference.as_ref(), backup_type == BackupType::Diff);
            let make_label =
                |t| repo::label::backup_label(reference.map(|r| r.label.as_str()), diff, t);
            repo::new_unique_label(&stanza, &others, &make_label)?
        }
    };
    header.label = label.clone();
    header.start_time = crate::repo::rfc3339(started);
    let mut journal = JournalStart {
        attempt: 1,
        timeline,
        // Without a session, no clock of the server: a resumed attempt then trusts no
        // file's modification time (repo/resume.rs) and reads every file again.
        started: match sess {
            Some(sess) => sess.server_clock()?,
            None => 0,
        },
        threshold: s.manifest_save_threshold,
        first_new_object: 1,
    };
    // A resumed backup takes what its attempts kept as a reference of its own (its pieces
    // may be slices of its own frames: the chain format).
    let reference = match resumed {
        None => reference,
        Some((it, next)) => {
            header.format = repo::CHAIN_FORMAT;
            journal.attempt = it.next_attempt();
            journal.first_new_object = next;
            let (start_lsn, same) = (it.start_lsn(), it.same_databases(&databases));
            Some(Reference::resumed(
                reference,
                &label,
                it.files.into_values(),
                start_lsn,
                timeline,
                &same,
            ))
        }
    };
    let resuming = journal.attempt > 1;
    let backup = stanza.backup(&label);
    let clock = std::time::Instant::now();
    let mut sink = RepoSink::new(&backup, s.compression);
    sink.reference = reference.as_ref();
    sink.next_object = std::sync::atomic::AtomicUsize::new(journal.first_new_object);
    sink.journal = Some(journal);
    let pg_label = format!("pgjet {label}");
    let copied = match copier {
        Copier::Files(primary) => {
            copy_ranges(primary, &sink, header, &spcs, args, &pg_label, progress)?
        }
        Copier::Stream(stream) => {
            let c = copy_stream(
                primary_conn,
                &stream,
                &sink,
                header,
                &spcs,
                args,
                &pg_label,
                progress,
            );
            stream.ctl.close();
            c?
        }
    };
    let (start_lsn, stop_lsn, tli, page_errors) = (
        copied.start_lsn,
        copied.stop_lsn,
        copied.timeline,
        copied.page_errors,
    );
    if let Some(r) = &reference {
        r.still_holds(&databases, &copied.databases, tli)?;
    }
    let (manifest, stored_size) = (copied.manifest, copied.stored_size);
    let (archive_start, archive_stop) = if archive_check {
        let (first, last) = wait_for_backup_wal(
            primary_conn,
            &stanza,
            (start_lsn, stop_lsn, tli),
            info.wal_segment_size,
            s.archive.timeout,
            replication_only,
        )?;
        (Some(first), Some(last))
    } else {
        (None, None)
    };
    let (size, files, reused) = (
        manifest.size(),
        manifest.files() as usize,
        manifest.reused(),
    );
    if resuming {
        tracing::info!(
            "backup {label} resumed: {} of {} MiB kept from its interrupted attempts",
            reused >> 20,
            size >> 20
        );
    }
    // Every object first, then the manifest, then the summary: a backup is complete only
    // once all are durable.
    backup.store().sync()?;
    lock.check()?;
    manifest.finish(
        StopInfo {
            stop_time: crate::repo::rfc3339(chrono::Utc::now()),
            stop_lsn,
            timeline: tli,
            backup_label: copied.backup_label,
            tablespace_map: copied.tablespace_map,
            wal_segments: copied.wal_segments,
            archive_start,
            archive_stop,
        },
        stored_size,
    )?;
    if args.no_expire {
        tracing::info!("--no-expire: expire not run");
    } else if s.retention.is_set() {
        // Still under the backup's lock; a failure here leaves the new backup complete.
        match repo::retention::expire_repo(&s.retention, &stanza, false) {
            Ok(lines) => lines.iter().for_each(|l| tracing::info!("expire: {l}")),
            Err(e) => {
                tracing::warn!("expire after the backup failed (the backup is complete): {e}")
            }
        }
    }
    drop(lock);
    let seconds = clock.elapsed().as_secs_f64();
    if page_errors > 0 {
        tracing::warn!("backup {label}: {page_errors} page(s) failed checksum validation; they are listed in the manifest");
    }
    Ok(BackupSummary {
        label,
        size,
        stored_size,
        files,
        seconds,
        mib_per_sec: size as f64 / (1 << 20) as f64 / seconds.max(1e-6),
        start_lsn: start_lsn.to_string(),
        stop_lsn: stop_lsn.to_string(),
        page_errors,
        resumed: resuming,
        reused,
    })
}
