//! `replica-create`: clones a running primary on this host straight into a new standby data
//! directory with the parallel engine, no repository in between.
//!
//! A replication slot is made before the backup starts: permanent when --slot is given (the
//! standby then streams from it, so the primary keeps every WAL segment it needs), else
//! temporary (it lives as long as the copy). The WAL from the start to the stop LSN is
//! copied into the new pg_wal as well, so the standby reaches consistency even before it
//! connects.
use super::restore::{
    append_auto_conf, create_files, prepare_target, set_mtimes, write_file, TargetSync,
};
use super::*;
use crate::cli::ReplicaArgs;
use crate::pg::datadir;
use crate::pg::lsn::parse_backup_label;
use crate::pg::session::{quote_conf_value, quote_literal};
use crate::transfer::sink::DirSink;
use crate::transfer::{copy_files, Progress, ReadOptions};
use std::process::Command;
use std::time::{Duration, Instant};

/// What `replica-create` reports.
#[derive(Debug, serde::Serialize)]
pub struct ReplicaSummary {
    pub pg_path: String,
    pub size: u64,
    pub seconds: f64,
    pub mib_per_sec: f64,
    pub slot: Option<String>,
    pub started: bool,
}

/// Runs `replica-create`.
pub fn run(s: &Settings, args: &ReplicaArgs, progress: &dyn Progress) -> Result<ReplicaSummary> {
    let target = s.pg_path()?.to_path_buf();
    if !target.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let config = session::parse_conninfo(&args.source)?;
    let sess = Session::connect(&config)?;
    let info = sess.server_info()?;
    if info.in_recovery {
        return Err(Error::Unsafe("the source is a standby: replica-create from a standby is not supported yet; use the primary".into()));
    }
    let source = PathBuf::from(&info.data_directory);
    let local_id = read_control_system_identifier(&source).map_err(|e| Error::Unsafe(format!(
        "cannot read the primary's data directory {} on this host ({e}); replica-create copies from a primary on the same host", source.display())))?;
    if local_id != info.system_identifier {
        return Err(Error::Unsafe(format!(
            "{} belongs to another cluster than the one at --source",
            source.display()
        )));
    }
    let spcs = sess.tablespaces()?;
    let tablespaces: Vec<(u32, String, String)> = spcs.clone();
    // Check targets before anything is created on the primary.
    super::restore::plan_locations(&target, &tablespaces, &map)?;
    if let Some(name) = &args.slot {
        if sess.slot_wal_status(name)?.is_some() {
            return Err(Error::Unsafe(format!(
                "replication slot {name} already exists on the primary; choose another --slot or drop it"
            )));
        }
    }
    let clock = Instant::now();
    // The copy runs under a temporary slot, made before the backup starts: it dies with this
    // session if pgjet is killed, so a failed clone leaks nothing. --slot is made permanent
    // only once the copy has succeeded, as a copy that keeps the temporary slot's restart LSN.
    let temp_slot = format!("pgjet_{}", std::process::id());
    sess.create_physical_slot(&temp_slot, true)?;
    let res = copy_and_configure(
        s,
        args,
        &sess,
        &info,
        &source,
        &target,
        &tablespaces,
        &map,
        &temp_slot,
        progress,
    );
    if let Err(e) = res {
        if let Some(name) = &args.slot {
            if sess.slot_wal_status(name).ok().flatten().is_some() {
                if let Err(d) = sess.drop_slot(name) {
                    tracing::warn!("could not drop slot {name} after the failure: {d}");
                }
            }
        }
        let _ = fs::remove_file(target.join("global/pg_control"));
        return Err(e);
    }
    let size = res.unwrap_or(0);
    sess.close();
    let seconds = clock.elapsed().as_secs_f64();
    let mut started = false;
    if args.start {
        start_standby(s, args, &source, &target, &config)?;
        started = true;
    }
    Ok(ReplicaSummary {
        pg_path: target.display().to_string(),
        size,
        seconds,
        mib_per_sec: size as f64 / (1 << 20) as f64 / seconds.max(1e-6),
        slot: args.slot.clone(),
        started,
    })
}

