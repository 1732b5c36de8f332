//! The rights a role needs on a primary so that pgjet can back it up or clone it, per
//! transport, and the statement that grants each one. A superuser has them all. Sources: PostgreSQL's
//! src/backend/catalog/system_functions.sql (which functions are revoked from PUBLIC) and
//! the documentation of each function and of pg_read_all_settings.
use crate::error::Result;
use crate::pg::session::Session;

/// A right the role lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// What it is needed for.
    pub what: String,
    /// The statement (run by a superuser on the primary) that grants it.
    pub fix: String,
}

/// Functions pgjet calls that are revoked from PUBLIC: (signature, what it is for). The first
/// two are the low-level backup API the file transports (local, libpq) run; all five are
/// what the libpq transport runs. The stream (`--transport basebackup`) calls none of them:
/// the server runs its own backup for a role with REPLICATION, as for pg_basebackup.
pub const FUNCTIONS: &[(&str, &str)] = &[
    ("pg_backup_start(text, boolean)", "start the base backup"),
    ("pg_backup_stop(boolean)", "stop the base backup"),
    (
        "pg_read_binary_file(text, bigint, bigint, boolean)",
        "read the cluster's files over libpq",
    ),
    (
        "pg_ls_dir(text, boolean, boolean)",
        "list the data directory over libpq",
    ),
    ("pg_stat_file(text, boolean)", "read file sizes over libpq"),
];

/// How many of [`FUNCTIONS`] the local transport calls (the backup API).
const LOCAL_FUNCTIONS: usize = 2;

/// How a cluster is copied, as far as the role's rights go: the server's `BASE_BACKUP`
/// stream, this host's files under the backup API, or file ranges over SQL connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copying {
    Stream,
    LocalFiles,
    Ranges,
}

/// What the session's role may do, read once ([`rights`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    /// The role's name, quoted as an SQL identifier when needed.
    pub role: String,
    pub superuser: bool,
    /// The REPLICATION attribute (or superuser): replication slots, the `BASE_BACKUP`
    /// stream, the standby's WAL stream.
    pub replication: bool,
    /// Signatures from [`FUNCTIONS`] the role may not run.
    pub lacking: Vec<&'static str>,
}

impl Rights {
    /// What copying as `how` needs that the role lacks, each with its GRANT: the stream
    /// needs REPLICATION only; this host's files add the backup API; ranges add the file
    /// functions.
    pub fn missing_for(&self, how: Copying) -> Vec<Missing> {
        let mut out = Vec::new();
        if !self.replication {
            out.push(Missing {
                what: "REPLICATION (replication slots, the BASE_BACKUP stream, the standby's WAL stream)".into(),
                fix: format!("ALTER ROLE {} REPLICATION;", self.role),
            });
        }
        let calls = match how {
            Copying::Stream => 0,
            Copying::LocalFiles => LOCAL_FUNCTIONS,
            Copying::Ranges => FUNCTIONS.len(),
        };
        for (sig, what) in &FUNCTIONS[..calls] {
            if self.lacking.contains(sig) {
                out.push(Missing {
                    what: format!("EXECUTE on {sig} ({what})"),
                    fix: format!("GRANT EXECUTE ON FUNCTION {sig} TO {};", self.role),
                });
            }
        }
        out
    }

    /// True when the role may copy as `how`.
    pub fn may(&self, how: Copying) -> bool {
        self.missing_for(how).is_empty()
    }
}

/// The query behind [`rights`]: one row, the role's attributes and the signatures of
/// [`FUNCTIONS`] it may not run, joined by `;`.
pub fn rights_sql() -> String {
    let sigs: Vec<String> = FUNCTIONS
        .iter()
        .map(|(sig, _)| crate::pg::session::quote_literal(sig))
        .collect();
    format!(
        "SELECT rolsuper, rolsuper OR rolreplication, quote_ident(rolname), \
         array_to_string(ARRAY(SELECT f FROM unnest(ARRAY[{}]) f \
         WHERE NOT has_function_privilege(current_user, f, 'EXECUTE')), ';') \
         FROM pg_roles WHERE rolname = current_user",
        sigs.join(", ")
    )
}

