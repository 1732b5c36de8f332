//! `replica-create --transport basebackup`: the new standby written from the server's own
//! `BASE_BACKUP` stream (compressed on the primary, decoded here; see
//! [`crate::primary::stream_sequence`] and docs/basebackup-transport.md), then the same finish as the
//! other transports: standby settings, the slot made permanent from the temporary one, the
//! server's backup_manifest kept (pg_verifybackup passes), pg_control last.
use crate::error::{Error, Result};
use crate::options::{PrimaryConn, ReplicaOptions};
use crate::pgdata::finish::{finish, Finish};
use crate::pgdata::own_settings::OwnSettings;
use crate::pgdata::standby::{
    finish_replica, source_as_given, standby_app_name, standby_lines, undo_failed_replica, Copied,
    ReplicaSummary,
};
use crate::pgdata::standby_slot::{plan_slot, reserve_before_copy, settle_slot};
use crate::pgdata::stream_dir::StreamDir;
use crate::pgdata::{
    delta_target, incremental, parse_tablespace_map, plan_locations, prepare_target,
    tablespace_locations,
};
use crate::pgdata::{DataDirModes, TargetSync};
use crate::primary::choose::Reached;
use crate::primary::stream_sequence::{connect_checked, run_stream_backup, StreamOptions};
use crate::transfer::Progress;
use std::time::Instant;

