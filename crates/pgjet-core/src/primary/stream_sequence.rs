//! The base-backup sequence over the replication protocol (`--transport basebackup`): the
//! server runs the backup itself (`BASE_BACKUP`, src/backend/backup/basebackup.c) and sends
//! one compressed tar per tablespace; pgjet decodes it as it arrives
//! ([`crate::remote::basebackup`]) into the caller's sink.
//!
//! Order of work:
//! 1. a temporary physical replication slot on the control connection (the SQL session, or
//!    a replication connection for a role let in for replication only:
//!    [`crate::remote::control`]) reserves WAL (it dies with that connection, so a killed pgjet
//!    leaks nothing);
//! 2. a replication connection for the stream; `IDENTIFY_SYSTEM` must give the control
//!    connection's system identifier (both reach the same cluster);
//! 3. `BASE_BACKUP` with the chosen compression; the stream is decoded into the sink,
//!    backup_label, tablespace_map and pg_control held back;
//! 4. every file is checked against the server's backup_manifest (size and CRC-32C);
//! 5. the slot is checked: had it lost its WAL, the copy could hold recycled segments.
use crate::error::{Error, Result};
use crate::options::NetworkCompress;
use crate::pg::conninfo::ConnTarget;
use crate::pg::session::{ServerInfo, Session};
use crate::remote::basebackup::{
    check_manifest, run_stream, BaseBackupCommand, StreamOutcome, StreamSink, WireCodec,
};
use crate::remote::control::Control;
use crate::remote::replication::ReplConn;

/// How to run the stream.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// LABEL (shows in backup_label and the server log).
    pub label: String,
    /// An immediate checkpoint.
    pub fast: bool,
    pub compress: NetworkCompress,
    /// Compression level; None: the server's default.
    pub level: Option<i32>,
    /// Bytes per second; None: no limit.
    pub max_rate: Option<u64>,
    /// Put the backup's WAL in the stream (under pg_wal/).
    pub wal: bool,
    /// Ask for tablespace_map (else the tablespace links come as symbolic links).
    pub tablespace_map: bool,
    /// zstd threads on the server (0: none); None: the primary's [`WORKERS_QUERY`].
    pub workers: Option<u32>,
    /// An incremental `BASE_BACKUP` (PostgreSQL 17+) against this backup_manifest, uploaded
    /// on the stream's connection first (`crate::pgdata::incremental::kept_manifest`). A
    /// server that refuses it (its summaries do not reach back that far, another history)
    /// is asked for the whole stream instead, and the log says why.
    pub incremental: Option<Vec<u8>>,
}

/// What the stream produced.
#[derive(Debug)]
pub struct StreamBackup {
    /// The temporary slot that protected the WAL; it lives as long as the session.
    pub slot: String,
    pub codec: WireCodec,
    pub outcome: StreamOutcome,
    /// The stream was incremental: its relation files came as `INCREMENTAL.` files and its
    /// backup_label names the prior backup (`INCREMENTAL FROM`).
    pub incremental: bool,
}

/// The compression methods the server's build has, best first (zstd, lz4, then gzip, which
/// is always there), from the values `wal_compression` accepts: PostgreSQL 15+ lists `lz4`
/// and `zstd` there only when built with them (wal_compression_options in guc_tables.c,
/// under USE_LZ4 and USE_ZSTD), and `pg_settings` is readable by every role. None before
/// PostgreSQL 15 (a boolean there) or when the row cannot be read.
pub fn server_codecs(sess: &Session) -> Option<Vec<WireCodec>> {
    let v = sess
        .query_row("read the server's compression methods", CODECS_QUERY)
        .ok()
        .and_then(|r| r.into_iter().next().flatten())?;
    codecs_from_enumvals(&v)
}

/// The query behind [`server_codecs`]: one row, `wal_compression`'s values joined by commas.
pub const CODECS_QUERY: &str =
    "SELECT array_to_string(enumvals, ',') FROM pg_settings WHERE name = 'wal_compression'";

/// [`server_codecs`] from `wal_compression`'s values joined by commas (`pglz,lz4,zstd,on,off`
/// on a build with both). None when they are not the PostgreSQL 15+ list (no `pglz`).
pub fn codecs_from_enumvals(values: &str) -> Option<Vec<WireCodec>> {
    let values: Vec<&str> = values.split(',').map(str::trim).collect();
    if !values.contains(&"pglz") {
        return None;
    }
    let mut v = Vec::new();
    if values.contains(&"zstd") {
        v.push(WireCodec::Zstd);
    }
    if values.contains(&"lz4") {
        v.push(WireCodec::Lz4);
    }
    v.push(WireCodec::Gzip);
    Some(v)
}

