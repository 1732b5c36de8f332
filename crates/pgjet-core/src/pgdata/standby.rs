//! Starting a new standby in a written data directory and waiting until the primary sees it
//! stream (`replica-create --start`).
use crate::error::{Error, Result};
use crate::options::{PrimaryConn, ReplicaOptions};
use crate::pg::conninfo::{ConnInfo, ConnTarget};
use crate::pg::session::{quote_conf_value, quote_literal, Session};
use crate::pgdata::debian::{missing_config_files, DebianCluster};
use crate::pgdata::own_settings::OwnSettings;
use crate::remote::control::Control;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory of the PostgreSQL binaries that start the standby: --pg-bin; else, when
/// the primary runs on this host, its own (from the postmaster's /proc/<pid>/exe, its PID
/// being the first line of postmaster.pid); else Debian's /usr/lib/postgresql/<major>/bin.
pub fn bin_dir(pg_bin: Option<&Path>, local_dir: Option<&Path>, major: &str) -> Result<PathBuf> {
    if let Some(b) = pg_bin {
        return Ok(b.to_path_buf());
    }
    if let Some(dir) = local_dir {
        let pidfile = dir.join("postmaster.pid");
        let text = fs::read_to_string(&pidfile).map_err(|e| Error::io("read", &pidfile, e))?;
        let pid = text.lines().next().unwrap_or("").trim().to_string();
        let exe = fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
            Error::Config(format!("cannot find the primary's binaries from PID {pid}"))
                .because(e)
                .with_hint("pass --pg-bin")
        })?;
        return exe.parent().map(Path::to_path_buf).ok_or_else(|| {
            Error::Config("cannot find the primary's binaries; pass --pg-bin".into())
        });
    }
    let debian = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"));
    if debian.join("pg_ctl").exists() {
        return Ok(debian);
    }
    Err(Error::Config(format!(
        "no PostgreSQL {major} binaries found on this host (tried {}); pass --pg-bin",
        debian.display()
    )))
}

/// Starts the standby and waits (up to 120 s) until the primary shows it streaming in
/// pg_stat_replication under application_name `app` (or, for a role pg_hba.conf lets in
/// for replication only, until the standby's log says it streams). A Debian cluster's data directory
/// ([`DebianCluster`]) is started with pg_ctlcluster (on `port` only when it is not the
/// default, its config setting the port), any other with `pg_ctl -D target -o "-p port"`.
///
/// Errors: a copy with no `postgresql.conf` that is no Debian cluster (its primary keeps the
/// file elsewhere: nothing could start it), pg_ctl or pg_ctlcluster failing, or no stream
/// after 120 s.
pub fn start_standby(
    bin: &Path,
    port: u16,
    target: &Path,
    conn: &ConnTarget,
    app: &str,
) -> Result<()> {
    let log_len = |log: &Path| fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    if let Some(cluster) = DebianCluster::of(target) {
        let given = (port != crate::options::DEFAULT_PG_PORT).then_some(port);
        let log = PathBuf::from(format!(
            "/var/log/postgresql/postgresql-{}-{}.log",
            cluster.version, cluster.name
        ));
        let from = log_len(&log);
        cluster.start(given)?;
        return wait_streaming(target, conn, app, (&log, from));
    }
    let missing = missing_config_files(target);
    if missing.contains(&"postgresql.conf") {
        return Err(Error::Config(format!(
            "the copy in {} is complete but has no {}: the primary keeps its configuration outside its data directory (as Debian's clusters do, in /etc/postgresql), so --start cannot start it",
            target.display(),
            missing.join(", ")
        ))
        .with_hint(
            "on Debian, make the standby's cluster first (pg_createcluster VERSION NAME -d DIR, then empty DIR) and --start starts it with pg_ctlcluster; elsewhere, put a postgresql.conf and pg_hba.conf into the copy and start it with pg_ctl",
        ));
    }
    let log = target.join("pgjet-start.log");
    let from = log_len(&log);
    let status = Command::new(bin.join("pg_ctl"))
        .args(["-D"])
        .arg(target)
        .args(["-l"])
        .arg(&log)
        .args(["-w", "-t", "120", "-o"])
        .arg(format!("-p {port}"))
        .arg("start")
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| Error::io("run pg_ctl", bin.join("pg_ctl"), e))?;
    if !status.success() {
        return Err(Error::Other(format!(
            "pg_ctl could not start the standby in {} (see {})",
            target.display(),
            log.display()
        )));
    }
    wait_streaming(target, conn, app, (&log, from))
}

