//! `replica-create`: clones a running primary straight into a new standby data directory
//! with the parallel engine, no repository in between. The primary may be on this host
//! (files read locally) or on another one (files read over libpq connections; nothing is
//! installed on the primary).
//!
//! The copy is the shared base-backup sequence ([`super::base_backup`]) under a temporary
//! slot made before the backup starts, so nothing the standby needs is recycled and a killed
//! clone leaks nothing. --slot is made permanent only after a good copy, as a copy of the
//! temporary slot (same restart LSN); the standby then streams from it. The WAL from the
//! start to the stop LSN is copied into the new pg_wal as well, so the standby reaches
//! consistency even before it connects.
use super::base_backup::{run_base_backup, BackupTarget, BaseBackup, BaseBackupOptions};
use super::restore::{
    append_auto_conf, create_files, prepare_target, set_mtimes, write_file, TargetSync,
};
use super::*;
use crate::options::ReplicaOptions;
use crate::pg::conninfo::ConnInfo;
use crate::pg::datadir::Listing;
use crate::pg::session::{quote_conf_value, quote_literal};
use crate::transfer::delta::{plan_delta, range_units};
use crate::transfer::sink::DirSink;
use crate::transfer::{copy_files, copy_units, CopyOutcome, Progress, ReadOptions, SourceFile};
use std::process::Command;
use std::time::{Duration, Instant};

/// What `replica-create` reports.
#[derive(Debug, serde::Serialize)]
pub struct ReplicaSummary {
    pub pg_path: String,
    /// Logical bytes copied.
    pub size: u64,
    pub seconds: f64,
    pub mib_per_sec: f64,
    pub slot: Option<String>,
    pub started: bool,
    /// How the primary's files were read: "local" or "libpq".
    pub transport: String,
    /// Copy connections (libpq) or workers (local).
    pub jobs: usize,
    /// With --delta: logical bytes found equal by hash (not copied) and bytes copied.
    pub delta_same: Option<u64>,
    pub delta_copied: Option<u64>,
}

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
            self.locations =
                prepare_target(self.pg_path, self.tablespaces, self.map, &listing.dirs)?;
            delta::write_marker(self.pg_path, self.system_identifier)?;
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

/// Runs `replica-create`.
pub fn run(s: &Settings, args: &ReplicaOptions, progress: &dyn Progress) -> Result<ReplicaSummary> {
    let target = s.pg_path()?.to_path_buf();
    if !target.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let source = s.source.as_deref().ok_or_else(|| {
        Error::Config("replica-create needs --source: the primary's connection string".into())
    })?;
    // What the user gave (connection string and environment), for application_name.
    let given = ConnInfo::parse(source)
        .map_err(crate::pg::conninfo::source_error)?
        .with_env_defaults(&session::env_var);
    let primary = open_primary(s, false)?;
    if primary.info.in_recovery {
        return Err(Error::Unsafe("the source is a standby: replica-create from a standby is not supported yet; use the primary".into()));
    }
    let transport = if primary.local_dir.is_some() {
        "local"
    } else {
        "libpq"
    };
    let tablespaces = primary.sess.tablespaces()?;
    // Check targets before anything is created on the primary.
    let delta = args.delta
        && delta::check_delta_target(&target, primary.info.system_identifier)?
            == delta::DeltaTarget::SameCluster;
    let locations = if delta {
        tablespace_locations(&tablespaces, &map)?
    } else {
        super::restore::plan_locations(&target, &tablespaces, &map)?
    };
    if let Some(name) = &args.slot {
        if primary.sess.slot_wal_status(name)?.is_some() {
            return Err(Error::Unsafe(format!(
                "replication slot {name} already exists on the primary; choose another --slot or drop it"
            )));
        }
    }
    let clock = Instant::now();
    let app = standby_app_name(s, args, &given);
    let res = copy_and_configure(
        s,
        args,
        &primary,
        &target,
        &tablespaces,
        &map,
        locations,
        &app,
        delta,
        progress,
    );
    if let Err(e) = res {
        if let Some(name) = &args.slot {
            if primary.sess.slot_wal_status(name).ok().flatten().is_some() {
                if let Err(d) = primary.sess.drop_slot(name) {
                    tracing::warn!("could not drop slot {name} after the failure: {d}");
                }
            }
        }
        let _ = fs::remove_file(target.join("global/pg_control"));
        return Err(e);
    }
    let (size, same, copied) = res.unwrap_or((0, 0, 0));
    let major = primary.info.major();
    let conn = primary.target.clone();
    let jobs = primary.jobs;
    let local_dir = primary.local_dir.clone();
    primary.close();
    let seconds = clock.elapsed().as_secs_f64();
    let mut started = false;
    if args.start {
        start_standby(s, args, local_dir.as_deref(), &major, &target, &conn, &app)?;
        started = true;
    }
    Ok(ReplicaSummary {
        pg_path: target.display().to_string(),
        size,
        seconds,
        mib_per_sec: size as f64 / (1 << 20) as f64 / seconds.max(1e-6),
        slot: args.slot.clone(),
        started,
        transport: transport.into(),
        jobs,
        delta_same: delta.then_some(same),
        delta_copied: delta.then_some(copied),
    })
}

