//! `archive-stream`: the WAL receiver of a backup host ([`crate::archive::receiver`]). The
//! cluster is `--source` (a libpq connection string; a multi-host one is followed to the
//! host that answers, the one that accepts writes with `target_session_attrs=read-write`);
//! the stanza's repositories get its WAL as archive-push would store it.
use crate::archive::push::Archiver;
use crate::archive::receiver::{self, status, ReceiverOptions};
use crate::archive::spool::Spool;
use crate::error::{Error, Result};
use crate::options::Settings;
use crate::pg::conninfo::ConnInfo;
use crate::pg::session::env_var;
use std::time::Duration;

/// The slot's name when `archive-stream-slot` is not given: `pgjet_stream_<stanza>`, the
/// stanza's name lower-cased with every character a slot name cannot hold (PostgreSQL:
/// lower-case letters, digits and underscores, at most 63 bytes, slot.c
/// `ReplicationSlotValidateName`) as `_`.
pub fn default_slot(stanza: &str) -> String {
    let mut name: String = format!("pgjet_stream_{stanza}")
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(63);
    name
}

/// Runs the receiver until SIGTERM or SIGINT.
///
/// Errors: no `--source`; a bad connection string; as [`receiver::run`].
pub fn run(s: &Settings) -> Result<()> {
    let cfg = s.archive_config();
    let source = s.primary.source.as_deref().ok_or_else(|| {
        Error::Config(
            "archive-stream needs the cluster to stream from: --source 'host=... user=...' (a role with REPLICATION)".into(),
        )
    })?;
    let (hosts, read_write) = ConnInfo::parse(source)
        .map_err(crate::pg::conninfo::source_error)?
        .per_host()?;
    let targets = hosts
        .into_iter()
        .map(|h| h.with_env_defaults(&env_var).resolve(&env_var, "pgjet"))
        .collect::<Result<Vec<_>>>()?;
    let archiver = Archiver::open(&cfg)?.expecting_duplicates();
    // The status file in the stanza's spool directory, for the metrics; the stream goes on
    // without it when the spool cannot be made.
    let status_file = match Spool::open(&cfg, archiver.stanza()) {
        Ok(_) => Some(status::status_path(&Spool::dir_of(&cfg, archiver.stanza()))),
        Err(e) => {
            tracing::warn!("no status file for the metrics: {e}");
            None
        }
    };
    let slot = match &s.archive.stream_slot {
        Some(slot) => slot.clone(),
        None => default_slot(archiver.stanza()),
    };
    receiver::run(
        &archiver,
        &ReceiverOptions {
            targets,
            read_write,
            slot,
            status_interval: Duration::from_secs(10),
            tail_interval: Duration::from_secs(1),
            status_file,
            jobs: cfg.jobs.max(1),
        },
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_slots_are_valid_slot_names() {
        assert_eq!(super::default_slot("main"), "pgjet_stream_main");
        assert_eq!(super::default_slot("DB-1.x"), "pgjet_stream_db_1_x");
        assert_eq!(super::default_slot(&"a".repeat(80)).len(), 63);
    }
}