/// The compression methods to try for `wanted`, best first, and the zstd threads to ask for
/// (`given`, else the primary's [`WORKERS_QUERY`]), in one round trip at most. For `auto`
/// the methods are those the server's build has ([`codecs_from_enumvals`]), else zstd, lz4,
/// gzip in turn (a server built without one refuses it at once, before the checkpoint:
/// parse_basebackup_options in basebackup.c). Threads that cannot be read: none.
pub fn stream_methods(
    ctl: &dyn Control,
    wanted: NetworkCompress,
    given: Option<u32>,
) -> (Vec<WireCodec>, u32) {
    let ask_workers =
        given.is_none() && matches!(wanted, NetworkCompress::Auto | NetworkCompress::Zstd);
    let (codecs, workers) = match ctl.session() {
        Some(sess) => {
            let row = (wanted == NetworkCompress::Auto || ask_workers)
                .then(|| {
                    sess.query_row(
                        "read the server's compression methods and max_parallel_maintenance_workers",
                        &format!("SELECT ({CODECS_QUERY}), {WORKERS_QUERY}"),
                    )
                    .ok()
                })
                .flatten()
                .unwrap_or_default();
            let col = |i: usize| row.get(i).cloned().flatten();
            (col(0), col(1))
        }
        // A replication connection: SHOW gives the threads; the methods are tried in turn
        // (SHOW prints wal_compression's value, not the values it accepts).
        None => (
            None,
            ask_workers
                .then(|| ctl.show("max_parallel_maintenance_workers").ok().flatten())
                .flatten(),
        ),
    };
    methods_from(
        wanted,
        given,
        codecs,
        workers,
        &[WireCodec::Zstd, WireCodec::Lz4, WireCodec::Gzip],
    )
}

/// The methods to try for `wanted`, best first, and the zstd threads to ask for, from what
/// [`CODECS_QUERY`] and [`WORKERS_QUERY`] returned (`codecs`, `workers`; None: not read):
/// for `auto` the server's methods, or `unknown` when they cannot be read; `given` threads,
/// else the server's setting, else none.
pub fn methods_from(
    wanted: NetworkCompress,
    given: Option<u32>,
    codecs: Option<String>,
    workers: Option<String>,
    unknown: &[WireCodec],
) -> (Vec<WireCodec>, u32) {
    let methods = candidates_for(wanted, || {
        codecs
            .as_deref()
            .and_then(codecs_from_enumvals)
            .unwrap_or_else(|| unknown.to_vec())
    });
    let workers = given.unwrap_or_else(|| workers.and_then(|v| v.trim().parse().ok()).unwrap_or(0));
    (methods, workers)
}

/// The query for the zstd threads a stream asks for by default: the primary's
/// `max_parallel_maintenance_workers` (PostgreSQL 11+, default 2), the helper processes
/// PostgreSQL lets one maintenance command (CREATE INDEX, VACUUM) take: the DBA's budget of
/// cores for one job beside the live load, which a base backup is.
pub const WORKERS_QUERY: &str = "current_setting('max_parallel_maintenance_workers')";

/// The one method `wanted` names, or for `auto` what `server_has` returns (asked only then).
fn candidates_for(
    wanted: NetworkCompress,
    server_has: impl FnOnce() -> Vec<WireCodec>,
) -> Vec<WireCodec> {
    match wanted {
        NetworkCompress::None => vec![WireCodec::None],
        NetworkCompress::Gzip => vec![WireCodec::Gzip],
        NetworkCompress::Lz4 => vec![WireCodec::Lz4],
        NetworkCompress::Zstd => vec![WireCodec::Zstd],
        NetworkCompress::Auto => server_has(),
    }
}

/// The level to ask for: `given`, else for gzip chosen by `auto` level 1 (gzip's default,
/// 6, compresses at about a third of level 1's rate for a few percent more), else the
/// server's default.
pub fn codec_level(codec: WireCodec, wanted: NetworkCompress, given: Option<i32>) -> Option<i32> {
    given.or((codec == WireCodec::Gzip && wanted == NetworkCompress::Auto).then_some(1))
}

/// A replication connection to `target` that reaches the cluster of `info`
/// (`IDENTIFY_SYSTEM`). Errors: the connection's; another cluster ([`Error::Unsafe`]).
pub fn connect_checked(target: &ConnTarget, info: &ServerInfo) -> Result<ReplConn> {
    let mut conn = ReplConn::connect(target)?;
    let (sysid, _tli, _) = conn.identify_system()?;
    if sysid != info.system_identifier {
        return Err(Error::Unsafe(format!(
            "the replication connection reached the cluster {sysid}, the SQL session {}: both must reach the same primary",
            info.system_identifier
        )));
    }
    Ok(conn)
}

