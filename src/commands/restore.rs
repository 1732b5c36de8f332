//! `restore`: a backup into an empty directory, every byte checked before it counts.
//!
//! The target is laid out first (directories, tablespace links, every file created sparse
//! at its final size), then objects are read, checked and written in parallel, then
//! backup_label, tablespace_map, the recovery settings and PostgreSQL's `backup_manifest`
//! are written, everything is flushed with one syncfs per filesystem, and only then
//! global/pg_control is written. A restore that fails at any point leaves no pg_control:
//! PostgreSQL will not start on the half-written directory.
use crate::cli::{ArchiveMode, RestoreArgs, RestoreType};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::io::direct::DIRECT_MIN_WRITE;
use crate::io::fs::set_mtime;
use crate::pg::pg_manifest::{PgManifestWriter, PgWalRange};
use crate::pgdata::finish::{finish, Finish};
use crate::pgdata::{
    create_file, delta, parse_tablespace_map, prepare_target, recovery, remap_tablespace_map,
    tablespace_locations, TargetSync,
};
use crate::repo::open::{open_repo_with_set, open_repos};
use crate::repo::read_back::{allocate_pieces, restore_one, ReadBack, Want};
use crate::repo::{self, FileEntry};
use crate::transfer::Progress;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Runs `restore`; returns the restored backup's label.
pub fn run(s: &Settings, args: &RestoreArgs, progress: &dyn Progress) -> Result<String> {
    let stanza = s.stanza()?;
    let pg_path = s.pg_path()?.to_path_buf();
    if !pg_path.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let target = recovery::parse_target(args)?;
    // Every setting is checked before a byte is written.
    let recovery = recovery::plan(args, &target, &recovery::restore_command(s, stanza))?;
    if recovery.signal.is_some()
        && !args
            .recovery_option
            .iter()
            .any(|o| o.starts_with("restore_command="))
    {
        if let Some(w) = recovery::environment_warning(
            std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
        ) {
            tracing::warn!("{w}");
        }
    }
    let pitr = matches!(
        target,
        recovery::Target::Time(..) | recovery::Target::Lsn(_)
    );
    let (repo_no, store, label) = if pitr && args.set == "latest" {
        recovery::choose_backup(s, stanza, &target)?
    } else {
        open_repo_with_set(s, stanza, &args.set)?
    };
    tracing::info!(
        "restoring backup {label} from repo{repo_no} ({})",
        store.describe()
    );
    // A first pass checks the whole manifest and keeps only its directories and pg_control;
    // the files are streamed by a second pass (a delta reads them into memory).
    let scan = repo::scan_manifest(&*store, stanza, &label)?;
    if !recovery::ends_before(&scan.summary, &target)? {
        return Err(Error::Config(format!(
            "backup {label} ends at {} (LSN {}), after the recovery target {}: a point-in-time recovery replays forward from a backup; choose an older backup, or leave out --set to have the newest one before the target chosen",
            scan.summary.end.stop.stop_time,
            scan.summary.end.stop.stop_lsn,
            args.target.as_deref().unwrap_or("")
        )));
    }
    // restore_command reads every repository: a gap recorded in any of them counts (a
    // repository that cannot be read now is skipped with a warning).
    let mut gaps = crate::repo::wal::gaps(&*store, stanza)?;
    for (n, other) in open_repos(s)? {
        if n == repo_no {
            continue;
        }
        match crate::repo::wal::gaps(&*other, stanza) {
            Ok(g) => gaps.extend(g),
            Err(e) => tracing::warn!("repo{n}: cannot read its gap records: {e}"),
        }
    }
    recovery::check_gaps(args.restore_type, &target, &scan.summary, &gaps)?;
    let h = &scan.summary.header;
    let tablespaces: Vec<(u32, String, String)> = h
        .tablespaces
        .iter()
        .map(|t| (t.oid, t.name.clone(), t.location.clone()))
        .collect();
    let dirs: Vec<(String, u32)> = scan
        .directories
        .iter()
        .map(|d| (d.path.clone(), d.mode))
        .collect();
    let delta = args.delta
        && delta::check_delta_target(&pg_path, h.system_identifier)?
            == delta::DeltaTarget::SameCluster;
    let (locations, files) = if delta {
        let m = repo::read_manifest(&*store, stanza, &label)?;
        let locations = tablespace_locations(&tablespaces, &map)?;
        let listing = m.listing();
        let removed = delta::begin_delta(&pg_path, h.system_identifier, &locations, &listing)?;
        let needed = repo::delta::pieces_needed(&m, &pg_path, s.jobs)?;
        let (all, kept) = needed
            .iter()
            .flatten()
            .fold((0, 0), |(a, k), n| (a + 1, k + usize::from(!n)));
        tracing::info!(
            "delta: {kept} of {all} pieces already in place, {removed} file(s) or directories removed"
        );
        (locations, Files::InMemory(m.files, needed))
    } else {
        let locations = prepare_target(&pg_path, &tablespaces, &map, &dirs)?;
        delta::write_marker(&pg_path, h.system_identifier)?;
        (locations, Files::Streamed)
    };
    match restore_into(
        s, args, &recovery, &*store, &scan, &pg_path, &locations, files, progress,
    ) {
        Ok(()) => Ok(label),
        Err(e) => {
            let _ = fs::remove_file(pg_path.join("global/pg_control"));
            tracing::error!(
                "restore of {label} failed; {} is incomplete and cannot be started",
                pg_path.display()
            );
            Err(e)
        }
    }
}

/// Where restore takes the files of the backup from.
enum Files {
    /// A second pass over the stored manifest ([`repo::ManifestReader`]); the targets are
    /// empty and each file is created as its line passes.
    Streamed,
    /// The manifest's files, read whole for a delta restore, and for each file which
    /// pieces the target lacks ([`delta::pieces_needed`]).
    InMemory(Vec<FileEntry>, Vec<Vec<bool>>),
}

