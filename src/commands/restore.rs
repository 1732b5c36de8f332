//! `restore`: a backup into an empty directory, every byte checked before it counts.
//!
//! The target is laid out first (directories, tablespace links, every file created sparse
//! at its final size), then objects are read, checked and written in parallel, then
//! backup_label, tablespace_map, the recovery settings and PostgreSQL's `backup_manifest`
//! are written, everything is flushed with one syncfs per filesystem, and only then
//! global/pg_control is written. A restore that fails at any point leaves no pg_control:
//! PostgreSQL will not start on the half-written directory.
use super::*;
use crate::options::{ArchiveMode, RestoreOptions};
use crate::pg::pg_manifest::{PgManifestWriter, PgWalRange};
use crate::repo::{self, FileEntry};
use crate::storage::direct::DIRECT_MIN_WRITE;
use crate::storage::posix::{fsync_dir, SyncHandle};
use crate::transfer::restore::{
    allocate_pieces, create_new_file, restore_one, set_mtime, ReadBack, Want,
};
use crate::transfer::Progress;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

/// Checks the targets without touching anything: every --tablespace-map entry names a
/// tablespace, the data directory and every tablespace directory are empty (or absent),
/// hold no postmaster.pid, and none of them is inside another. Returns (oid, location).
pub fn plan_locations(
    pg_path: &Path,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
) -> Result<Vec<(u32, PathBuf)>> {
    let locations = tablespace_locations(tablespaces, map)?;
    check_empty_target(pg_path, "target directory")?;
    for ((oid, dir), (_, name, _)) in locations.iter().zip(tablespaces) {
        check_empty_target(dir, &format!("tablespace {name} (OID {oid}) directory"))?;
    }
    let all: Vec<PathBuf> = std::iter::once(pg_path.to_path_buf())
        .chain(locations.iter().map(|(_, d)| d.clone()))
        .map(|p| normalize(&p))
        .collect::<Result<_>>()?;
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.starts_with(b) || b.starts_with(a) {
                return Err(Error::Config(format!(
                    "target directories {} and {} overlap: the data directory and each tablespace need a directory of their own",
                    a.display(),
                    b.display()
                )));
            }
        }
    }
    Ok(locations)
}

/// An absolute path with `.` components dropped; `..` is refused (it would hide overlaps).
fn normalize(p: &Path) -> Result<PathBuf> {
    use std::path::Component;
    if !p.is_absolute() {
        return Err(Error::Config(format!(
            "{} must be an absolute path",
            p.display()
        )));
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(Error::Config(format!(
                    "{} must not contain '..'",
                    p.display()
                )))
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Checks the targets and creates the data directory, the tablespace directories and links
/// (pg_tblspc/<oid> -> location) and every directory of `dirs`.
/// `tablespaces`: (oid, name, original location). Returns (oid, chosen location).
pub fn prepare_target(
    pg_path: &Path,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
    dirs: &[(String, u32)],
) -> Result<Vec<(u32, PathBuf)>> {
    let locations = plan_locations(pg_path, tablespaces, map)?;
    create_private_dir(pg_path)?;
    for (oid, dir) in &locations {
        create_private_dir(dir)?;
        let tblspc = pg_path.join("pg_tblspc");
        fs::create_dir_all(&tblspc).map_err(|e| Error::io("create directory", &tblspc, e))?;
        let link = tblspc.join(oid.to_string());
        std::os::unix::fs::symlink(dir, &link)
            .map_err(|e| Error::io("create tablespace link", &link, e))?;
    }
    for (rel, mode) in dirs {
        if let Some(rest) = rel.strip_prefix("pg_tblspc/") {
            if !rest.contains('/') {
                continue; // the link itself, made above
            }
        }
        let p = pg_path.join(rel);
        match fs::create_dir(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create directory", &p, e)),
        }
        let mode = if *mode == 0 { 0o700 } else { *mode };
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("chmod", &p, e))?;
    }
    Ok(locations)
}

/// Creates `rel` below `pg_path` empty at `size` bytes (sparse: unwritten pages stay
/// holes) with permission bits `mode` (0: 0600), making its parent directory if missing.
/// Returns its path and the open file. Errors: the file exists, or cannot be made.
pub fn create_file(pg_path: &Path, rel: &str, size: u64, mode: u32) -> Result<(PathBuf, File)> {
    let p = pg_path.join(rel);
    let f = create_new_file(&p, mode)?;
    if size > 0 {
        f.set_len(size).map_err(|e| Error::io("size", &p, e))?;
    }
    Ok((p, f))
}

/// Creates every file (rel path, size, mode) with [`create_file`] and returns their paths.
pub fn create_files(pg_path: &Path, files: &[(&str, u64, u32)]) -> Result<Vec<PathBuf>> {
    files
        .iter()
        .map(|(rel, size, mode)| create_file(pg_path, rel, *size, *mode).map(|(p, _)| p))
        .collect()
}

/// Sets each file's modification time (Unix seconds).
pub fn set_mtimes(paths: &[PathBuf], mtimes: &[i64]) -> Result<()> {
    paths
        .iter()
        .zip(mtimes)
        .try_for_each(|(p, t)| set_mtime(p, *t))
}

/// Writes a small file durably (write, fsync) with mode 0600.
pub fn write_file(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io("create", path, e))?;
    f.write_all(data).map_err(|e| Error::io("write", path, e))?;
    f.sync_all().map_err(|e| Error::io("fsync", path, e))
}