/// application_name the standby uses in primary_conninfo (to find it in
/// pg_stat_replication): the one --source or PGAPPNAME gives, else the slot name or
/// `pgjet_standby_<port>`.
fn standby_app_name(s: &Settings, args: &ReplicaOptions, given: &ConnInfo) -> String {
    given
        .get("application_name")
        .map(str::to_owned)
        .or_else(|| args.slot.clone())
        .unwrap_or_else(|| format!("pgjet_standby_{}", s.pg_port))
}

/// primary_conninfo, as pg_basebackup -R writes it: every connection parameter in effect
/// (from --source, the environment and the password file, so the standby connects as pgjet
/// did), but the database (a walreceiver needs none), with `application_name` = `app`.
fn standby_conninfo(effective: &ConnInfo, app: &str) -> String {
    let mut c = effective.clone();
    c.params.remove("dbname");
    c.params.remove("passfile");
    c.params.insert("application_name".into(), app.to_string());
    c.to_conninfo_string()
}

#[allow(clippy::too_many_arguments)]
fn copy_and_configure(
    s: &Settings,
    args: &ReplicaOptions,
    primary: &Primary,
    target: &Path,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
    locations: Vec<(u32, PathBuf)>,
    app: &str,
    delta: bool,
    progress: &dyn Progress,
) -> Result<(u64, u64, u64)> {
    let mut dir = DirTarget {
        pg_path: target,
        tablespaces,
        map,
        locations,
        sync: None,
        written: Vec::new(),
        system_identifier: primary.info.system_identifier,
        delta,
        same: 0,
        copied: 0,
    };
    let bb: BaseBackup = run_base_backup(
        &primary.sess,
        &primary.info,
        primary.source.as_ref(),
        tablespaces,
        &mut dir,
        &BaseBackupOptions {
            label: &format!("pgjet replica-create {}", target.display()),
            start_fast: args.start_fast,
            jobs: primary.jobs,
            phase: "replica-create",
        },
        progress,
    )?;
    if let Some(name) = &args.slot {
        primary.sess.copy_slot_permanent(&bb.slot, name)?;
    }
    let (paths, mtimes): (Vec<PathBuf>, Vec<i64>) =
        std::mem::take(&mut dir.written).into_iter().unzip();
    set_mtimes(&paths, &mtimes)?;

    write_file(
        &target.join("backup_label"),
        bb.stop.backup_label.as_bytes(),
    )?;
    if !tablespaces.is_empty() {
        write_file(
            &target.join("tablespace_map"),
            remap_tablespace_map(&dir.locations).as_bytes(),
        )?;
    }
    let conninfo = standby_conninfo(&primary.target.effective, app);
    let mut lines = vec![
        "# standby settings added by pgjet replica-create".to_string(),
        format!("primary_conninfo = {}", quote_conf_value(&conninfo)),
    ];
    if let Some(slot) = &args.slot {
        lines.push(format!("primary_slot_name = {}", quote_conf_value(slot)));
    }
    if s.pg_port != crate::options::DEFAULT_PG_PORT || args.start {
        lines.push(format!("port = {}", s.pg_port));
    }
    append_auto_conf(target, &lines)?;
    write_file(&target.join("standby.signal"), b"")?;
    if let Some(sync) = &dir.sync {
        sync.sync()?;
    }
    // Last: pg_control, then the marker goes.
    write_file(&target.join(&*bb.control.path), &bb.control_bytes)?;
    crate::storage::posix::fsync_dir(&target.join("global"))?;
    delta::remove_marker(target)?;
    Ok((bb.total_bytes(), dir.same, dir.copied))
}