/// Restores the backup `scan` describes into the prepared `pg_path`: the files of `files`
/// (a delta: only the pieces it marks, into files that may exist already), then
/// backup_label, the settings and PostgreSQL's backup_manifest, a sync, and pg_control
/// last.
#[allow(clippy::too_many_arguments)]
fn restore_into(
    s: &Settings,
    args: &RestoreArgs,
    recovery: &recovery::RecoveryPlan,
    store: &dyn crate::storage::Storage,
    scan: &repo::ScannedManifest,
    pg_path: &Path,
    locations: &[(u32, PathBuf)],
    files: Files,
    progress: &dyn Progress,
) -> Result<()> {
    // Phase times at debug level: what a slow restore spent its time on.
    let clock = std::time::Instant::now();
    let phase =
        |what: &str| tracing::debug!("restore: {what} at {} ms", clock.elapsed().as_millis());
    let target_sync = TargetSync::open(pg_path, locations)?;
    let (h, end) = (&scan.summary.header, &scan.summary.end);
    let stop = &end.stop;
    let label = &h.label;

    // PostgreSQL's own backup_manifest, so pg_verifybackup can check the directory: written
    // as the files pass, ended after backup_label and tablespace_map.
    let pgm_path = pg_path.join("backup_manifest");
    let pgm_io = |e: std::io::Error| Error::io("write", &pgm_path, e);
    let pgm_mode = crate::pgdata::DataDirModes::of_dir(pg_path)?.file;
    let pgm_file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(pgm_mode)
        .open(&pgm_path)
        .map_err(|e| Error::io("create", &pgm_path, e))?;
    crate::io::fs::set_exact_mode(&pgm_file, &pgm_path, pgm_mode)?;
    let mut pgm = PgManifestWriter::new(
        std::io::BufWriter::with_capacity(1 << 20, pgm_file),
        h.pg_version_num,
        h.system_identifier,
    )
    .map_err(pgm_io)?;

    let delta = matches!(files, Files::InMemory(..));
    let rb = ReadBack {
        store,
        stanza: &h.stanza,
        label,
        kind: h.compression.kind,
        contiguous: scan.contiguous,
        target: Some(pg_path),
        overwrite: delta,
        jobs: s.jobs,
    };
    let mut can_allocate = true;
    let mut created = 0u64;
    let (files, needed) = match files {
        Files::Streamed => (None, Vec::new()),
        Files::InMemory(f, n) => (Some(f), n),
    };
    let mut needed = needed.into_iter();
    // Each file, as it passes: into backup_manifest, then created (or, for a delta, opened
    // and sized), its ranges allocated; pg_control is left for last.
    let mut prepare = |f: &FileEntry| -> Result<Want> {
        let wanted = if delta { needed.next() } else { None };
        if !f.path.starts_with("pg_wal/") {
            pgm.file(&f.path, f.size, f.mtime, f.crc32c)
                .map_err(pgm_io)?;
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
                let (p, file, _) = delta::size_file(pg_path, &f.path, f.size, f.mode)?;
                (p, file, Want::Pieces(w))
            }
            None => {
                let (p, file) = create_file(pg_path, &f.path, f.size, f.mode)?;
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
    match files {
        None => {
            let stream = repo::ManifestReader::open(store, &h.stanza, label)?.files();
            rb.run(stream, &mut prepare, progress)?;
        }
        Some(files) => {
            rb.run(files.into_iter().map(Ok), &mut prepare, progress)?;
        }
    }
    progress.finish();
    phase(&format!("{created} files created and written"));

    // backup_label, tablespace_map, the settings, PostgreSQL's backup_manifest; the sync;
    // pg_control last.
    let spcmap = (!h.tablespaces.is_empty()).then(|| remap_tablespace_map(locations));
    let mut auto_conf = Vec::new();
    if args.archive_mode == ArchiveMode::Off {
        auto_conf.push(format!(
            "# pgjet restore --archive-mode off (backup {label})"
        ));
        auto_conf.push("archive_mode = 'off'".into());
    }
    if !recovery.lines.is_empty() {
        auto_conf.push(format!(
            "# recovery settings added by pgjet restore of backup {label} (--type {})",
            recovery::type_name(args.restore_type)
        ));
        auto_conf.extend(recovery.lines.iter().cloned());
    }
    let label_text = stop.backup_label.as_bytes();
    let write_pg_manifest = || -> Result<()> {
        let now = chrono::Utc::now().timestamp();
        pgm.file(
            "backup_label",
            label_text.len() as u64,
            now,
            crate::codec::crc32c(label_text),
        )
        .map_err(pgm_io)?;
        if let Some(text) = &spcmap {
            pgm.file(
                "tablespace_map",
                text.len() as u64,
                now,
                crate::codec::crc32c(text.as_bytes()),
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
        let cf = &scan.control;
        let (control_path, _) = create_file(pg_path, &cf.path, cf.size, cf.mode)?;
        restore_one(
            store,
            &h.stanza,
            label,
            h.compression.kind,
            cf,
            &control_path,
        )?;
        set_mtime(&control_path, cf.mtime)?;
        File::open(&control_path)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io("fsync", &control_path, e))
    };
    finish(
        pg_path,
        &target_sync,
        &Finish {
            backup_label: label_text,
            tablespace_map: spcmap.clone(),
            replace_recovery_settings: (args.restore_type != RestoreType::Preserve)
                .then(|| format!("pgjet restore of backup {label}")),
            auto_conf,
            signal: recovery.signal,
        },
        write_pg_manifest,
        write_control,
    )?;
    phase("pg_control written");
    Ok(())
}