/// Runs the sequence (see the module's documentation) on the primary behind `ctl` (its SQL
/// session or a replication connection: [`crate::remote::control`]; facts `info`), reached again
/// at `target` for the stream's replication connection, decoding into `sink`.
///
/// Errors: the replication connection refused ([`Error::Replication`], whose hint names
/// `ALTER ROLE ... REPLICATION` or the pg_hba.conf line); another cluster behind the
/// replication connection ([`Error::Unsafe`]); a stream that is short, corrupt or differs
/// from its manifest ([`Error::Corrupt`]); the slot losing its WAL.
/// `early`: a replication connection to the same cluster opened already ([`connect_checked`],
/// as `--transport auto` does while its probe runs), used first.
pub fn run_stream_backup(
    ctl: &dyn Control,
    info: &ServerInfo,
    target: &ConnTarget,
    early: Option<ReplConn>,
    opts: &StreamOptions,
    sink: &mut dyn StreamSink,
) -> Result<StreamBackup> {
    // A standby streams its base backup as a primary does (PostgreSQL's BASE_BACKUP on a
    // standby: backup_label says "BACKUP FROM: standby", the WAL comes from the standby).
    let (candidates, mut workers) = stream_methods(ctl, opts.compress, opts.workers);
    // The replication connection first: a role without REPLICATION or a missing pg_hba.conf
    // line is reported by it, with its fix, before anything is made on the primary.
    let mut first = Some(match early {
        Some(c) => c,
        None => connect_checked(target, info)?,
    });
    super::backup_sequence::announce_checkpoint(ctl, opts.fast);
    let slot = format!("pgjet_{}", std::process::id());
    ctl.create_slot(&slot, true)?;
    let mut last_err = None;
    let mut incremental = opts.incremental.as_deref();
    let mut i = 0;
    while i < candidates.len() {
        let codec = candidates[i];
        i += 1;
        let mut conn = match first.take() {
            Some(c) => c,
            None => connect_checked(target, info)?,
        };
        let cmd = BaseBackupCommand {
            label: opts.label.clone(),
            fast: opts.fast,
            wal: opts.wal,
            max_rate: opts.max_rate,
            codec,
            level: codec_level(codec, opts.compress, opts.level),
            workers: Some(workers),
            tablespace_map: opts.tablespace_map,
            incremental: incremental.is_some(),
        };
        let uploaded = match incremental {
            Some(m) => conn.upload_manifest(m),
            None => Ok(()),
        };
        let mut watched = Watched {
            sink: &mut *sink,
            started: false,
        };
        let run = uploaded.and_then(|_| run_stream(&mut conn, &cmd, &mut watched));
        let before_data = !watched.started;
        match run {
            Ok(outcome) => {
                conn.close();
                let what = format!("BASE_BACKUP stream from {}", target.describe);
                check_manifest(
                    &outcome.decoded.received,
                    outcome.decoded.manifest.as_ref(),
                    &what,
                )?;
                for (name, present) in [
                    ("backup_label", outcome.decoded.backup_label.is_some()),
                    ("global/pg_control", outcome.decoded.control.is_some()),
                ] {
                    if !present {
                        return Err(Error::Corrupt {
                            label: what,
                            files: vec![format!("{name} (missing from the stream)")],
                        });
                    }
                }
                if let Some(c) = &outcome.decoded.control {
                    // The server reads pg_control while it runs; a torn read fails its CRC.
                    if !crate::pg::control::crc_is_valid(&c.bytes) {
                        return Err(Error::Corrupt {
                            label: what,
                            files: vec![
                                "global/pg_control (its CRC does not match: read while it was being written; run again)".into(),
                            ],
                        });
                    }
                }
                ctl.check_slot_holds(&slot)?;
                tracing::info!(
                    "BASE_BACKUP ({}{}): {} bytes of files in {} bytes on the wire, LSN {} to {}",
                    codec.name(),
                    match (codec, workers) {
                        (WireCodec::Zstd, 1) => ", 1 thread on the server".to_string(),
                        (WireCodec::Zstd, w @ 2..) => format!(", {w} threads on the server"),
                        _ => String::new(),
                    },
                    outcome.decoded.logical_bytes,
                    outcome.decoded.wire_bytes,
                    outcome.start_lsn,
                    outcome.end_lsn
                );
                return Ok(StreamBackup {
                    slot,
                    codec,
                    outcome,
                    incremental: cmd.incremental,
                });
            }
            // The server refused the kept copy as a prior backup, before sending anything
            // (basebackup_incremental.c: its summaries do not reach back to the copy's redo
            // point, summarization is not progressing, a history it does not share): the
            // whole stream, compared block by block.
            Err(Error::Replication { error, .. })
                if incremental.is_some() && before_data && refuses_increment(&error.message) =>
            {
                tracing::info!(
                    "the server refused the incremental BASE_BACKUP ({}); the whole stream instead, compared with the kept copy block by block",
                    error.message
                );
                incremental = None;
                i -= 1;
                continue;
            }
            // A libzstd built without threads (basebackup_zstd.c): zstd again, on the backend.
            Err(Error::Replication { error, .. })
                if codec == WireCodec::Zstd
                    && workers > 0
                    && error
                        .message
                        .contains("could not set compression worker count") =>
            {
                tracing::info!(
                    "the server cannot compress with zstd threads: {}; zstd without them",
                    error.message
                );
                workers = 0;
                i -= 1;
                continue;
            }
            Err(Error::Replication { error, .. })
                if i < candidates.len()
                    && error.message.contains("does not support compression") =>
            {
                tracing::info!(
                    "the server cannot compress with {}: {}; trying the next method",
                    codec.name(),
                    error.message
                );
                last_err = Some(error.message);
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::Unsafe(format!(
        "the server supports none of the compression methods tried ({})",
        last_err.unwrap_or_default()
    )))
}

/// A sink that records whether the stream started (its first result set came): an
/// incremental `BASE_BACKUP` refused before that wrote nothing, so the whole stream may
/// follow into the same sink.
struct Watched<'s> {
    sink: &'s mut dyn StreamSink,
    started: bool,
}

impl StreamSink for Watched<'_> {
    fn begin_archive(&mut self, name: &str, tablespace: Option<u32>) -> Result<()> {
        self.sink.begin_archive(name, tablespace)
    }
    fn directory(&mut self, path: &str, mode: u32) -> Result<()> {
        self.sink.directory(path, mode)
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.sink.symlink(path, target)
    }
    fn file_begin(&mut self, path: &str, size: u64, mode: u32, mtime: i64) -> Result<()> {
        self.sink.file_begin(path, size, mode, mtime)
    }
    fn file_data(&mut self, data: &[u8]) -> Result<()> {
        self.sink.file_data(data)
    }
    fn file_end(&mut self) -> Result<()> {
        self.sink.file_end()
    }
    fn started(&mut self, start: &crate::transfer::stream_units::StreamStart) -> Result<()> {
        self.started = true;
        self.sink.started(start)
    }
    fn progress(&mut self, done: u64) {
        self.sink.progress(done)
    }
}

