//! `replica-create`: clones a running primary straight into a new standby data directory
//! with the parallel engine, no repository in between. The primary may be on this host
//! (files read locally) or on another one (files read over libpq connections; nothing is
//! installed on the primary).
//!
//! The copy is the shared base-backup sequence ([`crate::primary::backup_sequence`]) under a temporary
//! slot made before the backup starts, so nothing the standby needs is recycled and a killed
//! clone leaks nothing. --slot is made permanent only after a good copy, as a copy of the
//! temporary slot (same restart LSN); the standby then streams from it. The WAL from the
//! start to the stop LSN is copied into the new pg_wal as well, so the standby reaches
//! consistency even before it connects.
use crate::error::{Error, Result};
use crate::options::Settings;
use crate::options::{PrimaryConn, ReplicaOptions};
use crate::pgdata::copy::{DeltaSince, DirTarget};
use crate::pgdata::finish::{finish, Finish};
use crate::pgdata::own_settings::OwnSettings;
use crate::pgdata::standby::{
    finish_replica, source_as_given, standby_app_name, standby_lines, undo_failed_replica, Copied,
    ReplicaSummary,
};
use crate::pgdata::standby_slot::{plan_slot, settle_slot, StandbySlot};
use crate::pgdata::{
    delta_target, parse_tablespace_map, plan_locations, remap_tablespace_map, set_mtimes,
    tablespace_locations,
};
use crate::primary::backup_sequence::{run_base_backup, BaseBackup, BaseBackupOptions};
use crate::primary::{open_primary, Primary};
use crate::transfer::Progress;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Runs `replica-create`.
pub fn run(s: &Settings, args: &ReplicaOptions, progress: &dyn Progress) -> Result<ReplicaSummary> {
    let primary_conn = &s.primary;
    if !s.pg_path()?.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let patroni_args;
    let args = match &args.patroni {
        Some(call) => {
            patroni_args = under_patroni(args, call, s.pg_path()?);
            &patroni_args
        }
        None => args,
    };
    // From the repository when told, when there is no source, or when auto finds it faster.
    // The source's session, when --seed auto connected to time it.
    let seed = crate::primary::seed_choice::wanted(&s.repo_set, primary_conn, args)?;
    if seed.repo {
        return super::replica_seed::run(s, args, progress);
    }
    // Settings errors before anything reaches the primary (the auto probe connects).
    let given = source_as_given(primary_conn)?;
    if s.primary.transport == crate::options::Transport::Basebackup {
        return super::replica_stream::run(primary_conn, args, seed.reached, progress);
    }
    // auto: the stream when the primary is on another host and the probe finds it faster,
    // or when the role may only stream (for --delta only then: the stream sends every file).
    if let Some((stream, reached)) =
        crate::primary::choose::auto_stream_settings(primary_conn, args.delta, true, seed.reached)?
    {
        return super::replica_stream::run(&stream, args, Some(reached), progress);
    }
    let target = s.pg_path()?.to_path_buf();
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let primary = open_primary(primary_conn, false)?;
    if primary.info.in_recovery {
        return Err(Error::Unsafe(format!(
            "the source is a standby: --transport {} copies from a primary only; use --transport basebackup (auto takes it), which a standby serves",
            s.primary.transport.as_str()
        )));
    }
    let transport = if primary.local_dir.is_some() {
        "local"
    } else {
        "libpq"
    };
    let tablespaces = primary.sess.tablespaces()?;
    // Check targets before anything is created on the primary.
    let delta = crate::pgdata::standby::kept_copy(&target, primary.info.system_identifier, args)?;
    let locations = if delta {
        tablespace_locations(&tablespaces, &map)?
    } else {
        plan_locations(&target, &tablespaces, &map)?
    };
    // A re-synced standby keeps its own settings and slot (pgdata::own_settings).
    let own = if delta {
        OwnSettings::read(&target)?
    } else {
        OwnSettings::default()
    };
    let slot = plan_slot(&primary.sess, args.slot.as_deref(), own.slot().as_deref())?;
    let clock = Instant::now();
    let slot_name = slot.as_ref().map(|p| p.name.as_str());
    let app = standby_app_name(&given, &own, slot_name, s.primary.pg_port);
    let mut made = false;
    let res = copy_and_configure(
        primary_conn,
        args,
        &primary,
        &target,
        &tablespaces,
        &map,
        locations,
        &Standby {
            app: &app,
            slot: slot.as_ref(),
            own: &own,
        },
        &mut made,
        delta,
        progress,
    );
    if let Err(e) = res {
        undo_failed_replica(&primary.sess, slot_name.filter(|_| made), &target);
        return Err(e);
    }
    let (size, same, copied_bytes) = res.unwrap_or((0, 0, 0));
    let major = primary.info.major();
    let conn = primary.target.clone();
    let jobs = primary.jobs;
    let local_dir = primary.local_dir.clone();
    primary.close();
    let copied = Copied {
        target: &target,
        size,
        seconds: clock.elapsed().as_secs_f64(),
        transport,
        jobs,
        major: &major,
        local_dir: local_dir.as_deref(),
        slot: slot_name,
    };
    Ok(ReplicaSummary {
        delta_same: delta.then_some(same),
        delta_copied: delta.then_some(copied_bytes),
        ..finish_replica(primary_conn, args, &copied, &conn, &app)?
    })
}

