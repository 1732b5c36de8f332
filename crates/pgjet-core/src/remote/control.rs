//! The connection that asks the primary its facts and holds the copy's slots while the
//! `BASE_BACKUP` stream runs: the SQL session, or, for a role that pg_hba.conf lets in only
//! for replication (Patroni's `replicator`, CloudNativePG's `streaming_replica` under a
//! `host replication ...` line alone), a replication connection that answers the same
//! questions with replication commands, as pg_basebackup does:
//!
//! | question | SQL session | replication connection (walsender.c, repl_gram.y) |
//! |---|---|---|
//! | system identifier | `pg_control_system()` | `IDENTIFY_SYSTEM` |
//! | settings | `current_setting`, `pg_settings` | `SHOW name` |
//! | in recovery | `pg_is_in_recovery()` | `SHOW in_hot_standby` (14+) |
//! | slots | `pg_create_physical_replication_slot`, `pg_replication_slots` | `CREATE_REPLICATION_SLOT`, `READ_REPLICATION_SLOT` (15+), `DROP_REPLICATION_SLOT` |
//!
//! What the replication connection cannot tell: whether a walsender uses a slot
//! (`READ_REPLICATION_SLOT` gives its type, restart LSN and timeline only), the catalog
//! version, the data directory, the tablespaces before the stream (its header lists them),
//! and the link's speed (the probe reads rows over SQL). The callers say so in the log.
use crate::error::{Error, Result};
use crate::pg::conninfo::ConnTarget;
use crate::pg::lsn::Lsn;
use crate::pg::session::{Archiving, ServerInfo, Session, SlotState, MIN_VERSION_NUM};
use crate::remote::replication::ReplConn;
use std::sync::Mutex;

/// The questions the stream path asks the primary, on either connection (see the module's
/// table). Slots made temporary live as long as this connection.
pub trait Control {
    /// The SQL session, when this is one (the probe, the rights and the file transports
    /// need it).
    fn session(&self) -> Option<&Session>;
    /// The SQL session itself, when this is one; a replication connection is closed.
    fn into_session(self: Box<Self>) -> Option<Session>;
    /// The value of setting `name` as `SHOW` prints it (with its unit: `16MB`, `5min`);
    /// None when the server has no such setting or the role may not read it.
    /// Errors: the connection's.
    fn show(&self, name: &str) -> Result<Option<String>>;
    /// Makes physical slot `name` reserving WAL from now; a temporary one is dropped when
    /// this connection ends, an error on it included. Errors: the server's (a slot of that
    /// name exists, no free slot: max_replication_slots).
    fn create_slot(&self, name: &str, temporary: bool) -> Result<()>;
    /// Slot `name`; None when there is none. Over replication `active_pid` is always None
    /// (not known) and `wal_status` is `lost` once the slot has no restart LSN.
    fn slot_state(&self, name: &str) -> Result<Option<SlotState>>;
    /// Drops slot `name`. Errors: the server's (it is in use, it does not exist).
    fn drop_slot(&self, name: &str) -> Result<()>;
    /// Ends the connection (and with it the temporary slots made on it).
    fn close(self: Box<Self>);
    /// The cluster's timeline now: the latest checkpoint's over SQL
    /// (`pg_control_checkpoint()`), `IDENTIFY_SYSTEM`'s over replication (the timeline WAL is
    /// written on: the same but for the moment between a promotion and its checkpoint).
    /// Errors: the server's.
    fn timeline(&self) -> Result<u32>;

    /// The server's archiving settings (archive_mode, archive_command and, PostgreSQL 15+,
    /// archive_library: every role may read them, guc_tables.c marks none superuser-only).
    /// Errors: the connection's.
    fn archiving(&self) -> Result<Archiving> {
        Ok(Archiving {
            mode: self.show("archive_mode")?.unwrap_or_default(),
            command: self.show("archive_command")?.unwrap_or_default(),
            library: self.show("archive_library")?.unwrap_or_default(),
        })
    }

    /// Fails when slot `name` no longer protects its WAL (the copy's WAL may be gone).
    fn check_slot_holds(&self, name: &str) -> Result<()> {
        match self.slot_state(name)? {
            Some(st) if matches!(st.wal_status.as_str(), "reserved" | "extended") => Ok(()),
            other => Err(Error::Unsafe(format!(
                "replication slot {name} no longer protects the copy's WAL (wal_status {}); check max_slot_wal_keep_size",
                other.map(|s| s.wal_status).unwrap_or_else(|| "missing".into())
            ))),
        }
    }
}

