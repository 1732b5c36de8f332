//! `check`: configuration, cluster and repository agree, and the role has what it needs.
use crate::error::{Error, Result};
use crate::options::{Settings, Transport};
use crate::pg::privileges::Copying;
use crate::pg::session::{ServerInfo, Session};
use crate::primary::archiving::{archive_command_line, check_archiving};
use crate::primary::{check_pg_path, libpq_connections, local_data_directory, primary_target};
use crate::repo;
use crate::repo::open::open_stanzas;

/// What `check` found: a line per check, and the failure that ends it when a check failed
/// after some lines were written (the caller prints the lines, then reports the failure).
#[derive(Debug)]
pub struct Report {
    pub lines: Vec<String>,
    pub failure: Option<Error>,
}

/// Runs `check`. Returns a line per check; a role that lacks rights is a [`Report`] with
/// the lines naming them and a failure ([`Error::Config`]).
///
/// - Connects (--source, else the local socket) and says how (TLS or not).
/// - The role's rights: every missing one is named with the GRANT that fixes it (an error
///   at the end, so scripts see a failure).
/// - How files would be read (local or libpq) and, for libpq, the free connection slots.
/// - With a repository and a stanza: --pg-path is the data_directory (when local), the
///   cluster's identity matches the stanza's, and the repository is writable.
pub fn run(s: &Settings) -> Result<Report> {
    let primary_conn = &s.primary;
    let target = primary_target(primary_conn)?;
    let sess = match Session::connect(&target) {
        Ok(sess) => sess,
        Err(e) if s.primary.source.is_some() && crate::remote::control::refused_by_pg_hba(&e) => {
            return replication_only(s, &target, e)
        }
        Err(e) => return Err(e),
    };
    // What the connection is, from the server's own view of it (pg_stat_ssl: a role sees
    // its own session's row).
    let tls = sess
        .query_row(
            "TLS",
            "SELECT CASE WHEN ssl THEN version END FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        )
        .map(|r| r.into_iter().next().flatten());
    let mode = target.ssl_mode.name();
    let mut lines = vec![format!(
        "connected to {} ({})",
        sess.target(),
        match tls {
            Ok(Some(v)) => format!("TLS {v}, sslmode={mode}"),
            Ok(None) if target.tls.is_some() => {
                format!("no TLS: the server did not offer it, and sslmode={mode} allows that")
            }
            Ok(None) => "no TLS".into(),
            Err(e) => format!("sslmode={mode}; pg_stat_ssl could not be read: {e}"),
        }
    )];
    let info = sess.server_info()?;
    lines.push(format!(
        "PostgreSQL {} (system identifier {})",
        info.major(),
        info.system_identifier
    ));
    let local_dir = local_data_directory(&info);
    let rights = crate::pg::privileges::rights(&sess)?;
    let (rights_lines, rights_failure) =
        crate::primary::rights::rights_lines(&rights, s.primary.transport, local_dir.is_some());
    lines.extend(rights_lines);
    if let Some(failure) = rights_failure {
        sess.close();
        return Ok(Report {
            lines,
            failure: Some(failure),
        });
    }
    let files = if local_dir.is_some() {
        Copying::LocalFiles
    } else {
        Copying::Ranges
    };
    let streams_only = s.primary.transport == Transport::Basebackup
        || (s.primary.transport == Transport::Auto && !rights.may(files));
    let local = match s.primary.transport {
        Transport::Libpq | Transport::Basebackup => None,
        _ => local_dir,
    };
    match &local {
        _ if streams_only => {}
        Some(dir) => {
            lines.push(format!(
                "the server runs on this host: files are read from {}",
                dir.display()
            ));
            if let Some(p) = &s.primary.pg_path {
                let pgdata = check_pg_path(p, &info)?;
                lines.push(format!(
                    "--pg-path {} is the data_directory",
                    pgdata.display()
                ));
            }
        }
        None => {
            let n = libpq_connections(primary_conn, &sess, &info)?;
            lines.push(format!(
                "files are read over libpq: {n} copy connection(s) fit in the server's free slots"
            ));
        }
    }
    lines.extend(crate::pg::privileges::summary_notes(
        &sess,
        info.version_num,
    )?);
    let stream_failure = if s.primary.source.is_some() {
        stream_lines(s, &sess, &info, &target, &mut lines)?
    } else {
        None
    };
    if let (Some(stanza), false) = (&s.repo_set.stanza, s.repo_set.repos.is_empty()) {
        let repos = open_stanzas(&s.repo_set)?;
        for st in &repos {
            let n = st.repo();
            repo::check_same_cluster(&st.info()?, info.system_identifier, &info.major())?;
            lines.push(format!(
                "repo{n}: stanza '{stanza}' matches system identifier {}",
                info.system_identifier
            ));
            st.check_writable()?;
            lines.push(format!("repo{n}: {} is writable", st.store().describe()));
        }
        let (archive_lines, problem) = check_archiving(
            &sess,
            &info,
            &repos,
            s.archive.timeout,
            &archive_command_line(s.config_file(), stanza),
        )?;
        lines.extend(archive_lines);
        if let Some(p) = problem {
            sess.close();
            return Ok(Report {
                lines,
                failure: Some(p),
            });
        }
    } else if s.primary.source.is_none() {
        // Without --source, check is about a stanza: both are needed.
        s.stanza()?;
        s.repo()?;
    }
    if !info.data_checksums {
        lines.push("note: data checksums are off; pages cannot be validated".into());
    }
    sess.close();
    Ok(Report {
        lines,
        failure: stream_failure,
    })
}

/// `check --source` for a role pg_hba.conf lets in for replication only (`refused`: the
/// ordinary session's refusal): what the replication connection reads (IDENTIFY_SYSTEM,
/// SHOW), the stream's prerequisites, and, as MISSING when the transport asked for or a
/// stanza needs it, the pg_hba.conf line the file transports and `backup` need.
///
/// Errors: the refusal itself when the replication connection is refused too.
fn replication_only(
    s: &Settings,
    target: &crate::pg::conninfo::ConnTarget,
    refused: Error,
) -> Result<Report> {
    let mut conn = match crate::remote::replication::ReplConn::connect(target) {
        Ok(c) => c,
        Err(_) => return Err(refused),
    };
    let info = crate::remote::control::repl_server_info(&mut conn);
    let setting = |c: &mut crate::remote::replication::ReplConn, n: &str| {
        c.show(n).ok().flatten().unwrap_or_else(|| "?".into())
    };
    let (level, senders) = (
        setting(&mut conn, "wal_level"),
        setting(&mut conn, "max_wal_senders"),
    );
    conn.close();
    let info = info?;
    let mut lines = vec![
        format!(
            "connected to {} for replication only: pg_hba.conf refuses this role an ordinary session",
            target.describe
        ),
        format!(
            "PostgreSQL {} (system identifier {}{})",
            info.major(),
            info.system_identifier,
            if info.in_recovery { ", a standby" } else { "" }
        ),
        "--transport basebackup: a replication connection is accepted from this host (the role may start replication)".into(),
        format!("--transport basebackup: wal_level = {level}, max_wal_senders = {senders}"),
        "--transport basebackup: replica-create needs nothing more: the server's facts and the copy's slots come from the replication connection".into(),
    ];
    let hint = refused.hint();
    let needs_session = matches!(s.primary.transport, Transport::Libpq | Transport::Local)
        || s.repo_set.stanza.is_some();
    let tag = if needs_session { "MISSING" } else { "note" };
    lines.push(format!(
        "{tag}: --transport libpq and local, and check of a stanza: an ordinary session (replica-create, stanza-create and backup run over the stream without one) -- fix: {}",
        hint.trim_start_matches("HINT: ")
    ));
    Ok(Report {
        lines,
        failure: needs_session.then(|| {
            Error::Config(format!(
                "pg_hba.conf lets the role in for replication only; {} needs an ordinary session too (the line above)",
                if s.repo_set.stanza.is_some() {
                    "check of a stanza".to_string()
                } else {
                    format!("--transport {}", s.primary.transport.as_str())
                }
            ))
        }),
    })
}

/// Adds a line per prerequisite of `--transport basebackup`
/// ([`crate::primary::stream_needs`]); a missing one fails check only when that transport
/// was asked for (the returned error).
fn stream_lines(
    s: &Settings,
    sess: &Session,
    info: &ServerInfo,
    target: &crate::pg::conninfo::ConnTarget,
    lines: &mut Vec<String>,
) -> Result<Option<Error>> {
    let forced = s.primary.transport == crate::options::Transport::Basebackup;
    let needs = crate::primary::stream_needs::stream_needs(sess, info, target)?;
    let mut lacking = 0;
    for n in &needs {
        let fix = n
            .fix
            .as_deref()
            .map(|f| format!(" -- fix: {f}"))
            .unwrap_or_default();
        if n.ok {
            lines.push(format!("--transport basebackup: {}{fix}", n.what));
        } else {
            lacking += 1;
            let tag = if forced { "MISSING" } else { "note" };
            lines.push(format!("{tag}: --transport basebackup: {}{fix}", n.what));
        }
    }
    Ok((forced && lacking > 0).then(|| {
        Error::Config(format!(
            "--transport basebackup: {lacking} prerequisite(s) missing on the primary; the lines above name the fixes"
        ))
    }))
}