/// Waits (up to 120 s) until the primary (`conn`) shows a walsender of application_name
/// `app` ([`primary_sees`]), or, when pg_hba.conf refuses the role an ordinary session,
/// until the standby's WAL receiver says it streams ([`receiver_says`]: its process title,
/// or its log `log` past byte `from`). `log` is named in the error.
fn wait_streaming(
    target: &Path,
    conn: &ConnTarget,
    app: &str,
    (log, from): (&Path, u64),
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut session_refused = false;
    loop {
        let seen = if session_refused {
            receiver_says(target, (log, from))
        } else {
            match primary_sees(conn, app) {
                Ok(seen) => seen,
                Err(e) if crate::remote::control::refused_by_pg_hba(&e) => {
                    session_refused = true;
                    continue;
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(how) = seen {
            tracing::info!("standby {} is {how}", target.display());
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Other(format!(
                "the standby in {} started but does not stream after 120 s (see {})",
                target.display(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// What the primary (`conn`) shows of the walsender of application_name `app`: streaming,
/// connected (its state hidden), or None yet. Errors: the session's.
fn primary_sees(conn: &ConnTarget, app: &str) -> Result<Option<&'static str>> {
    let sess = Session::connect(conn)?;
    // pg_stat_replication hides a walsender's state from roles without
    // pg_read_all_stats; pg_stat_activity still shows the role's own walsenders.
    let rows = sess.query_strings(
        "pg_stat_replication",
        &format!(
            "SELECT coalesce(r.state, 'hidden') FROM pg_stat_activity a \
             LEFT JOIN pg_stat_replication r ON r.pid = a.pid \
             WHERE a.backend_type = 'walsender' AND a.application_name = {}",
            quote_literal(app)
        ),
    );
    sess.close();
    let states: Vec<String> = rows?
        .iter()
        .filter_map(|r| r.first().cloned().flatten())
        .collect();
    Ok(if states.iter().any(|s| s == "streaming") {
        Some("streaming")
    } else if states.iter().any(|s| s == "hidden") {
        Some("connected to the primary (its state is visible only with pg_read_all_stats)")
    } else {
        None
    })
}

/// What the standby in `target` itself says for a role that may not open an ordinary
/// session on the primary: streaming when its WAL receiver's process title
/// ([`receiver_streams`]) or its log past byte `from` ([`log_says_streaming`]) says so.
fn receiver_says(target: &Path, (log, from): (&Path, u64)) -> Option<&'static str> {
    let text = fs::read(log)
        .map(|b| String::from_utf8_lossy(b.get(from as usize..).unwrap_or_default()).into_owned())
        .unwrap_or_default();
    (receiver_streams(target) || log_says_streaming(&text)).then_some(
        "streaming (its WAL receiver says so; pg_stat_replication needs an ordinary session on the primary)",
    )
}

/// Whether the server running in `target` (its postmaster.pid) has a WAL receiver whose
/// process title says it streams: `postgres: walreceiver streaming 0/3000148`
/// (walreceiver.c sets it with set_ps_display while update_process_title is on, the default).
fn receiver_streams(target: &Path) -> bool {
    crate::pg::processes::postmaster_child(target, |title| {
        title.contains("walreceiver") && title.contains("streaming")
    })
    .is_some()
}

/// Whether a standby's log says its WAL receiver streams: walreceiver.c logs `started
/// streaming WAL from primary at %X/%X on timeline %u` when it starts (in English unless
/// lc_messages says otherwise).
fn log_says_streaming(text: &str) -> bool {
    text.contains("started streaming WAL from primary")
}

/// application_name the standby uses in primary_conninfo (to find it in
/// pg_stat_replication, and the name synchronous_standby_names lists): the one --source or
/// PGAPPNAME gives, else the one a re-synced standby's own primary_conninfo had, else the
/// slot name or `pgjet_standby_<port>`.
pub fn standby_app_name(
    given: &ConnInfo,
    own: &OwnSettings,
    slot: Option<&str>,
    port: u16,
) -> String {
    given
        .get("application_name")
        .map(str::to_owned)
        .or_else(|| {
            own.conninfo()
                .and_then(|c| c.get("application_name").map(str::to_owned))
        })
        .or_else(|| slot.map(str::to_owned))
        .unwrap_or_else(|| format!("pgjet_standby_{port}"))
}

/// The keywords of a re-synced standby's former primary_conninfo that its new one keeps
/// when the new connection does not set them (libpq's connection parameters that tune a
/// connection, not its target: PostgreSQL doc/src/sgml/libpq.sgml).
pub const KEPT_KEYWORDS: &[&str] = &[
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "connect_timeout",
    "options",
];

/// primary_conninfo, as pg_basebackup -R writes it: every connection parameter in effect
/// (from --source and the environment, so the standby connects as pgjet did), but the
/// database (a walreceiver needs none), with `application_name` = `app`. A password comes
/// only from the connection string or PGPASSWORD: one read from a password file is never
/// copied into postgresql.auto.conf, the file is named instead (`passfile`, as
/// pg_basebackup -R names it), so the standby reads the same file.
///
/// On a re-sync, `own` is the standby's former primary_conninfo: the keywords that tune
/// how its walreceiver connects ([`KEPT_KEYWORDS`]: keepalives, timeouts, `options`) are kept
/// when the new connection does not set them. Where and as whom it connects (host, hostaddr,
/// port, user, password, TLS files) always come from the new connection: a former host
/// address kept beside a new host name would send the standby to the old primary.
pub fn standby_conninfo(effective: &ConnInfo, own: Option<&ConnInfo>, app: &str) -> String {
    let mut c = effective.clone();
    if let Some(own) = own {
        for (k, v) in own
            .params
            .iter()
            .filter(|(k, _)| KEPT_KEYWORDS.contains(&k.as_str()))
        {
            c.params.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    c.params.remove("dbname");
    c.params.insert("application_name".into(), app.to_string());
    c.to_conninfo_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_conninfo_keeps_the_connection_but_the_database() {
        let eff = ConnInfo::parse(
            "host=10.0.0.1 port=5432 user=rep password='a b' dbname=postgres sslmode=verify-full application_name=pgjet",
        )
        .unwrap();
        let c = standby_conninfo(&eff, None, "s1");
        // A re-sync keeps the former connection's tuning, never its target.
        let own = ConnInfo::parse(
            "host=old hostaddr=10.9.9.9 port=6000 user=x keepalives_idle=5 application_name=a",
        )
        .unwrap();
        let back = ConnInfo::parse(&standby_conninfo(&eff, Some(&own), "s1")).unwrap();
        assert_eq!(back.get("keepalives_idle"), Some("5"));
        assert_eq!(back.get("hostaddr"), None);
        assert_eq!(back.get("host"), Some("10.0.0.1"));
        assert_eq!(back.get("port"), Some("5432"));
        let back = ConnInfo::parse(&c).unwrap();
        assert_eq!(back.get("application_name"), Some("s1"));
        assert_eq!(back.get("password"), Some("a b"));
        assert_eq!(back.get("sslmode"), Some("verify-full"));
        assert_eq!(back.get("dbname"), None);
    }
}

/// What `replica-create` reports.
#[derive(Debug, serde::Serialize)]
pub struct ReplicaSummary {
    pub pg_path: String,
    /// Logical bytes copied.
    pub size: u64,
    pub seconds: f64,
    pub mib_per_sec: f64,
    pub slot: Option<String>,
    pub started: bool,
    /// How the primary's files were read: "local" or "libpq".
    pub transport: String,
    /// Copy connections (libpq) or workers (local).
    pub jobs: usize,
    /// With --delta: logical bytes found equal by hash (not copied) and bytes copied.
    pub delta_same: Option<u64>,
    pub delta_copied: Option<u64>,
    /// With --transport basebackup: bytes received on the replication connection
    /// (compressed stream and manifest, before TLS) and the server's compression.
    pub wire_bytes: Option<u64>,
    pub network_compress: Option<String>,
}

/// The settings a standby gets in postgresql.auto.conf: primary_conninfo (for `target`,
/// with `app` as application_name), the slot, the port; on a re-sync, the standby's own
/// settings (`own`, read before the copy) that the primary's file (`primary`, the copied
/// postgresql.auto.conf) does not replace ([`OwnSettings::kept_lines`]); none when Patroni
/// called (it writes its own, after the method: Patroni's postgresql/config.py). The port is
/// `--pg-port` when given (or with `--start`, unless the standby is a Debian cluster, whose
/// port its config in /etc/postgresql sets), else the standby's own.
pub fn standby_lines(
    s: &PrimaryConn,
    args: &ReplicaOptions,
    target: &crate::pg::conninfo::ConnTarget,
    app: &str,
    slot: Option<&str>,
    own: &OwnSettings,
    primary: &OwnSettings,
) -> Vec<String> {
    if args.patroni.is_some() {
        // Patroni writes primary_conninfo, primary_slot_name and standby.signal itself
        // after the method, and removes recovery settings from postgresql.auto.conf.
        tracing::info!("standby settings left to Patroni, which writes its own");
        return Vec::new();
    }
    let conninfo = standby_conninfo(&target.effective, own.conninfo().as_ref(), app);
    let mut lines = vec![
        "# standby settings added by pgjet replica-create".to_string(),
        format!("primary_conninfo = {}", quote_conf_value(&conninfo)),
    ];
    if let Some(slot) = slot {
        lines.push(format!("primary_slot_name = {}", quote_conf_value(slot)));
    }
    let mut written = vec!["primary_conninfo", "primary_slot_name"];
    // A Debian cluster's port is in its own postgresql.conf in /etc/postgresql: --start
    // alone does not override it there.
    let debian = s.pg_path.as_deref().and_then(DebianCluster::of).is_some();
    if s.pg_port != crate::options::DEFAULT_PG_PORT || (args.start && !debian) {
        lines.push(format!("port = {}", s.pg_port));
        written.push("port");
    }
    let kept = own.kept_lines(primary, &written);
    if !kept.is_empty() {
        tracing::info!(
            "the standby's own settings kept in postgresql.auto.conf: {}",
            kept[1..]
                .iter()
                .filter_map(|l| crate::pgdata::finish::setting_name(l))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    lines.extend(kept);
    lines
}

/// After a failed replica-create: the slot this run made on the primary (`made`) is
/// dropped (a slot left behind would hold WAL on the primary for a standby that never
/// came; a slot it reused is left as it was), and the target's pg_control removed, so
/// PostgreSQL never starts on the half-written directory.
pub fn undo_failed_replica(ctl: &dyn Control, made: Option<&str>, target: &Path) {
    if let Some(name) = made {
        if ctl.slot_state(name).ok().flatten().is_some() {
            if let Err(d) = ctl.drop_slot(name) {
                tracing::warn!(
                    "could not drop slot {name} after the failure: {}",
                    d.with_causes()
                );
            }
        }
    }
    let _ = fs::remove_file(target.join("global/pg_control"));
}

/// What a finished copy hands to [`finish_replica`].
pub struct Copied<'a> {
    /// The new standby's data directory.
    pub target: &'a Path,
    /// Logical bytes copied, and the seconds the copy took.
    pub size: u64,
    pub seconds: f64,
    /// "local", "libpq" or "basebackup", and the connections or workers used.
    pub transport: &'a str,
    pub jobs: usize,
    /// The primary's major version and, when it runs on this host, its data directory (to
    /// find the binaries that start the standby).
    pub major: &'a str,
    pub local_dir: Option<&'a Path>,
    /// The slot the standby streams from (`--slot`, or a re-synced standby's own).
    pub slot: Option<&'a str>,
}

/// Starts the new standby when `--start` asked for it ([`start_standby`], connecting as
/// `conn` with application_name `app`), and makes the report of replica-create; the
/// caller fills in what only its transport knows (delta counts, wire bytes).
///
/// Errors: as [`bin_dir`] and [`start_standby`].
pub fn finish_replica(
    s: &PrimaryConn,
    args: &ReplicaOptions,
    c: &Copied,
    conn: &ConnTarget,
    app: &str,
) -> Result<ReplicaSummary> {
    let mut started = false;
    if args.start {
        let bin = bin_dir(args.pg_bin.as_deref(), c.local_dir, c.major)?;
        start_standby(&bin, s.pg_port, c.target, conn, app)?;
        started = true;
    }
    Ok(ReplicaSummary {
        pg_path: c.target.display().to_string(),
        size: c.size,
        seconds: c.seconds,
        mib_per_sec: c.size as f64 / (1 << 20) as f64 / c.seconds.max(1e-6),
        slot: c.slot.map(str::to_owned),
        started,
        transport: c.transport.into(),
        jobs: c.jobs,
        delta_same: None,
        delta_copied: None,
        wire_bytes: None,
        network_compress: None,
    })
}

/// What the user gave as `--source` (the connection string and the environment, before
/// defaults), from which the standby's application_name comes ([`standby_app_name`]).
///
/// Errors: no `--source`; a connection string that does not parse.
pub fn source_as_given(s: &PrimaryConn) -> Result<ConnInfo> {
    let source = s.source.as_deref().ok_or_else(|| {
        Error::Config("replica-create needs --source: the primary's connection string (or --stanza, to seed from the repository's newest backup)".into())
    })?;
    Ok(ConnInfo::parse(source)
        .map_err(crate::pg::conninfo::source_error)?
        .with_env_defaults(&crate::pg::session::env_var))
}

/// Whether `target` is re-synced in place (`--delta` over a kept copy of the cluster of
/// `system_identifier`: [`crate::pgdata::delta_target::check_delta_target`]) rather than written whole. Under
/// Patroni, which deletes the directory itself when every method fails, a kept directory
/// that is no copy of this cluster (another cluster's, an unreadable one, one left with a
/// stale postmaster.pid by a crash) is emptied and written whole, and the log says which and
/// why. Errors: the check's, elsewhere; a live server's postmaster.pid always.
pub fn kept_copy(target: &Path, system_identifier: u64, args: &ReplicaOptions) -> Result<bool> {
    if !args.delta {
        return Ok(false);
    }
    if args.patroni.is_some() {
        crate::pgdata::delta_target::remove_stale_pid(target)?;
    }
    match crate::pgdata::delta_target::check_delta_target(target, system_identifier) {
        Ok(t) => Ok(t == crate::pgdata::delta_target::DeltaTarget::SameCluster),
        Err(e @ Error::Unsafe(_)) if args.patroni.is_some() => {
            tracing::warn!(
                "{} is replaced by a full copy: {}",
                target.display(),
                e.with_causes()
            );
            crate::pgdata::delta_target::empty_dir(target)?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