impl Control for Session {
    fn session(&self) -> Option<&Session> {
        Some(self)
    }
    fn into_session(self: Box<Self>) -> Option<Session> {
        Some(*self)
    }
    fn show(&self, name: &str) -> Result<Option<String>> {
        let r = self.query_row(
            "read a setting",
            &format!(
                "SELECT current_setting({}, true)",
                crate::pg::session::quote_literal(name)
            ),
        )?;
        Ok(r.into_iter().next().flatten())
    }
    fn create_slot(&self, name: &str, temporary: bool) -> Result<()> {
        self.create_physical_slot(name, temporary).map(|_| ())
    }
    fn slot_state(&self, name: &str) -> Result<Option<SlotState>> {
        Session::slot_state(self, name)
    }
    fn drop_slot(&self, name: &str) -> Result<()> {
        Session::drop_slot(self, name)
    }
    fn close(self: Box<Self>) {
        Session::close(*self)
    }
    fn timeline(&self) -> Result<u32> {
        let r = self.query_row(
            "read the checkpoint's timeline",
            "SELECT timeline_id::text FROM pg_control_checkpoint()",
        )?;
        r.first()
            .cloned()
            .flatten()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| Error::Other("pg_control_checkpoint() gave no timeline".into()))
    }
}

/// The replication connection in the SQL session's place (see the module's documentation).
pub struct ReplControl {
    conn: Mutex<ReplConn>,
}

impl ReplControl {
    fn with<T>(&self, f: impl FnOnce(&mut ReplConn) -> Result<T>) -> Result<T> {
        let mut c = self
            .conn
            .lock()
            .map_err(|_| Error::Other("the replication connection's lock was poisoned".into()))?;
        f(&mut c)
    }
}

/// A slot's name as an identifier in a replication command (repl_scanner.l: a quoted
/// identifier, `""` for a quote).
pub(super) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The physical slot commands of the replication protocol (walsender.c), on a replication
/// connection of its own: [`ReplControl`] and `archive-stream` both use them.
impl ReplConn {
    /// `CREATE_REPLICATION_SLOT name [TEMPORARY] PHYSICAL RESERVE_WAL`: the server keeps
    /// WAL from its current position on.
    ///
    /// Errors: the server's refusal (the slot exists, `max_replication_slots` reached).
    pub fn create_physical_slot(&mut self, name: &str, temporary: bool) -> Result<()> {
        let cmd = format!(
            "CREATE_REPLICATION_SLOT {}{} PHYSICAL RESERVE_WAL",
            ident(name),
            if temporary { " TEMPORARY" } else { "" }
        );
        self.simple_query(&cmd).map(|_| ())
    }

    /// `READ_REPLICATION_SLOT name` (PostgreSQL 15+, walsender.c ReadReplicationSlot: one
    /// row of slot_type, restart_lsn, restart_tli, all NULL when there is no such slot):
    /// None for no slot, else its type (`physical`, `logical`) and restart LSN (None when
    /// it holds no WAL).
    ///
    /// Errors: the server's refusal (a server before 15).
    pub fn read_slot(&mut self, name: &str) -> Result<Option<(String, Option<Lsn>)>> {
        let rows = self.simple_query(&format!("READ_REPLICATION_SLOT {}", ident(name)))?;
        let r = rows.into_iter().next().unwrap_or_default();
        let col = |i: usize| r.get(i).cloned().flatten();
        Ok(col(0).map(|kind| (kind, col(1).and_then(|l| l.parse().ok()))))
    }

    /// `DROP_REPLICATION_SLOT name`.
    ///
    /// Errors: the server's refusal (no such slot, in use).
    pub fn drop_slot(&mut self, name: &str) -> Result<()> {
        self.simple_query(&format!("DROP_REPLICATION_SLOT {}", ident(name)))
            .map(|_| ())
    }
}

impl Control for ReplControl {
    fn session(&self) -> Option<&Session> {
        None
    }
    fn into_session(self: Box<Self>) -> Option<Session> {
        self.close();
        None
    }
    fn show(&self, name: &str) -> Result<Option<String>> {
        self.with(|c| c.show(name))
    }
    fn create_slot(&self, name: &str, temporary: bool) -> Result<()> {
        self.with(|c| c.create_physical_slot(name, temporary))
    }
    fn slot_state(&self, name: &str) -> Result<Option<SlotState>> {
        let Some((kind, restart_lsn)) = self.with(|c| c.read_slot(name))? else {
            return Ok(None);
        };
        Ok(Some(SlotState {
            physical: kind == "physical",
            active_pid: None,
            wal_status: if restart_lsn.is_some() {
                "reserved".into()
            } else {
                "lost".into()
            },
            restart_lsn,
        }))
    }
    fn drop_slot(&self, name: &str) -> Result<()> {
        self.with(|c| c.drop_slot(name))
    }
    fn close(self: Box<Self>) {
        if let Ok(c) = self.conn.into_inner() {
            c.close();
        }
    }
    fn timeline(&self) -> Result<u32> {
        let (_, tli, _) = self.with(|c| c.identify_system())?;
        Ok(tli)
    }
}