/// The directory of the PostgreSQL binaries that start the standby: --pg-bin; else, when
/// the primary runs on this host, its own (from the postmaster's /proc/<pid>/exe, its PID
/// being the first line of postmaster.pid); else Debian's /usr/lib/postgresql/<major>/bin.
fn bin_dir(args: &ReplicaOptions, local_dir: Option<&Path>, major: &str) -> Result<PathBuf> {
    if let Some(b) = &args.pg_bin {
        return Ok(b.clone());
    }
    if let Some(dir) = local_dir {
        let pidfile = dir.join("postmaster.pid");
        let text = fs::read_to_string(&pidfile).map_err(|e| Error::io("read", &pidfile, e))?;
        let pid = text.lines().next().unwrap_or("").trim().to_string();
        let exe = fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
            Error::Config(format!(
                "cannot find the primary's binaries from PID {pid} ({e}); pass --pg-bin"
            ))
        })?;
        return exe.parent().map(Path::to_path_buf).ok_or_else(|| {
            Error::Config("cannot find the primary's binaries; pass --pg-bin".into())
        });
    }
    let debian = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"));
    if debian.join("pg_ctl").exists() {
        return Ok(debian);
    }
    Err(Error::Config(format!(
        "no PostgreSQL {major} binaries found on this host (tried {}); pass --pg-bin",
        debian.display()
    )))
}

/// Starts the standby with pg_ctl and waits (up to 120 s) until the primary shows it
/// streaming in pg_stat_replication under application_name `app`.
fn start_standby(
    s: &Settings,
    args: &ReplicaOptions,
    local_dir: Option<&Path>,
    major: &str,
    target: &Path,
    conn: &crate::pg::conninfo::ConnTarget,
    app: &str,
) -> Result<()> {
    let bin = bin_dir(args, local_dir, major)?;
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
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sess = Session::connect(conn)?;
        // pg_stat_replication hides a walsender's state from roles without
        // pg_read_all_stats; pg_stat_activity still shows the role's own walsenders.
        let rows = sess.query_strings(
            "pg_stat_replication",
            &format!(
                "SELECT coalesce(r.state, 'hidden') FROM pg_stat_activity a \
                 LEFT JOIN pg_stat_replication r ON r.pid = a.pid \
                 WHERE a.backend_type = 'walsender' AND a.application_name = {}",
                quote_literal(app)
            ),
        )?;
        sess.close();
        let states: Vec<String> = rows
            .iter()
            .filter_map(|r| r.first().cloned().flatten())
            .collect();
        if states.iter().any(|s| s == "streaming") {
            tracing::info!("standby {} is streaming", target.display());
            return Ok(());
        }
        if states.iter().any(|s| s == "hidden") {
            tracing::info!(
                "standby {} is connected to the primary (its state is visible only with pg_read_all_stats)",
                target.display()
            );
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
    fn primary_conninfo_keeps_the_connection_but_the_database() {
        let eff = ConnInfo::parse(
            "host=10.0.0.1 port=5432 user=rep password='a b' dbname=postgres sslmode=verify-full application_name=pgjet",
        )
        .unwrap();
        let c = standby_conninfo(&eff, "s1");
        let back = ConnInfo::parse(&c).unwrap();
        assert_eq!(back.get("application_name"), Some("s1"));
        assert_eq!(back.get("password"), Some("a b"));
        assert_eq!(back.get("sslmode"), Some("verify-full"));
        assert_eq!(back.get("dbname"), None);
    }
}
