//! `replica-create` seeded from the repository (`--seed`): the stanza's newest backup is
//! restored as a standby, which replays the WAL archived since the backup through
//! restore_command (`pgjet archive-get`) and then streams from the source, which serves only
//! the WAL the archive lacks. With no source at all (Patroni's `no_leader` call when no
//! member leads: `--connstring=` empty), the repository is the only place to seed from.
//! How `--seed auto` chooses is [`crate::primary::seed_choice`]'s.
use crate::error::{Error, Result};
use crate::options::{ReplicaOptions, RestoreOptions, RestoreType, Settings};
use crate::pgdata::own_settings::OwnSettings;
use crate::pgdata::standby::{standby_app_name, standby_lines, ReplicaSummary};
use crate::transfer::Progress;
use std::path::Path;
use std::time::Instant;

/// Runs replica-create seeded from the repository: the newest backup restored as a standby
/// (`--delta` over a kept copy of the same cluster), with restore_command reading the
/// archive and, when a source is given, primary_conninfo for it; under Patroni no
/// recovery setting (Patroni writes its own: its `recovery_conf.restore_command` must read
/// the archive, as in its pgBackRest recipe).
///
/// Errors: `--slot` (the slot a standby needs from its backup's start is not on the
/// source); the restore's.
pub fn run(s: &Settings, args: &ReplicaOptions, progress: &dyn Progress) -> Result<ReplicaSummary> {
    let primary_conn = &s.primary;
    if args.slot.is_some() {
        return Err(Error::Config(
            "--slot with a seed from the repository: the standby replays the archive from the backup's start, which no new slot holds; create the slot on the primary and set primary_slot_name, or use --seed source".into(),
        ));
    }
    let target = s.pg_path()?.to_path_buf();
    let (st, label) = crate::repo::open::open_stanza_with_set(&s.repo_set, "latest")?;
    let summary = st.backup(&label).summary()?;
    let delta = crate::pgdata::standby::kept_copy(&target, summary.header.system_identifier, args)?;
    let source = s
        .primary
        .source
        .as_deref()
        .filter(|v| !v.trim().is_empty())
        .map(|_| crate::pgdata::standby::source_as_given(primary_conn))
        .transpose()?;
    let patroni = args.patroni.is_some();
    let own = if delta {
        OwnSettings::read(&target)?
    } else {
        OwnSettings::default()
    };
    let lines = match &source {
        Some(given) if !patroni => {
            let conn = crate::primary::primary_target(primary_conn)?;
            let app = standby_app_name(given, &own, None, s.primary.pg_port);
            standby_lines(
                primary_conn,
                args,
                &conn,
                &app,
                None,
                &own,
                &OwnSettings::default(),
            )
        }
        _ => Vec::new(),
    };
    if patroni {
        tracing::info!(
            "seeded from repo{} backup {label}: the standby replays the archived WAL through Patroni's postgresql.recovery_conf.restore_command (`pgjet archive-get %f \"%p\"`), then streams from the leader",
            st.repo()
        );
    } else if source.is_none() {
        tracing::info!(
            "no source: the standby replays the archive (restore_command) and streams from no one until primary_conninfo is set"
        );
    }
    let clock = Instant::now();
    let restore = RestoreOptions {
        set: label.clone(),
        restore_type: if patroni {
            RestoreType::Preserve
        } else {
            RestoreType::Standby
        },
        delta,
        tablespace_map: args.tablespace_map.clone(),
        ..RestoreOptions::default()
    };
    super::restore::run_with(s, &restore, lines, progress)?;
    let seconds = clock.elapsed().as_secs_f64();
    if args.start {
        start_seeded(
            s,
            args,
            &target,
            source.is_some(),
            &summary.header.pg_version,
        )?;
    }
    Ok(ReplicaSummary {
        pg_path: target.display().to_string(),
        size: summary.end.size,
        seconds,
        mib_per_sec: summary.end.size as f64 / 1048576.0 / seconds.max(1e-6),
        slot: None,
        started: args.start,
        transport: format!("repo{} backup {label}", st.repo()),
        jobs: s.jobs(),
        delta_same: None,
        delta_copied: None,
        wire_bytes: None,
        network_compress: None,
    })
}

/// `--start` after a seed: the standby started and waited for until it streams from the
/// source (after replaying the archive).
fn start_seeded(
    s: &Settings,
    args: &ReplicaOptions,
    target: &Path,
    has_source: bool,
    major: &str,
) -> Result<()> {
    let primary_conn = &s.primary;
    if !has_source {
        return Err(Error::Config(
            "--start needs --source: a standby seeded from the repository streams from it".into(),
        ));
    }
    let given = crate::pgdata::standby::source_as_given(primary_conn)?;
    let conn = crate::primary::primary_target(primary_conn)?;
    let app = standby_app_name(&given, &OwnSettings::default(), None, s.primary.pg_port);
    let bin = crate::pgdata::standby::bin_dir(args.pg_bin.as_deref(), None, major)?;
    crate::pgdata::standby::start_standby(&bin, s.primary.pg_port, target, &conn, &app)
}
