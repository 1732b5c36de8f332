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
        let row = sess.query_row(
            "check a function privilege",
            &format!(
                "SELECT has_function_privilege(current_user, {}, 'EXECUTE')",
                crate::pg::session::quote_literal(sig)
            ),
        )?;
        if row.first().cloned().flatten().as_deref() != Some("t") {
            missing.push(Missing {
                what: format!("EXECUTE on {sig} ({what})"),
                fix: format!("GRANT EXECUTE ON FUNCTION {sig} TO {role};"),
            });
        }
    }
    Ok(missing)
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