/// What the standby is called and keeps: its application_name, its slot, its own settings.
struct Standby<'a> {
    app: &'a str,
    slot: Option<&'a StandbySlot>,
    own: &'a OwnSettings,
}

#[allow(clippy::too_many_arguments)]
fn copy_and_configure(
    conn: &PrimaryConn,
    args: &ReplicaOptions,
    primary: &Primary,
    target: &Path,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
    locations: Vec<(u32, PathBuf)>,
    standby: &Standby,
    made: &mut bool,
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
        since: if delta {
            delta_target::summaries_since(target).map(|point| DeltaSince {
                target: &primary.target,
                info: &primary.info,
                point,
                dir: target,
            })
        } else {
            None
        },
        changes: None,
        page_lsn_since: None,
        wal_scan: None,
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
    if let Some(slot) = standby.slot {
        *made = settle_slot(&primary.sess, slot, &bb.slot, bb.start_lsn)?;
    }
    let (paths, mtimes): (Vec<PathBuf>, Vec<i64>) =
        std::mem::take(&mut dir.written).into_iter().unzip();
    set_mtimes(&paths, &mtimes)?;

    let lines = standby_lines(
        conn,
        args,
        &primary.target,
        standby.app,
        standby.slot.map(|p| p.name.as_str()),
        standby.own,
        &OwnSettings::copied(target)?,
    );
    let sync = dir
        .sync
        .take()
        .ok_or_else(|| Error::Other("the target was not prepared".into()))?;
    finish(
        target,
        &sync,
        &Finish {
            backup_label: bb.stop.backup_label.as_bytes(),
            tablespace_map: (!tablespaces.is_empty()).then(|| remap_tablespace_map(&dir.locations)),
            replace_recovery_settings: Some("pgjet replica-create".into()),
            auto_conf: lines,
            signal: Some("standby.signal"),
        },
        || Ok(()),
        || {
            let (path, mode) = (target.join(&*bb.control.path), bb.control.mode);
            crate::io::fs::write_file(&path, &bb.control_bytes, mode)
        },
    )?;
    Ok((bb.total_bytes(), dir.same, dir.copied))
}

/// replica-create as Patroni's replica creation method: says so (with the arguments it
/// ignored), and re-syncs in place (`--delta`) a data directory Patroni left that is not
/// empty (`keep_data: true`: a reinit over kept data, a failed start), which the delta's own
/// check then holds to be a copy of the same cluster.
fn under_patroni(
    args: &ReplicaOptions,
    call: &crate::options::patroni::PatroniCall,
    target: &Path,
) -> ReplicaOptions {
    tracing::info!(
        "called by Patroni as its replica creation method (scope {}, role {}{}{})",
        call.scope,
        call.role.as_deref().unwrap_or("-"),
        if call.keep_data { ", keep_data" } else { "" },
        if call.no_leader { ", no_leader" } else { "" }
    );
    if !call.ignored.is_empty() {
        tracing::info!(
            "Patroni's arguments that replica-create does not take, ignored: {}",
            call.ignored.join(" ")
        );
    }
    if let Some(slot) = &args.slot {
        tracing::warn!(
            "--slot {slot}: Patroni makes each member's slot on the leader and drops the physical slots it does not manage (unless its ignore_slots or slots settings list them)"
        );
    }
    let mut out = args.clone();
    let kept = std::fs::read_dir(target)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if kept && !out.delta {
        tracing::info!(
            "{} is not empty (Patroni kept it): it is re-synced in place, copying only what differs (--delta)",
            target.display()
        );
        out.delta = true;
    }
    out
}
