//! The rights a role needs on a primary so that pgjet can back it up or clone it over libpq,
//! and the statement that grants each one. A superuser has them all. Sources: PostgreSQL's
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

/// Functions pgjet calls that are revoked from PUBLIC: (signature, what it is for).
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

/// Checks the rights of the session's role. Returns what is missing (empty when all is
/// there). Errors: the catalog queries fail.
pub fn check(sess: &Session) -> Result<Vec<Missing>> {
    let r = sess.query_row(
        "read the role's attributes",
        "SELECT rolsuper, rolreplication, quote_ident(rolname), \
         pg_has_role(current_user, 'pg_read_all_settings', 'USAGE') \
         FROM pg_roles WHERE rolname = current_user",
    )?;
    let flag = |i: usize| r.get(i).cloned().flatten().as_deref() == Some("t");
    if flag(0) {
        return Ok(Vec::new());
    }
    let role = r.get(2).cloned().flatten().unwrap_or_default();
    let mut missing = Vec::new();
    if !flag(1) {
        missing.push(Missing {
            what: "REPLICATION (replication slots, and the standby's WAL stream)".into(),
            fix: format!("ALTER ROLE {role} REPLICATION;"),
        });
    }
    if !flag(3) {
        missing.push(Missing {
            what: "pg_read_all_settings (read data_directory and the server's settings)".into(),
            fix: format!("GRANT pg_read_all_settings TO {role};"),
        });
    }
    for (sig, what) in FUNCTIONS {
        if !may_execute(sess, sig)? {
            missing.push(Missing {
                what: format!("EXECUTE on {sig} ({what})"),
                fix: format!("GRANT EXECUTE ON FUNCTION {sig} TO {role};"),
            });
        }
    }
    Ok(missing)
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
    let mut s = format!("ALTER ROLE {role} REPLICATION;\nGRANT pg_read_all_settings TO {role};\n");
    for (sig, _) in FUNCTIONS {
        s.push_str(&format!("GRANT EXECUTE ON FUNCTION {sig} TO {role};\n"));
    }
    s
}
