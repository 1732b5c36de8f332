//! The SQL session pgjet holds on the cluster during a backup (tokio-postgres on a small
//! runtime of its own, so the rest of pgjet stays synchronous).
//!
//! The non-exclusive low-level backup API (pg_backup_start / pg_backup_stop, PostgreSQL 15+;
//! see src/backend/access/transam/xlogfuncs.c) ties the backup to this session: if pgjet
//! dies, the connection closes and PostgreSQL aborts the backup; a temporary replication
//! slot made on the same session is dropped with it.
use crate::error::{Error, Result};
use crate::pg::conninfo::{ConnInfo, ConnTarget};
use crate::pg::lsn::Lsn;
use std::path::Path;
use tokio_postgres::{Client, NoTls};

/// The oldest major version pgjet supports (pg_backup_start appeared in 15).
pub const MIN_VERSION_NUM: u32 = 150000;

/// Reads ranges of data-directory files in one query, in the order given: `$1` paths
/// (text[]), `$2` offsets and `$3` lengths (int8[], bytes); a NULL row for a file that does
/// not exist (`pg_read_binary_file`'s `missing_ok`). WITH ORDINALITY gives the function scan
/// its order, so the ORDER BY costs no sort and rows go out as they are read.
pub const READ_RANGES_SQL: &str = "SELECT pg_read_binary_file(f.p, f.o, f.l, true) \
    FROM unnest($1::text[], $2::int8[], $3::int8[]) WITH ORDINALITY AS f(p, o, l, n) ORDER BY f.n";

/// Facts about the server, read once per session.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// server_version_num, e.g. 150020.
    pub version_num: u32,
    /// data_directory as the server sees it; empty when the role may not read it (it needs
    /// pg_read_all_settings: the setting is GUC_SUPERUSER_ONLY, guc_tables.c, and
    /// pg_settings leaves out the rows a role may not see).
    pub data_directory: String,
    /// pg_control_system().system_identifier.
    pub system_identifier: u64,
    /// pg_control_system().catalog_version_no.
    pub catalog_version: u32,
    /// wal_segment_size, bytes.
    pub wal_segment_size: u64,
    /// block_size, bytes.
    pub block_size: u32,
    /// data_checksums is on.
    pub data_checksums: bool,
    /// pg_is_in_recovery().
    pub in_recovery: bool,
    /// pg_backend_pid(): the server process serving the session these facts were read on.
    pub backend_pid: u32,
}

impl ServerInfo {
    /// Major version as text: "15", "18".
    pub fn major(&self) -> String {
        (self.version_num / 10000).to_string()
    }
    /// The per-version directory inside tablespaces: `PG_<major>_<catalog version>`.
    pub fn tablespace_dir(&self) -> String {
        format!("PG_{}_{}", self.major(), self.catalog_version)
    }
}

/// The server's archiving settings: `archive_mode` and whether an archive_command or
/// archive_library is set. WAL is archived when the mode is not `off` and one is set
/// (`XLogArchivingActive` and the archiver's checks in src/backend/postmaster/pgarch.c).
/// Read by `crate::remote::control::Control::archiving`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archiving {
    /// `archive_mode`: off, on or always.
    pub mode: String,
    pub command: String,
    pub library: String,
}

impl Archiving {
    /// True when the server archives WAL (mode not off, and a command or library set).
    pub fn active(&self) -> bool {
        self.mode != "off" && (!self.command.is_empty() || !self.library.is_empty())
    }
}

/// What pg_backup_stop returned.
#[derive(Debug, Clone)]
pub struct BackupStop {
    pub lsn: Lsn,
    pub backup_label: String,
    pub tablespace_map: Option<String>,
}

/// One open session.
pub struct Session {
    /// The process's runtime ([`crate::io::runtime`]).
    rt: &'static tokio::runtime::Runtime,
    client: Client,
    /// The connection's task, awaited by [`Session::close`].
    conn: tokio::task::JoinHandle<()>,
    target: String,
    /// Sends PostgreSQL's cancel request for this session's query when the process is
    /// cancelled ([`crate::io::cancel`]): a pg_backup_start waiting on a checkpoint ends
    /// at once, and the error drops the session's temporary slot.
    _cancel: crate::io::cancel::Hook,
}