/// application_name the standby uses in primary_conninfo (to find it in
/// pg_stat_replication): the one --source gives, else the slot name or `pgjet_standby_<port>`.
fn standby_app_name(s: &Settings, args: &ReplicaArgs) -> String {
    args.source
        .parse::<tokio_postgres::Config>()
        .ok()
        .and_then(|c| c.get_application_name().map(str::to_owned))
        .or_else(|| args.slot.clone())
        .unwrap_or_else(|| format!("pgjet_standby_{}", s.pg_port))
}

/// primary_conninfo: --source with `application_name` added when it has none (as a
/// key=value pair, or a URI query parameter).
fn standby_conninfo(source: &str, app: &str) -> String {
    let has_app = source
        .parse::<tokio_postgres::Config>()
        .ok()
        .is_some_and(|c| c.get_application_name().is_some());
    if has_app {
        source.to_string()
    } else if source.contains("://") {
        let sep = if source.contains('?') { '&' } else { '?' };
        format!("{source}{sep}application_name={app}")
    } else {
        format!("{source} application_name={app}")
    }
}

#[allow(clippy::too_many_arguments)]
fn copy_and_configure(
    s: &Settings,
    args: &ReplicaArgs,
    sess: &Session,
    info: &session::ServerInfo,
    source: &Path,
    target: &Path,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
    temp_slot: &str,
    progress: &dyn Progress,
) -> Result<u64> {
    let start_lsn = sess.backup_start(
        &format!("pgjet replica-create {}", target.display()),
        args.start_fast,
    )?;
    let listing = datadir::list_data_directory(
        source,
        info.version_num,
        &info.tablespace_dir(),
        info.data_checksums,
    )?;
    let locations = prepare_target(target, tablespaces, map, &listing.dirs)?;
    let target_sync = TargetSync::open(target, &locations)?;
    let (files, control) = super::backup::source_files(&listing);
    let control = control
        .ok_or_else(|| Error::Unsafe(format!("{} has no global/pg_control", source.display())))?;
    let specs: Vec<(&str, u64, u32)> = files
        .iter()
        .map(|f| (f.path.as_str(), f.size, f.mode))
        .collect();
    let targets = create_files(target, &specs)?;
    let opts = ReadOptions {
        jobs: s.jobs,
        verify_checksums: info.data_checksums,
        backup_start_lsn: start_lsn.0,
    };
    let total: u64 = files.iter().map(|f| f.size).sum::<u64>() + control.size;
    progress.begin("replica-create", total);
    let out = copy_files(&files, &opts, &DirSink { targets: &targets }, progress)?;
    for (f, gone) in files.iter().zip(&out.vanished) {
        if *gone {
            let _ = fs::remove_file(target.join(&f.path));
        }
    }
    let bad: usize = out.page_errors.iter().map(|e| e.len()).sum();
    if bad > 0 {
        tracing::warn!(
            "{bad} page(s) of the primary failed checksum validation (see the warnings above)"
        );
    }
    // pg_control is read before the backup stops, as basebackup.c sends it, and written last.
    let control_bytes = crate::pg::control::read_control_file(&control.abs)?;
    let stop = sess.backup_stop()?;
    let label = parse_backup_label(&stop.backup_label).map_err(|e| {
        Error::Other(format!(
            "pg_backup_stop returned a backup_label pgjet cannot read: {e}"
        ))
    })?;
    let wal = wal_source_files(
        source,
        label.start_timeline,
        start_lsn,
        stop.lsn,
        info.wal_segment_size,
        info.system_identifier,
    )?;
    let wal_specs: Vec<(&str, u64, u32)> = wal
        .iter()
        .map(|f| (f.path.as_str(), f.size, f.mode))
        .collect();
    let wal_targets = create_files(target, &wal_specs)?;
    let wal_opts = ReadOptions {
        verify_checksums: false,
        ..opts
    };
    progress.finish();
    // The WAL's size is known only after pg_backup_stop: a phase of its own.
    progress.begin("WAL", wal.iter().map(|f| f.size).sum());
    let wal_out = copy_files(
        &wal,
        &wal_opts,
        &DirSink {
            targets: &wal_targets,
        },
        progress,
    )?;
    super::backup::require_all(&wal, &wal_out.vanished)?;
    sess.check_slot_holds(temp_slot)?;
    progress.finish();
    if let Some(name) = &args.slot {
        sess.copy_slot_permanent(temp_slot, name)?;
    }
    let kept: Vec<(PathBuf, i64)> = files
        .iter()
        .zip(targets)
        .zip(&out.vanished)
        .filter(|(_, gone)| !**gone)
        .map(|((f, t), _)| (t, f.mtime))
        .collect();
    let (paths, mtimes): (Vec<PathBuf>, Vec<i64>) = kept.into_iter().unzip();
    set_mtimes(&paths, &mtimes)?;

    write_file(&target.join("backup_label"), stop.backup_label.as_bytes())?;
    if !tablespaces.is_empty() {
        write_file(
            &target.join("tablespace_map"),
            remap_tablespace_map(&locations).as_bytes(),
        )?;
    }
    let conninfo = standby_conninfo(&args.source, &standby_app_name(s, args));
    let mut lines = vec![
        "# standby settings added by pgjet replica-create".to_string(),
        format!("primary_conninfo = {}", quote_conf_value(&conninfo)),
    ];
    if let Some(slot) = &args.slot {
        lines.push(format!("primary_slot_name = {}", quote_conf_value(slot)));
    }
    if s.pg_port != crate::config::DEFAULT_PG_PORT || args.start {
        lines.push(format!("port = {}", s.pg_port));
    }
    append_auto_conf(target, &lines)?;
    write_file(&target.join("standby.signal"), b"")?;
    target_sync.sync()?;
    // Last: pg_control.
    write_file(&target.join(&control.path), &control_bytes)?;
    crate::storage::posix::fsync_dir(&target.join("global"))?;
    Ok(total)
}

