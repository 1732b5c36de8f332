//! What the `BASE_BACKUP` transport needs of the primary, for `check --source`: PostgreSQL
//! 15+, the role's REPLICATION attribute, a free WAL sender and wal_level, a replication
//! connection pg_hba.conf accepts from this host, and the server's compression methods;
//! each missing one with the statement or line that fixes it.
use crate::error::{role_ident, Error, Result};
use crate::pg::conninfo::ConnTarget;
use crate::pg::session::{ServerInfo, Session};
use crate::remote::replication::ReplConn;

/// One prerequisite: what was checked, whether it holds, and the fix when it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub what: String,
    pub ok: bool,
    pub fix: Option<String>,
}

fn ok(what: String) -> Need {
    Need {
        what,
        ok: true,
        fix: None,
    }
}

fn missing(what: String, fix: String) -> Need {
    Need {
        what,
        ok: false,
        fix: Some(fix),
    }
}

/// Checks what the stream needs on the primary behind `sess` (facts `info`), reached at
/// `target`. Errors: the session's queries (a refused replication connection is a missing
/// need, not an error).
pub fn stream_needs(sess: &Session, info: &ServerInfo, target: &ConnTarget) -> Result<Vec<Need>> {
    let mut needs = Vec::new();
    if info.version_num < 150000 {
        needs.push(missing(
            format!(
                "PostgreSQL {} (BASE_BACKUP with server-side compression needs 15 or later)",
                info.major()
            ),
            "use --transport libpq".into(),
        ));
        return Ok(needs);
    }
    let r = sess.query_row(
        "read the role, its REPLICATION attribute and the client's address",
        "SELECT current_user, (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), \
         inet_client_addr(), coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false), \
         current_setting('max_wal_senders')::int, \
         (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'), \
         current_setting('wal_level')",
    )?;
    let col = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
    let (user, addr, ssl) = (col(0), col(2), col(3) == "t");
    let role = role_ident(&user);
    needs.push(if col(1) == "t" {
        ok(format!(
            "role {user} may start replication (REPLICATION or superuser)"
        ))
    } else {
        missing(
            format!("role {user} lacks the REPLICATION attribute"),
            format!("ALTER ROLE {role} REPLICATION;"),
        )
    });
    let (max, used): (i64, i64) = (col(4).parse().unwrap_or(0), col(5).parse().unwrap_or(0));
    let free = max - used;
    needs.push(if free >= 2 {
        ok(format!("{free} of max_wal_senders = {max} free (the stream takes one, a standby one more)"))
    } else {
        missing(
            format!("{free} of max_wal_senders = {max} free (the stream takes one, a standby made by replica-create one more)"),
            format!("ALTER SYSTEM SET max_wal_senders = {}; then restart the primary", max + 2 - free.min(2)),
        )
    });
    let level = col(6);
    needs.push(if level == "replica" || level == "logical" {
        ok(format!("wal_level = {level}"))
    } else {
        missing(
            format!("wal_level = {level}"),
            "ALTER SYSTEM SET wal_level = replica; then restart the primary".into(),
        )
    });
    needs.push(match ReplConn::connect(target).and_then(|mut c| {
        let r = c.identify_system();
        c.close();
        r
    }) {
        Ok((sysid, _, _)) if sysid == info.system_identifier => {
            ok("a replication connection is accepted from this host".into())
        }
        Ok((sysid, _, _)) => missing(
            format!("the replication connection reached another cluster ({sysid})"),
            "check --source: both connections must reach the same primary".into(),
        ),
        Err(Error::Replication { error, .. }) if error.message.contains("pg_hba.conf") => {
            let line = if addr.is_empty() {
                format!("local replication {user} peer")
            } else {
                let (kind, bits) = (if ssl { "hostssl" } else { "host" }, if addr.contains(':') { 128 } else { 32 });
                let host = addr.split('/').next().unwrap_or(&addr);
                format!("{kind} replication {user} {host}/{bits} scram-sha-256")
            };
            missing(
                format!("pg_hba.conf has no line for replication connections of {user} from this host"),
                format!("add `{line}` to pg_hba.conf (the `all` database does not match replication connections), then SELECT pg_reload_conf();"),
            )
        }
        Err(e) => missing(
            format!("the replication connection failed: {e}"),
            e.hint().trim_start_matches("HINT: ").to_string(),
        ),
    });
    needs.push(match super::stream_sequence::server_codecs(sess) {
        Some(v) => {
            let has = |c| if v.contains(&c) { "yes" } else { "no" };
            ok(format!(
                "compression on the server: zstd {}, lz4 {}, gzip yes; --network-compress auto uses {}",
                has(crate::remote::basebackup::WireCodec::Zstd),
                has(crate::remote::basebackup::WireCodec::Lz4),
                v[0].name()
            ))
        }
        None => Need {
            what: "compression on the server: unknown (wal_compression's values could not be read from pg_settings); the stream tries zstd, lz4, then gzip".into(),
            ok: true,
            fix: None,
        },
    });
    Ok(needs)
}