/// Connection settings from --pg-socket-path, --pg-port and --pg-user (a Unix socket,
/// database postgres; the password, if the role needs one, from PGPASSWORD or ~/.pgpass).
pub fn local_config(socket_dir: &Path, port: u16, user: &str) -> Result<ConnTarget> {
    let mut ci = ConnInfo::default();
    ci.params
        .insert("host".into(), socket_dir.display().to_string());
    ci.params.insert("port".into(), port.to_string());
    ci.params.insert("user".into(), user.to_string());
    ci.with_env_defaults(&env_var).resolve(&env_var, "pgjet")
}

/// Looks up an environment variable (for libpq defaults).
pub fn env_var(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// Parses a libpq connection string (key=value or URI), fills what it lacks from the
/// environment, the defaults and the password file, and sets up TLS (see
/// [`crate::pg::conninfo`]). Errors: [`Error::Config`] naming what is wrong.
pub fn parse_conninfo(s: &str) -> Result<ConnTarget> {
    ConnInfo::parse(s)
        .map_err(crate::pg::conninfo::source_error)?
        .with_env_defaults(&env_var)
        .resolve(&env_var, "pgjet")
}

impl Session {
    /// Opens a session (TLS as the target's sslmode says). Errors: [`Error::Connect`] when
    /// the server cannot be reached or refuses the role, password or certificate.
    pub fn connect(target: &ConnTarget) -> Result<Session> {
        let rt = crate::io::runtime::get()?;
        let (client, conn) = rt
            .block_on(open_client(target))
            .map_err(|source| Error::Connect {
                target: target.describe.clone(),
                source,
            })?;
        let cancel = cancel_hook(&client, target);
        let sess = Session {
            rt,
            client,
            conn,
            target: target.describe.clone(),
            _cancel: cancel,
        };
        // A backup session waits on checkpoints and then sits idle while files are copied:
        // server-side timeouts set for the role or database must not end it. Server-side
        // keepalives end it (and so the backup and the temporary slot) within about a
        // minute when pgjet's host vanishes or the link is cut; the default is two hours.
        sess.query_strings(
            "disable session timeouts",
            "SET statement_timeout = 0; SET lock_timeout = 0; \
             SET idle_in_transaction_session_timeout = 0; SET idle_session_timeout = 0; \
             SET tcp_keepalives_idle = 15; SET tcp_keepalives_interval = 5; \
             SET tcp_keepalives_count = 6",
        )?;
        Ok(sess)
    }

    /// Runs `f` on a session of its own to `target`, closed afterwards: for questions whose
    /// failure is an answer (may the WAL summaries be read?). An ERROR on the backup's own
    /// session would drop its temporary replication slot ("Temporary slots are also
    /// released upon any error", PostgreSQL's docs of pg_create_physical_replication_slot;
    /// `ReplicationSlotCleanup` in postgres.c's error recovery), and the backup would then
    /// fail on a slot no longer holding its WAL.
    ///
    /// Errors: the connection's ([`Error::Connect`]) and `f`'s.
    pub fn aside<T>(target: &ConnTarget, f: impl FnOnce(&Session) -> Result<T>) -> Result<T> {
        let sess = Session::connect(target)?;
        let out = f(&sess);
        sess.close();
        out
    }

    /// Where this session is connected, for messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Runs `sql` (simple protocol, several statements allowed) and returns every column of
    /// every row as text (NULL as None).
    pub fn query_strings(&self, what: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        let rows = self
            .rt
            .block_on(self.client.simple_query(sql))
            .map_err(|source| Error::Query {
                what: what.into(),
                source,
            })?;
        Ok(rows
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
                }
                _ => None,
            })
            .collect())
    }

    /// Reads ranges of data-directory files in one round trip: each (path relative to the
    /// data directory, offset, length) with `pg_read_binary_file` in binary form; None for
    /// a file that is gone. The role needs EXECUTE on
    /// `pg_read_binary_file(text, bigint, bigint, boolean)` (or superuser).
    pub fn read_file_ranges(&self, ranges: &[(String, u64, u64)]) -> Result<Vec<Option<Vec<u8>>>> {
        Ok(self
            .read_file_ranges_timed(ranges)?
            .into_iter()
            .map(|(v, _)| v)
            .collect())
    }

    /// [`Session::read_file_ranges`], with the instant each range arrived here. The
    /// statement goes with its parameters' types (no round trip to prepare it), and the rows
    /// are taken as they arrive, so the instants show the rate of the link after the first.
    pub fn read_file_ranges_timed(
        &self,
        ranges: &[(String, u64, u64)],
    ) -> Result<Vec<(Option<Vec<u8>>, std::time::Instant)>> {
        use futures::TryStreamExt;
        use tokio_postgres::types::{ToSql, Type};
        let what = || format!("read {} file range(s)", ranges.len());
        let err = |source| Error::Query {
            what: what(),
            source,
        };
        let paths: Vec<&str> = ranges.iter().map(|r| r.0.as_str()).collect();
        let offs: Vec<i64> = ranges.iter().map(|r| r.1 as i64).collect();
        let lens: Vec<i64> = ranges.iter().map(|r| r.2 as i64).collect();
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&paths, Type::TEXT_ARRAY),
            (&offs, Type::INT8_ARRAY),
            (&lens, Type::INT8_ARRAY),
        ];
        self.rt.block_on(async {
            let rows = self
                .client
                .query_typed_raw(READ_RANGES_SQL, params)
                .await
                .map_err(err)?;
            let mut rows = std::pin::pin!(rows);
            let mut out = Vec::with_capacity(ranges.len());
            while let Some(r) = rows.try_next().await.map_err(err)? {
                out.push((
                    r.try_get::<_, Option<Vec<u8>>>(0).map_err(err)?,
                    std::time::Instant::now(),
                ));
            }
            Ok(out)
        })
    }

    /// `rows` rows of `piece` bytes made by the server (`repeat`, which any role may run),
    /// with the instant each arrived here: the rate of the link to the server after the
    /// first row, for a role that may read no file.
    ///
    /// Errors: the query's.
    pub fn filler_rows_timed(
        &self,
        rows: u32,
        piece: u32,
    ) -> Result<Vec<(Option<Vec<u8>>, std::time::Instant)>> {
        use futures::TryStreamExt;
        use tokio_postgres::types::{ToSql, Type};
        let err = |source| Error::Query {
            what: format!("read {rows} rows of {piece} bytes to time the link"),
            source,
        };
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&(piece as i32), Type::INT4), (&(rows as i32), Type::INT4)];
        self.rt.block_on(async {
            let got = self
                .client
                .query_typed_raw(
                    "SELECT convert_to(repeat('x', $1), 'UTF8') FROM generate_series(1, $2)",
                    params,
                )
                .await
                .map_err(err)?;
            let mut got = std::pin::pin!(got);
            let mut out = Vec::with_capacity(rows as usize);
            while let Some(r) = got.try_next().await.map_err(err)? {
                out.push((
                    r.try_get::<_, Option<Vec<u8>>>(0).map_err(err)?,
                    std::time::Instant::now(),
                ));
            }
            Ok(out)
        })
    }

    /// Runs `sql` expecting exactly one row; returns its columns as text (NULL as None).
    pub fn query_row(&self, what: &str, sql: &str) -> Result<Vec<Option<String>>> {
        let mut rows = self.query_strings(what, sql)?;
        if rows.len() != 1 {
            return Err(Error::Other(format!(
                "{what}: expected one row, got {}",
                rows.len()
            )));
        }
        Ok(rows.remove(0))
    }

    /// Reads [`ServerInfo`] with what every role may read (a role with REPLICATION only
    /// included). Errors when the server is older than PostgreSQL 15.
    pub fn server_info(&self) -> Result<ServerInfo> {
        let r = self.query_row("read server settings", "SELECT current_setting('server_version_num'), \
            coalesce((SELECT setting FROM pg_settings WHERE name = 'data_directory'), ''), s.system_identifier, s.catalog_version_no, \
            (SELECT setting FROM pg_settings WHERE name = 'wal_segment_size'), current_setting('block_size'), \
            current_setting('data_checksums'), pg_is_in_recovery(), pg_backend_pid() FROM pg_control_system() s")?;
        let col = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
        let num = |i: usize| -> Result<u64> {
            col(i)
                .parse()
                .map_err(|_| Error::Other(format!("unexpected server setting '{}'", col(i))))
        };
        let info = ServerInfo {
            version_num: num(0)? as u32,
            data_directory: col(1),
            system_identifier: num(2)?,
            catalog_version: num(3)? as u32,
            wal_segment_size: num(4)?,
            block_size: num(5)? as u32,
            data_checksums: col(6) == "on",
            in_recovery: col(7) == "t",
            backend_pid: num(8)? as u32,
        };
        if info.version_num < MIN_VERSION_NUM {
            return Err(Error::Unsafe(format!(
                "PostgreSQL {} is not supported: pgjet needs 15 or later",
                info.version_num
            )));
        }
        if info.block_size != 8192 {
            return Err(Error::Unsafe(format!(
                "block_size {} is not supported: pgjet needs 8192",
                info.block_size
            )));
        }
        Ok(info)
    }

    /// Tablespaces other than pg_default and pg_global: (oid, name, location).
    pub fn tablespaces(&self) -> Result<Vec<(u32, String, String)>> {
        let rows = self.query_strings(
            "list tablespaces",
            "SELECT oid, spcname, pg_tablespace_location(oid) FROM pg_tablespace \
            WHERE spcname NOT IN ('pg_default', 'pg_global') ORDER BY oid",
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                Some((
                    r.first()?.as_ref()?.parse().ok()?,
                    r.get(1)?.clone()?,
                    r.get(2)?.clone()?,
                ))
            })
            .collect())
    }

    /// The databases and the transaction that wrote their pg_database row: (OID, xmin),
    /// sorted by OID. A database dropped and created again under the same OID (after the
    /// OID counter wrapped) has another xmin; so does one whose row was rewritten (ALTER
    /// DATABASE, GRANT), while VACUUM's in-place update of datfrozenxid keeps it
    /// (PostgreSQL src/backend/commands/vacuum.c, `vac_update_datfrozenxid`).
    pub fn databases(&self) -> Result<Vec<(u32, u32)>> {
        let rows = self.query_strings(
            "list databases",
            "SELECT oid::text, xmin::text FROM pg_database ORDER BY oid",
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                Some((
                    r.first()?.as_ref()?.parse().ok()?,
                    r.get(1)?.as_ref()?.parse().ok()?,
                ))
            })
            .collect())
    }

    /// Creates a physical replication slot that reserves WAL at once. A temporary slot lives
    /// as long as this session. Returns the slot's restart LSN.
    pub fn create_physical_slot(&self, name: &str, temporary: bool) -> Result<Lsn> {
        let r = self.query_row(
            "create replication slot",
            &format!(
                "SELECT lsn FROM pg_create_physical_replication_slot({}, true, {temporary})",
                quote_literal(name)
            ),
        )?;
        parse_lsn(r.first().cloned().flatten())
    }

    /// Slot `name` as pg_replication_slots shows it (a view every role may read); None
    /// when there is no such slot.
    pub fn slot_state(&self, name: &str) -> Result<Option<SlotState>> {
        let rows = self.query_strings(
            "read slot state",
            &format!(
                "SELECT slot_type, active_pid, coalesce(wal_status, 'reserved'), restart_lsn \
                 FROM pg_replication_slots WHERE slot_name = {}",
                quote_literal(name)
            ),
        )?;
        let Some(r) = rows.into_iter().next() else {
            return Ok(None);
        };
        let col = |i: usize| r.get(i).cloned().flatten();
        Ok(Some(SlotState {
            physical: col(0).as_deref() == Some("physical"),
            active_pid: col(1).and_then(|p| p.parse().ok()),
            wal_status: col(2).unwrap_or_default(),
            restart_lsn: col(3).and_then(|l| l.parse().ok()),
        }))
    }

    /// Makes permanent slot `dst` as a copy of `src`, keeping its restart LSN
    /// (pg_copy_physical_replication_slot, PostgreSQL 12+).
    pub fn copy_slot_permanent(&self, src: &str, dst: &str) -> Result<()> {
        self.query_strings(
            "copy replication slot",
            &format!(
                "SELECT pg_copy_physical_replication_slot({}, {}, false)",
                quote_literal(src),
                quote_literal(dst)
            ),
        )?;
        Ok(())
    }

    /// Drops a replication slot (used to undo a permanent slot when replica-create fails).
    pub fn drop_slot(&self, name: &str) -> Result<()> {
        self.query_strings(
            "drop replication slot",
            &format!("SELECT pg_drop_replication_slot({})", quote_literal(name)),
        )?;
        Ok(())
    }

    /// pg_backup_start(label, fast): returns the backup start LSN (the checkpoint's redo).
    pub fn backup_start(&self, label: &str, fast: bool) -> Result<Lsn> {
        let r = self.query_row(
            "pg_backup_start",
            &format!("SELECT pg_backup_start({}, {fast})", quote_literal(label)),
        )?;
        parse_lsn(r.first().cloned().flatten())
    }

    /// pg_backup_stop(wait_for_archive => false): the backup holds its own WAL, so it does
    /// not wait for the archiver.
    pub fn backup_stop(&self) -> Result<BackupStop> {
        let r = self.query_row(
            "pg_backup_stop",
            "SELECT lsn, labelfile, spcmapfile FROM pg_backup_stop(false)",
        )?;
        let lsn = parse_lsn(r.first().cloned().flatten())?;
        let backup_label = r.get(1).cloned().flatten().unwrap_or_default();
        let tablespace_map = r.get(2).cloned().flatten().filter(|s| !s.is_empty());
        Ok(BackupStop {
            lsn,
            backup_label,
            tablespace_map,
        })
    }

    /// Waits (up to 60 s) until the server has flushed WAL up to `lsn`, so no byte past what
    /// it made durable is copied; on a standby, until it has replayed up to `lsn` (a
    /// standby replays only WAL it has flushed). Errors: still not there after 60 s.
    pub fn wait_wal_flushed(&self, lsn: Lsn) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let r = self.query_row(
                "read the WAL flush LSN",
                "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                 ELSE pg_current_wal_flush_lsn() END",
            )?;
            let flushed = parse_lsn(r.first().cloned().flatten())?;
            if flushed >= lsn {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::Unsafe(format!(
                    "the server has flushed WAL only to {flushed}, not to the backup's stop LSN {lsn}, after 60 s"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The archiver's statistics (pg_stat_archiver, readable by every role; PostgreSQL
    /// src/backend/utils/activity/pgstat_archiver.c).
    /// The server's clock, Unix seconds (`clock_timestamp()`): a data directory's file
    /// modification times are of that clock.
    ///
    /// Errors: the server's; no value, or one that does not parse.
    pub fn server_clock(&self) -> Result<i64> {
        let sql = "SELECT floor(extract(epoch FROM clock_timestamp()))::bigint::text";
        self.query_row("time", sql)?
            .first()
            .cloned()
            .flatten()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| Error::Other(format!("{sql} gave no time")))
    }

    pub fn archiver(&self) -> Result<ArchiverStats> {
        let r = self.query_row(
            "read pg_stat_archiver",
            "SELECT failed_count, coalesce(last_failed_wal, ''), \
             coalesce(last_failed_time::text, ''), coalesce(last_archived_wal, ''), \
             coalesce(last_failed_time > coalesce(last_archived_time, '-infinity'), false) \
             FROM pg_stat_archiver",
        )?;
        let col = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
        Ok(ArchiverStats {
            failed_count: col(0).parse().unwrap_or(0),
            last_failed_wal: col(1),
            last_failed_time: col(2),
            last_archived_wal: col(3),
            failing: col(4) == "t",
        })
    }

    /// Writes a restore point (`pg_create_restore_point(name)`) and returns its LSN.
    pub fn create_restore_point(&self, name: &str) -> Result<Lsn> {
        let r = self.query_row(
            "pg_create_restore_point",
            &format!("SELECT pg_create_restore_point({})", quote_literal(name)),
        )?;
        parse_lsn(r.first().cloned().flatten())
    }

    /// Forces a switch to a new WAL segment (`pg_switch_wal()`) and returns the name of the
    /// segment it completed (`pg_walfile_name` of the returned LSN, which names the segment
    /// holding the byte before it). Write a record first (a restore point): with nothing
    /// written since the last switch there is nothing to complete.
    pub fn switch_wal(&self) -> Result<String> {
        let r = self.query_row("pg_switch_wal", "SELECT pg_walfile_name(pg_switch_wal())")?;
        r.first()
            .cloned()
            .flatten()
            .ok_or_else(|| Error::Other("pg_switch_wal returned no segment".into()))
    }

    /// Closes the session cleanly: the client goes, and the connection's task is given up
    /// to 2 s to say goodbye to the server (which then ends the backend, and with it a
    /// temporary slot).
    pub fn close(self) {
        drop(self.client);
        let conn = self.conn;
        // The timer is made inside the runtime (a tokio timer needs one to exist).
        let _ = self.rt.block_on(async move {
            tokio::time::timeout(std::time::Duration::from_secs(2), conn).await
        });
    }
}

/// A hook that sends PostgreSQL's cancel request for `client`'s query (over TLS when
/// `target` uses it) when the process is cancelled ([`crate::io::cancel`]), until dropped.
pub fn cancel_hook(client: &Client, target: &ConnTarget) -> crate::io::cancel::Hook {
    let token = client.cancel_token();
    let tls = target.tls.clone();
    crate::io::cancel::on_cancel(crate::io::cancel::Stage::Interrupt, move || {
        let (token, tls) = (token.clone(), tls.clone());
        let sent = crate::io::runtime::block_on(async move {
            let wait = std::time::Duration::from_secs(2);
            match tls {
                Some(cfg) => {
                    let tls = tokio_postgres_rustls::MakeRustlsConnect::new((*cfg).clone());
                    tokio::time::timeout(wait, token.cancel_query(tls)).await
                }
                None => tokio::time::timeout(wait, token.cancel_query(NoTls)).await,
            }
        });
        if !matches!(sent, Ok(Ok(Ok(())))) {
            tracing::debug!("the cancel request for a session could not be sent");
        }
    })
}

/// Connects with TLS when the target may use it (rustls), else in plain text. The
/// connection's task runs on the current runtime; its handle ends when the connection does
/// (the client dropped, or the server gone).
pub async fn open_client(
    target: &ConnTarget,
) -> std::result::Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    match &target.tls {
        Some(cfg) => {
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new((**cfg).clone());
            let (client, conn) = target.config.connect(tls).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("PostgreSQL connection closed: {e}");
                }
            });
            Ok((client, task))
        }
        None => {
            let (client, conn) = target.config.connect(NoTls).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("PostgreSQL connection closed: {e}");
                }
            });
            Ok((client, task))
        }
    }
}