/// Whether `e` is the server refusing an ordinary session for want of a pg_hba.conf line
/// (SQLSTATE 28000, `no pg_hba.conf entry for host ..., database ...`: auth.c), the case a
/// replication connection may still be let in.
pub fn refused_by_pg_hba(e: &Error) -> bool {
    match e {
        Error::Connect { source, .. } => source.as_db_error().is_some_and(|d| {
            d.code().code() == "28000" && d.message().contains("no pg_hba.conf entry")
        }),
        _ => false,
    }
}

/// Connects to the primary at `target`: the SQL session, or with `replication_only` allowed
/// and the session refused by pg_hba.conf ([`refused_by_pg_hba`]), a replication connection
/// in its place ([`repl_server_info`]). Returns the connection and the server's facts.
///
/// Errors: the session's refusal (also when the replication connection is refused too: the
/// first error names the fix that lets both in), the facts' queries, a server older than 15.
pub fn connect_control(
    target: &ConnTarget,
    replication_only: bool,
) -> Result<(Box<dyn Control>, ServerInfo)> {
    let refused = match Session::connect(target) {
        Ok(sess) => {
            let info = match sess.server_info() {
                Ok(i) => i,
                Err(e) => {
                    sess.close();
                    return Err(e);
                }
            };
            return Ok((Box::new(sess), info));
        }
        Err(e) if replication_only && refused_by_pg_hba(&e) => e,
        Err(e) => return Err(e),
    };
    let mut conn = match ReplConn::connect(target) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(
                "the replication connection in the refused session's place failed too: {}",
                e.with_causes()
            );
            return Err(refused);
        }
    };
    let info = match repl_server_info(&mut conn) {
        Ok(i) => i,
        Err(e) => {
            conn.close();
            return Err(e);
        }
    };
    tracing::info!(
        "pg_hba.conf lets {} in for replication only: the server's facts and the copy's slots come from a replication connection (IDENTIFY_SYSTEM, SHOW, READ_REPLICATION_SLOT), as pg_basebackup's do",
        target.describe
    );
    Ok((
        Box::new(ReplControl {
            conn: Mutex::new(conn),
        }),
        info,
    ))
}

/// [`ServerInfo`] over a replication connection: `IDENTIFY_SYSTEM` and `SHOW`, which need
/// only REPLICATION. The catalog version (0) and the data directory (empty) are not known
/// there, nor the backend's PID (0: no file of the server is read on this host).
///
/// Errors: the commands', a server older than 15, a block size other than 8192.
pub fn repl_server_info(conn: &mut ReplConn) -> Result<ServerInfo> {
    let (system_identifier, _, _) = conn.identify_system()?;
    let mut show = |name: &str| -> Result<String> {
        conn.show(name)?
            .ok_or_else(|| conn.protocol(format!("SHOW {name} returned nothing")))
    };
    let number = |name: &str, v: &str| -> Result<u64> {
        v.trim()
            .parse()
            .map_err(|_| Error::Other(format!("unexpected value of {name}: '{v}'")))
    };
    let version = show("server_version_num")?;
    let version_num = number("server_version_num", &version)? as u32;
    if version_num < MIN_VERSION_NUM {
        return Err(Error::Unsafe(format!(
            "PostgreSQL {version_num} is not supported: pgjet needs 15 or later"
        )));
    }
    let seg = show("wal_segment_size")?;
    let wal_segment_size = with_unit(&seg)
        .ok_or_else(|| Error::Other(format!("unexpected value of wal_segment_size: '{seg}'")))?;
    let block = show("block_size")?;
    let block_size = number("block_size", &block)? as u32;
    if block_size != 8192 {
        return Err(Error::Unsafe(format!(
            "block_size {block_size} is not supported: pgjet needs 8192"
        )));
    }
    let data_checksums = show("data_checksums")? == "on";
    let in_recovery = show("in_hot_standby")? == "on";
    Ok(ServerInfo {
        version_num,
        data_directory: String::new(),
        system_identifier,
        catalog_version: 0,
        wal_segment_size,
        block_size,
        data_checksums,
        in_recovery,
        backend_pid: 0,
    })
}

/// Bytes from a size as `SHOW` prints it: a number and a unit of `B`, `kB`, `MB`, `GB`,
/// `TB` (guc.c, memory units, powers of 1024), or a bare number of bytes.
fn with_unit(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: u64 = v[..digits].parse().ok()?;
    let mult = match v[digits..].trim() {
        "" | "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_show_prints_them() {
        assert_eq!(with_unit("16MB"), Some(16 << 20));
        assert_eq!(with_unit("1GB"), Some(1 << 30));
        assert_eq!(with_unit("8192"), Some(8192));
        assert_eq!(with_unit("64kB"), Some(64 << 10));
        assert_eq!(with_unit("16 MB"), Some(16 << 20));
        assert_eq!(with_unit("5min"), None);
        assert_eq!(with_unit(""), None);
    }

    #[test]
    fn slot_names_are_quoted_identifiers() {
        assert_eq!(ident("pgjet_12"), "\"pgjet_12\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    }
}