/// [`Rights`] from the columns of [`rights_sql`]'s row.
pub fn rights_from(row: &[Option<String>]) -> Rights {
    let col = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let lacking_text = col(3);
    Rights {
        role: col(2),
        superuser: col(0) == "t",
        replication: col(1) == "t",
        lacking: FUNCTIONS
            .iter()
            .map(|(sig, _)| *sig)
            .filter(|sig| lacking_text.split(';').any(|l| l == *sig))
            .collect(),
    }
}

/// Reads the session's role's [`Rights`] (one round trip; every role may read pg_roles and
/// run has_function_privilege). Errors: the query fails.
pub fn rights(sess: &Session) -> Result<Rights> {
    Ok(rights_from(&sess.query_row(
        "read the role's attributes and rights",
        &rights_sql(),
    )?))
}

/// Whether the session's role may run the function of signature `sig`
/// (`has_function_privilege`). Errors: the query fails.
fn may_execute(sess: &Session, sig: &str) -> Result<bool> {
    let row = sess.query_row(
        "check a function privilege",
        &format!(
            "SELECT has_function_privilege(current_user, {}, 'EXECUTE')",
            crate::pg::session::quote_literal(sig)
        ),
    )?;
    Ok(row.first().cloned().flatten().as_deref() == Some("t"))
}

/// The WAL summary functions (PostgreSQL 17+) an incremental backup and `replica-create
/// --delta` call. PUBLIC may run them unless a DBA revoked that (system_functions.sql
/// revokes none of them); without them pgjet finds changed blocks the slower way.
pub const SUMMARY_FUNCTIONS: &[&str] = &[
    "pg_get_wal_summarizer_state()",
    "pg_available_wal_summaries()",
    "pg_wal_summary_contents(bigint, pg_lsn, pg_lsn)",
];

/// What `check` says about WAL summaries on a server of `version_num` (PostgreSQL 17+; none
/// before): whether `summarize_wal` is on, and each summary function the session's role may
/// not run, with the statement that fixes it. Notes, not failures: pgjet works without
/// them, reading more.
///
/// Errors: the catalog queries fail.
pub fn summary_notes(sess: &Session, version_num: u32) -> Result<Vec<String>> {
    if crate::pg::walsummary::unavailable(version_num).is_some() {
        return Ok(Vec::new());
    }
    let r = sess.query_row(
        "read summarize_wal",
        "SELECT current_setting('summarize_wal'), quote_ident(current_user)",
    )?;
    let role = r.get(1).cloned().flatten().unwrap_or_default();
    let mut notes = Vec::new();
    if r.first().cloned().flatten().as_deref() != Some("on") {
        notes.push(
            "note: summarize_wal is off: incremental backups find changed blocks in the WAL or by page LSN, and replica-create --delta compares by hash -- fix: ALTER SYSTEM SET summarize_wal = on; SELECT pg_reload_conf();".to_string(),
        );
    }
    for sig in SUMMARY_FUNCTIONS {
        if !may_execute(sess, sig)? {
            notes.push(format!(
                "note: the role may not run {sig}: WAL summaries are not used -- fix: GRANT EXECUTE ON FUNCTION {sig} TO {role};"
            ));
        }
    }
    if notes.is_empty() {
        notes.push(
            "WAL summaries: summarize_wal is on and the role may read them (incremental backups and --delta read only the changed blocks)".into(),
        );
    }
    Ok(notes)
}

/// The statements that give role `role` (an SQL identifier, quoted if needed) every right
/// pgjet needs, for the README and `check`.
pub fn grant_script(role: &str) -> String {
    let mut s = format!("ALTER ROLE {role} REPLICATION;\n");
    for (sig, _) in FUNCTIONS {
        s.push_str(&format!("GRANT EXECUTE ON FUNCTION {sig} TO {role};\n"));
    }
    s
}