/// Appends settings to postgresql.auto.conf (read by PostgreSQL after postgresql.conf).
pub fn append_auto_conf(pg_path: &Path, lines: &[String]) -> Result<()> {
    let p = pg_path.join("postgresql.auto.conf");
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&p)
        .map_err(|e| Error::io("open", &p, e))?;
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io("write", &p, e))
}

/// Handles on the data directory, a symlinked pg_wal and every tablespace directory, opened
/// before the first file is written and synced (one syncfs per filesystem) when everything
/// is written.
pub struct TargetSync(Vec<SyncHandle>);

impl TargetSync {
    /// Opens the handles; call right after [`prepare_target`].
    pub fn open(pg_path: &Path, locations: &[(u32, PathBuf)]) -> Result<TargetSync> {
        let mut v = vec![SyncHandle::open(pg_path)?];
        // A pg_wal kept as a symbolic link (a delta keeps it) may lie on another filesystem.
        let wal = pg_path.join("pg_wal");
        if wal.is_symlink() && wal.is_dir() {
            v.push(SyncHandle::open(&wal)?);
        }
        for (_, dir) in locations {
            v.push(SyncHandle::open(dir)?);
        }
        Ok(TargetSync(v))
    }

    /// Flushes the filesystems; errors if any writeback since [`TargetSync::open`] failed.
    pub fn sync(&self) -> Result<()> {
        self.0.iter().try_for_each(SyncHandle::syncfs)
    }
}