/// Whether `message` is the server refusing an uploaded manifest or an incremental
/// `BASE_BACKUP` before it sends anything (walsender.c, basebackup_incremental.c,
/// parse_manifest.c: the manifest, the WAL summaries, the timelines they need).
fn refuses_increment(message: &str) -> bool {
    ["manifest", "summar", "incremental", "timeline"]
        .iter()
        .any(|w| message.to_lowercase().contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codecs_from_wal_compression_values() {
        use WireCodec::{Gzip, Lz4, Zstd};
        // As PostgreSQL 15 from Debian (lz4 and zstd) and the PostgreSQL 18 wheel (neither)
        // list them.
        assert_eq!(
            codecs_from_enumvals("pglz,lz4,zstd,on,off"),
            Some(vec![Zstd, Lz4, Gzip])
        );
        assert_eq!(codecs_from_enumvals("pglz,on,off"), Some(vec![Gzip]));
        assert_eq!(
            codecs_from_enumvals("pglz,lz4,on,off"),
            Some(vec![Lz4, Gzip])
        );
        // PostgreSQL 14's boolean has no values; anything else is not the list.
        assert_eq!(codecs_from_enumvals(""), None);
        assert_eq!(codecs_from_enumvals("on,off"), None);
    }

    #[test]
    fn methods_and_threads_from_the_values_read() {
        use WireCodec::{Gzip, Lz4, Zstd};
        let v = |s: &str| Some(s.to_string());
        let auto = NetworkCompress::Auto;
        assert_eq!(
            methods_from(auto, None, v("pglz,lz4,zstd,on,off"), v("2"), &[Gzip]),
            (vec![Zstd, Lz4, Gzip], 2)
        );
        // Nothing read: the fallback, no threads; threads given win over the setting.
        assert_eq!(
            methods_from(auto, None, None, None, &[Gzip]),
            (vec![Gzip], 0)
        );
        assert_eq!(
            methods_from(auto, Some(0), v("pglz,on,off"), v("4"), &[Zstd]),
            (vec![Gzip], 0)
        );
        // A method named is the only one; a setting that is not a count means none.
        assert_eq!(
            methods_from(
                NetworkCompress::Lz4,
                None,
                v("pglz,on,off"),
                v("x"),
                &[Zstd]
            ),
            (vec![Lz4], 0)
        );
    }
}