/// The directory of the primary's own binaries: from --pg-bin, else from the postmaster's
/// /proc/<pid>/exe (its PID is the first line of postmaster.pid).
fn bin_dir(args: &ReplicaArgs, source: &Path) -> Result<PathBuf> {
    if let Some(b) = &args.pg_bin {
        return Ok(b.clone());
    }
    let pidfile = source.join("postmaster.pid");
    let text = fs::read_to_string(&pidfile).map_err(|e| Error::io("read", &pidfile, e))?;
    let pid = text.lines().next().unwrap_or("").trim().to_string();
    let exe = fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
        Error::Config(format!(
            "cannot find the primary's binaries from PID {pid} ({e}); pass --pg-bin"
        ))
    })?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::Config("cannot find the primary's binaries; pass --pg-bin".into()))
}

/// Starts the standby with pg_ctl and waits (up to 120 s) until the primary shows it
/// streaming in pg_stat_replication.
fn start_standby(
    s: &Settings,
    args: &ReplicaArgs,
    source: &Path,
    target: &Path,
    config: &tokio_postgres::Config,
) -> Result<()> {
    let bin = bin_dir(args, source)?;
    let log = target.join("pgjet-start.log");
    let status = Command::new(bin.join("pg_ctl"))
        .args(["-D"])
        .arg(target)
        .args(["-l"])
        .arg(&log)
        .args(["-w", "-t", "120", "-o"])
        .arg(format!("-p {}", s.pg_port))
        .arg("start")
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| Error::io("run pg_ctl", bin.join("pg_ctl"), e))?;
    if !status.success() {
        return Err(Error::Other(format!(
            "pg_ctl could not start the standby in {} (see {})",
            target.display(),
            log.display()
        )));
    }
    let app = standby_app_name(s, args);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sess = Session::connect(config)?;
        let rows = sess.query_strings(
            "pg_stat_replication",
            &format!(
                "SELECT state FROM pg_stat_replication WHERE application_name = {}",
                quote_literal(&app)
            ),
        )?;
        sess.close();
        if rows
            .iter()
            .any(|r| r.first().cloned().flatten().as_deref() == Some("streaming"))
        {
            tracing::info!("standby {} is streaming", target.display());
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Other(format!(
                "the standby in {} started but does not stream after 120 s (see {})",
                target.display(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_name_is_added_once() {
        assert_eq!(
            standby_conninfo("host=/s port=5", "a"),
            "host=/s port=5 application_name=a"
        );
        assert_eq!(
            standby_conninfo("host=/s application_name=x", "a"),
            "host=/s application_name=x"
        );
        assert_eq!(
            standby_conninfo("postgresql://u@h/db", "a"),
            "postgresql://u@h/db?application_name=a"
        );
        assert_eq!(
            standby_conninfo("postgresql://u@h/db?sslmode=disable", "a"),
            "postgresql://u@h/db?sslmode=disable&application_name=a"
        );
    }
}
