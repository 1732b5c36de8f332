//! `restore`: a backup into an empty directory, every byte checked before it counts.
//!
//! The target is laid out first (directories, tablespace links, every file created sparse
//! at its final size), then objects are read, checked and written in parallel, then
//! backup_label, tablespace_map, the recovery settings and PostgreSQL's `backup_manifest`
//! are written, everything is flushed with one syncfs per filesystem, and only then
//! global/pg_control is written. A restore that fails at any point leaves no pg_control:
//! PostgreSQL will not start on the half-written directory.
use crate::error::{Error, Result};
use crate::options::Settings;
use crate::options::{ArchiveMode, RestoreOptions, RestoreType};
use crate::pgdata::restore::{restore_into, Files, RestoreInto};
use crate::pgdata::{
    delta_target, parse_tablespace_map, prepare_target, recovery, tablespace_locations,
};
use crate::repo;
use crate::repo::open::{open_stanza_with_set, open_stanzas};
use crate::repo::read_back::PieceWant;
use crate::transfer::Progress;
use std::fs;

/// Runs `restore`; returns the restored backup's label.
pub fn run(s: &Settings, args: &RestoreOptions, progress: &dyn Progress) -> Result<String> {
    run_with(s, args, Vec::new(), progress)
}

/// [`run`], with `extra` lines appended to postgresql.auto.conf after the recovery settings
/// (replica-create seeded from the repository: its standby settings). Returns the restored
/// backup's label.
///
/// One function on purpose (over 120 lines): every setting and the recovery target are
/// checked, and the backup chosen and its manifest scanned, before the first byte is
/// written; the order is the safety argument, and reads best in one place.
pub fn run_with(
    s: &Settings,
    args: &RestoreOptions,
    extra: Vec<String>,
    progress: &dyn Progress,
) -> Result<String> {
    let repo_set = &s.repo_set;
    let stanza = s.stanza()?;
    let pg_path = s.pg_path()?.to_path_buf();
    if !pg_path.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let target = recovery::parse_target(args)?;
    // Every setting is checked before a byte is written.
    let mut recovery = recovery::plan(
        args,
        &target,
        &recovery::restore_command(&s.archive_config(), stanza),
    )?;
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
    let (repo, label) = if pitr && args.set == "latest" {
        recovery::choose_backup(repo_set, &target)?
    } else {
        open_stanza_with_set(repo_set, &args.set)?
    };
    let backup = repo.backup(&label);
    tracing::info!(
        "restoring backup {label} from repo{} ({})",
        repo.repo(),
        repo.store().describe()
    );
    // A first pass checks the whole manifest and keeps only its directories and pg_control;
    // the files are streamed by a second pass (a delta reads them into memory).
    let scan = backup.scan()?;
    // Every older backup the pieces name, checked before the target is touched.
    let chain = repo::chain::open_chain(&backup, &scan.summary)?;
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
    let mut gaps = repo::wal::gaps(&repo)?;
    for other in open_stanzas(repo_set)? {
        if other.repo() == repo.repo() {
            continue;
        }
        match repo::wal::gaps(&other) {
            Ok(g) => gaps.extend(g),
            Err(e) => tracing::warn!("repo{}: cannot read its gap records: {e}", other.repo()),
        }
    }
    recovery::check_gaps(args.restore_type, &target, &scan.summary, &gaps)?;
    crate::pgdata::pitr::check_timelines(
        &open_stanzas(repo_set)?,
        &scan.summary,
        &label,
        &target,
        args,
        &mut recovery,
    )?;
    if matches!(target, recovery::Target::Immediate) && recovery::is_standby_backup(&scan.summary) {
        recovery.replay_own_wal_only();
        tracing::info!(
            "backup {label} was taken on a standby (stop LSN {}): recovery replays the backup's own WAL to its end instead of recovery_target = 'immediate', which PostgreSQL cannot reach when the standby's WAL ends at the backup's end (a segment boundary, or a primary that stopped sending)",
            scan.summary.end.stop.stop_lsn
        );
    }
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
        && delta_target::check_delta_target(&pg_path, h.system_identifier)?
            == delta_target::DeltaTarget::SameCluster;
    let (locations, files) = if delta {
        let m = backup.manifest()?;
        let locations = tablespace_locations(&tablespaces, &map)?;
        let listing = m.listing();
        let removed =
            delta_target::begin_delta(&pg_path, h.system_identifier, &locations, &listing)?;
        let needed = repo::restore_delta::pieces_needed(&m, &pg_path, s.jobs())?;
        let count = |w: PieceWant| needed.iter().flatten().filter(|n| **n == w).count();
        let all: usize = needed.iter().map(Vec::len).sum();
        tracing::info!(
            "delta: {} of {all} pieces already in place, {} to compare once read back (a slice of an older backup's frame has no hash of its own), {removed} file(s) or directories removed",
            count(PieceWant::Keep),
            count(PieceWant::Compare)
        );
        (locations, Files::InMemory(m.files, needed))
    } else {
        let locations = prepare_target(&pg_path, h.system_identifier, &tablespaces, &map, &dirs)?;
        (locations, Files::Streamed)
    };
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
    auto_conf.extend(extra);
    let into = RestoreInto {
        backup: &backup,
        scan: &scan,
        chain: &chain,
        pg_path: &pg_path,
        locations: &locations,
        jobs: s.jobs(),
        auto_conf,
        replace_recovery_settings: (args.restore_type != RestoreType::Preserve)
            .then(|| format!("pgjet restore of backup {label}")),
        signal: recovery.signal,
    };
    match restore_into(&into, files, progress) {
        Ok(()) => {
            crate::pgdata::debian::say_how_to_start(&pg_path);
            Ok(label)
        }
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