/// Runs `restore`; returns the restored backup's label.
pub fn run(s: &Settings, args: &RestoreOptions, progress: &dyn Progress) -> Result<String> {
    let stanza = s.stanza()?;
    let pg_path = s.pg_path()?.to_path_buf();
    if !pg_path.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let target = super::recovery::parse_target(args)?;
    // Every setting is checked before a byte is written.
    let recovery =
        super::recovery::plan(args, &target, &super::recovery::restore_command(s, stanza))?;
    if recovery.signal.is_some()
        && !args
            .recovery_option
            .iter()
            .any(|o| o.starts_with("restore_command="))
    {
        if let Some(w) = super::recovery::environment_warning(
            std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
        ) {
            tracing::warn!("{w}");
        }
    }
    let pitr = matches!(
        target,
        super::recovery::Target::Time(..) | super::recovery::Target::Lsn(_)
    );
    let (repo_no, store, label) = if pitr && args.set == "latest" {
        super::recovery::choose_backup(s, stanza, &target)?
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
    if !super::recovery::ends_before(&scan.summary, &target)? {
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
    super::recovery::check_gaps(args.restore_type, &target, &scan.summary, &gaps)?;
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
        && super::delta::check_delta_target(&pg_path, h.system_identifier)?
            == super::delta::DeltaTarget::SameCluster;
    let (locations, files) = if delta {
        let m = repo::read_manifest(&*store, stanza, &label)?;
        let locations = tablespace_locations(&tablespaces, &map)?;
        let listing = super::delta::manifest_listing(&m);
        let removed =
            super::delta::begin_delta(&pg_path, h.system_identifier, &locations, &listing)?;
        let needed = super::delta::pieces_needed(&m, &pg_path, s.jobs)?;
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
        super::delta::write_marker(&pg_path, h.system_identifier)?;
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
    /// pieces the target lacks ([`super::delta::pieces_needed`]).
    InMemory(Vec<FileEntry>, Vec<Vec<bool>>),
}

/// Restores the backup `scan` describes into the prepared `pg_path`: the files of `files`
/// (a delta: only the pieces it marks, into files that may exist already), then
/// backup_label, the settings and PostgreSQL's backup_manifest, a sync, and pg_control
/// last.
#[allow(clippy::too_many_arguments)]
fn restore_into(
    s: &Settings,
    args: &RestoreOptions,
    recovery: &super::recovery::RecoveryPlan,
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
    let pgm_file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&pgm_path)
        .map_err(|e| Error::io("create", &pgm_path, e))?;
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
                let (p, file, _) = super::delta::size_file(pg_path, &f.path, f.size, f.mode)?;
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

    // backup_label, tablespace_map, recovery settings.
    write_file(&pg_path.join("backup_label"), stop.backup_label.as_bytes())?;
    let spcmap = if h.tablespaces.is_empty() {
        None
    } else {
        Some(remap_tablespace_map(locations))
    };
    if let Some(text) = &spcmap {
        write_file(&pg_path.join("tablespace_map"), text.as_bytes())?;
    }
    let note = format!("# recovery settings added by pgjet restore of backup {label}");
    if args.archive_mode == ArchiveMode::Off {
        append_auto_conf(
            pg_path,
            &[
                format!("# pgjet restore --archive-mode off (backup {label})"),
                "archive_mode = 'off'".into(),
            ],
        )?;
    }
    if !recovery.lines.is_empty() {
        let mut lines = vec![format!(
            "{note} (--type {})",
            super::recovery::type_name(args.restore_type)
        )];
        lines.extend(recovery.lines.iter().cloned());
        append_auto_conf(pg_path, &lines)?;
    }
    if let Some(signal) = recovery.signal {
        write_file(&pg_path.join(signal), b"")?;
    }

    let now = chrono::Utc::now().timestamp();
    let label_text = stop.backup_label.as_bytes();
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
    target_sync.sync()?;
    phase("syncfs done");
    // Last: pg_control. Until it exists the directory is not a cluster PostgreSQL would start.
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
        .map_err(|e| Error::io("fsync", &control_path, e))?;
    fsync_dir(&pg_path.join("global"))?;
    super::delta::remove_marker(pg_path)?;
    phase("pg_control written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_targets_are_refused() {
        let ts: Vec<(u32, String, String)> = vec![
            (16400, "ts1".into(), "/nonexistent/o/ts1".into()),
            (16401, "ts2".into(), "/nonexistent/o/ts2".into()),
        ];
        let plan = |maps: &[&str]| {
            let map = parse_tablespace_map(&maps.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
            plan_locations(Path::new("/nonexistent/x/data"), &ts, &map)
        };
        assert!(plan(&["ts1=/nonexistent/x/a", "ts2=/nonexistent/x/b"]).is_ok());
        assert!(plan(&["ts1=/nonexistent/x/a", "ts2=/nonexistent/x/a"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x/a", "ts2=/nonexistent/x/a/./sub"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x/data/ts", "ts2=/nonexistent/x/b"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x", "ts2=/nonexistent/y"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x/a/../b", "ts2=/nonexistent/y"]).is_err());
    }
}