/// What pg_stat_archiver says of the archiver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchiverStats {
    /// Failed archive_command runs since the statistics were reset.
    pub failed_count: u64,
    /// The WAL file of the last failure, and when (empty: none).
    pub last_failed_wal: String,
    pub last_failed_time: String,
    /// The last WAL file archived (empty: none).
    pub last_archived_wal: String,
    /// The last failure is newer than the last success: the archiver is failing now.
    pub failing: bool,
}

/// One replication slot's state (pg_replication_slots; PostgreSQL
/// src/backend/catalog/system_views.sql).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// `slot_type` is `physical` (else logical).
    pub physical: bool,
    /// The PID of the process using it (a walsender), None when inactive.
    pub active_pid: Option<i32>,
    /// reserved, extended, unreserved or lost.
    pub wal_status: String,
    /// The oldest WAL it holds; None once invalidated.
    pub restart_lsn: Option<Lsn>,
}

fn parse_lsn(s: Option<String>) -> Result<Lsn> {
    let s = s.unwrap_or_default();
    s.parse()
        .map_err(|_| Error::Other(format!("server returned an invalid LSN '{s}'")))
}

/// Quotes `s` as an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Quotes `s` as a value in postgresql.conf / postgresql.auto.conf, whose parser treats a
/// backslash as an escape inside quotes (src/backend/utils/misc/guc-file.l): both `'` and
/// `\` are doubled, as pg_basebackup does for primary_conninfo.
pub fn quote_conf_value(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_conf_value("password=a\\b'c"), "'password=a\\\\b''c'");
    }
}