/// Runs `replica-create` over the `BASE_BACKUP` stream, on the primary `reached` already
/// (`--transport auto`'s probe session) or connecting. With `--delta` over a kept copy of
/// the same cluster the stream is written in place, only the blocks that differ
/// ([`StreamDir::delta`]), and what the server did not send is removed. Errors: as the
/// other transports', plus the replication connection's ([`Error::Replication`]).
pub fn run(
    s: &PrimaryConn,
    args: &ReplicaOptions,
    reached: Option<Reached>,
    progress: &dyn Progress,
) -> Result<ReplicaSummary> {
    let target = s.pg_path()?.to_path_buf();
    if !target.is_absolute() {
        return Err(Error::Config("--pg-path must be an absolute path".into()));
    }
    let map = parse_tablespace_map(&args.tablespace_map)?;
    let given = source_as_given(s)?;
    let Reached {
        target: conn,
        ctl,
        mut info,
        early,
        ..
    } = match reached {
        Some(r) => r,
        None => Reached::connect(s, true)?,
    };
    if info.in_recovery {
        // PostgreSQL's BASE_BACKUP on a standby (basebackup.c, xlog.c do_pg_backup_stop):
        // the copy ends at the standby's replay point, with the standby's WAL; a standby
        // promoted meanwhile fails the backup ("the standby was promoted during online
        // backup").
        tracing::info!(
            "the source is a standby: the copy ends at its replay point, with its WAL; the new standby follows it (cascading) unless told otherwise"
        );
    }
    let delta = crate::pgdata::standby::kept_copy(&target, info.system_identifier, args)?;
    if delta && info.catalog_version == 0 {
        // No replication command gives the catalog version; a kept copy of the same major
        // has the server's (it changes only between majors).
        info.catalog_version = crate::pgdata::kept_catalog_version(&target, &info.major());
    }
    // Over a replication connection nothing lists the tablespaces before the stream: a
    // kept copy's are its own links, the others come with the stream's header, which
    // --tablespace-map is then checked against (StreamDir::tablespaces_from_header).
    let (tablespaces, map_now) = match ctl.session() {
        Some(sess) => (sess.tablespaces()?, map.clone()),
        None if delta => (crate::pgdata::kept_tablespaces(&target)?, Vec::new()),
        None => (Vec::new(), Vec::new()),
    };
    // Checked before anything is made on the primary: a delta keeps its tablespaces where
    // they are, a new copy needs empty places for them.
    let kept_locations = if delta {
        tablespace_locations(&tablespaces, &map_now)?
    } else {
        plan_locations(&target, &tablespaces, &map_now)?;
        Vec::new()
    };
    // A re-synced standby keeps its own settings and slot (pgdata::own_settings).
    let own = if delta {
        OwnSettings::read(&target)?
    } else {
        OwnSettings::default()
    };
    let slot = plan_slot(&*ctl, args.slot.as_deref(), own.slot().as_deref())?;
    let slot_name = slot.as_ref().map(|p| p.name.as_str());
    let mut made = false;
    let dir_mode = ctl
        .show("data_directory_mode")?
        .and_then(|m| u32::from_str_radix(m.trim_start_matches('0'), 8).ok())
        .unwrap_or(0o700)
        & 0o777;
    let clock = Instant::now();
    let app = standby_app_name(&given, &own, slot_name, s.pg_port);
    let opts = StreamOptions {
        label: format!("pgjet replica-create {}", target.display()),
        fast: args.start_fast,
        compress: s.network_compress,
        level: s.network_level,
        max_rate: s.max_rate,
        wal: true,
        tablespace_map: false,
        workers: s.network_workers,
        incremental: None,
    };
    // An incremental stream over the kept copy, read before its pg_control goes; the
    // replication connection that read it carries the stream.
    let (mut early, mut increment) = (early, None);
    if delta {
        let mut c = match early.take() {
            Some(c) => c,
            None => connect_checked(&conn, &info)?,
        };
        increment = incremental::plan(&mut c, &info, &target, &kept_locations)?;
        early = Some(c);
    }
    let opts = StreamOptions {
        incremental: increment,
        ..opts
    };
    let mut delta_bytes = None;
    let res = (|| -> Result<(u64, u64, String)> {
        if let Some(slot) = &slot {
            made = reserve_before_copy(&*ctl, slot)?;
        }
        let locations = if delta {
            delta_target::begin_stream_delta(
                &target,
                info.system_identifier,
                &kept_locations,
                dir_mode,
            )?;
            kept_locations.clone()
        } else {
            prepare_target(
                &target,
                info.system_identifier,
                &tablespaces,
                &map_now,
                &[("global".into(), dir_mode)],
            )?
        };
        let sync = TargetSync::open(&target, &locations)?;
        let modes = DataDirModes::of_mode(dir_mode);
        let mut sink = StreamDir::new(&target, locations, modes.dir, s.jobs, Some(progress));
        if ctl.session().is_none() {
            sink = sink.tablespaces_from_header(map.clone());
        }
        if opts.incremental.is_some() {
            sink = sink.incremental();
        } else if delta {
            sink = sink.delta();
        }
        let streamed = run_stream_backup(&*ctl, &info, &conn, early, &opts, &mut sink);
        let written = sink.finish();
        progress.finish();
        let sb = streamed?;
        written?;
        if let Some(got) = sink.take_delta() {
            let removed = delta_target::remove_unlisted(&target, &got.dirs, &got.files)?;
            use std::sync::atomic::Ordering::Relaxed;
            let (same, wrote) = (
                got.count.same.load(Relaxed),
                got.count.written.load(Relaxed),
            );
            tracing::info!(
                "delta: {} equal in place, {} written, {removed} file(s) or directories the primary does not have removed",
                crate::io::mib(same),
                crate::io::mib(wrote)
            );
            delta_bytes = Some((same, wrote));
        }
        if let Some(slot) = &slot {
            made |= settle_slot(&*ctl, slot, &sb.slot, sb.outcome.start_lsn)?;
        }
        let d = &sb.outcome.decoded;
        let mut label = d
            .backup_label
            .as_ref()
            .map(|f| f.bytes.clone())
            .unwrap_or_default();
        if sb.incremental {
            label = incremental::plain_label(&label);
        }
        let control = d.control.clone().unwrap_or_default();
        finish(
            &target,
            &sync,
            &Finish {
                backup_label: &label,
                tablespace_map: None,
                replace_recovery_settings: Some("pgjet replica-create".into()),
                auto_conf: standby_lines(
                    s,
                    args,
                    &conn,
                    &app,
                    slot_name,
                    &own,
                    &OwnSettings::copied(&target)?,
                ),
                signal: Some("standby.signal"),
            },
            // The server's manifest, so pg_verifybackup checks the new directory; an
            // incremental one lists the increments, not the files rebuilt from them.
            || match &d.manifest {
                Some(_) if sb.incremental => {
                    let old = target.join("backup_manifest");
                    match std::fs::remove_file(&old) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            Err(Error::io("remove", &old, e))
                        }
                        _ => Ok(()),
                    }
                }
                Some(m) => m.write_to(&target.join("backup_manifest"), modes.file),
                None => Ok(()), // refused by the manifest check before the finish
            },
            || {
                crate::io::fs::write_file(
                    &target.join("global/pg_control"),
                    &control.bytes,
                    if control.mode == 0 {
                        modes.file
                    } else {
                        control.mode
                    },
                )
            },
        )?;
        Ok((d.logical_bytes, d.wire_bytes, sb.codec.name().to_string()))
    })();
    let (size, wire, codec) = match res {
        Ok(v) => v,
        Err(e) => {
            undo_failed_replica(&*ctl, slot_name.filter(|_| made), &target);
            return Err(e);
        }
    };
    let major = info.major();
    ctl.close();
    let copied = Copied {
        target: &target,
        size,
        seconds: clock.elapsed().as_secs_f64(),
        transport: "basebackup",
        jobs: s.jobs,
        major: &major,
        local_dir: None,
        slot: slot_name,
    };
    Ok(ReplicaSummary {
        delta_same: delta_bytes.map(|d| d.0),
        delta_copied: delta_bytes.map(|d| d.1),
        wire_bytes: Some(wire),
        network_compress: Some(codec),
        ..finish_replica(s, args, &copied, &conn, &app)?
    })
}
