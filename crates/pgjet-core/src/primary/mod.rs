//! The cluster being copied: how to reach it (`--source`, else the local socket), the
//! session and its facts, and where its files are read from: this host's filesystem when the
//! server provably runs here, else libpq connections (the transport choice). The one
//! base-backup sequence that backup and replica-create share is in [`backup_sequence`].
pub mod archiving;
pub mod backup_sequence;
pub mod choose;
pub mod repo_copy;
pub mod rights;
pub mod seed_choice;
pub mod stream_needs;
pub mod stream_sequence;

use crate::error::{Error, Result};
use crate::options::PrimaryConn;
use crate::options::Transport;
use crate::pg::conninfo::ConnTarget;
use crate::pg::session::{self, ServerInfo, Session};
use crate::remote::libpq::LibpqSource;
use crate::transfer::source::LocalSource;
use crate::transfer::Source;
use std::fs;
use std::path::{Path, PathBuf};

/// Connections a libpq source opens when --jobs is not given. Chosen on the network lab
/// (docs/libpq-source.md): enough streams to fill a long fat link, few enough for the
/// server's connection slots.
pub const DEFAULT_LIBPQ_JOBS: usize = 4;

/// How to reach the primary: --source, else --pg-socket-path/--pg-port/--pg-user.
/// Errors: a bad connection string or TLS setting.
pub fn primary_target(s: &PrimaryConn) -> Result<ConnTarget> {
    match &s.source {
        Some(c) => session::parse_conninfo(c),
        None => session::local_config(&s.pg_socket_path, s.pg_port, &s.pg_user),
    }
}

/// The primary a base backup copies: its session, its facts, how to reach it again, and
/// where its files are read.
pub struct Primary {
    pub sess: Session,
    pub info: ServerInfo,
    pub target: ConnTarget,
    pub source: Box<dyn Source>,
    /// Parallel workers for this source.
    pub jobs: usize,
    /// The data directory on this host when files are read locally; None over libpq.
    pub local_dir: Option<PathBuf>,
}

impl Primary {
    /// Ends the source's connections, then the session (and with it the temporary slot).
    pub fn close(self) {
        drop(self.source);
        self.sess.close();
    }
}

/// The primary reached for the server's own `BASE_BACKUP` stream: no file source, only the
/// control connection (for the slot and the facts: the SQL session, or a replication
/// connection for a role let in for replication only) and how to reach it again for the
/// stream's replication connection.
pub struct StreamPrimary {
    pub target: ConnTarget,
    pub ctl: Box<dyn crate::remote::control::Control>,
    pub info: ServerInfo,
    /// A replication connection opened already (by `--transport auto`'s probe), taken by
    /// the stream.
    pub early: std::sync::Mutex<Option<crate::remote::replication::ReplConn>>,
    /// The wire compression and level to ask for (given, or chosen by `--transport auto`).
    pub compress: crate::options::NetworkCompress,
    pub level: Option<i32>,
    /// zstd threads on the server (None: the primary's max_parallel_maintenance_workers).
    pub workers: Option<u32>,
}

/// How a backup copies the primary: its files (this host's, or ranges over libpq), or the
/// server's `BASE_BACKUP` stream.
pub enum Copier {
    Files(Primary),
    Stream(StreamPrimary),
}

impl Copier {
    /// Connects by `s.transport`: `basebackup` takes the stream; `auto` the stream when the
    /// primary is on another host and the probe finds it faster
    /// ([`choose::auto_stream_settings`]); every other case the files ([`open_primary`],
    /// checking a given --pg-path). Errors: as [`open_primary`], the probe's.
    pub fn open(s: &PrimaryConn) -> Result<Copier> {
        let (s, reached) = match choose::auto_stream_settings(s, false, false, None)? {
            Some((stream, reached)) => (std::borrow::Cow::Owned(stream), Some(reached)),
            None => (std::borrow::Cow::Borrowed(s), None),
        };
        if s.transport == Transport::Basebackup {
            let r = match reached {
                Some(r) => r,
                None => choose::Reached::connect(&s, true)?,
            };
            return Ok(Copier::Stream(StreamPrimary {
                target: r.target,
                ctl: r.ctl,
                info: r.info,
                early: std::sync::Mutex::new(r.early),
                compress: s.network_compress,
                level: s.network_level,
                workers: s.network_workers,
            }));
        }
        Ok(Copier::Files(open_primary(&s, true)?))
    }

    /// The control connection on the primary: the SQL session, or for the stream a
    /// replication connection in its place ([`crate::remote::control`]).
    pub fn ctl(&self) -> &dyn crate::remote::control::Control {
        match self {
            Copier::Files(p) => &p.sess,
            Copier::Stream(p) => &*p.ctl,
        }
    }

    /// The primary's facts.
    pub fn info(&self) -> &ServerInfo {
        match self {
            Copier::Files(p) => &p.info,
            Copier::Stream(p) => &p.info,
        }
    }
}

/// Connects to the primary: --source, else --pg-socket-path/--pg-port/--pg-user. Returns how
/// it was reached, the session and the server's facts. Errors: configuration, connection.
pub fn connect_primary(s: &PrimaryConn) -> Result<(ConnTarget, Session, ServerInfo)> {
    let target = primary_target(s)?;
    let sess = Session::connect(&target)?;
    let info = sess.server_info()?;
    Ok((target, sess, info))
}

/// Connects to the primary (--source, else --pg-socket-path/--pg-port/--pg-user) and picks
/// the source of its files: the local filesystem when `transport` allows it and the server
/// provably runs on this host ([`local_data_directory`]), else libpq. With `check_pg_path`,
/// a given --pg-path must be the server's data_directory when files are read locally.
///
/// Errors: connection, a --transport local the server's host does not allow, a wrong
/// --pg-path, too few free connection slots.
pub fn open_primary(s: &PrimaryConn, check_pg_path_arg: bool) -> Result<Primary> {
    let (target, sess, info) = connect_primary(s)?;
    let transport = s.transport;
    let local = match transport {
        Transport::Libpq => None,
        Transport::Auto | Transport::Local => local_data_directory(&info),
        // The stream has no file source: see Copier (backup) and commands/replica_stream.rs.
        Transport::Basebackup => {
            return Err(Error::Config(
                "--transport basebackup reads no files: this command cannot use it; use --transport libpq or local".into(),
            ))
        }
    };
    if transport == Transport::Local && local.is_none() {
        return Err(Error::Config(format!(
            "--transport local: the server at {} does not run on this host (or its data directory{} is not readable here); use --transport libpq",
            target.describe,
            if info.data_directory.is_empty() {
                String::new()
            } else {
                format!(" {}", info.data_directory)
            }
        )));
    }
    let (source, jobs): (Box<dyn Source>, usize) = match &local {
        Some(dir) => {
            if check_pg_path_arg {
                if let Some(p) = &s.pg_path {
                    check_pg_path(p, &info)?;
                }
            }
            (Box::new(LocalSource::new(dir)), s.jobs)
        }
        None => {
            let jobs = libpq_connections(s, &sess, &info)?;
            tracing::info!(
                "reading {} over libpq with {jobs} connection(s)",
                target.describe
            );
            (
                Box::new(LibpqSource::new(target.clone(), &sess, jobs)?.with_max_rate(s.max_rate)),
                jobs,
            )
        }
    };
    Ok(Primary {
        sess,
        info,
        target,
        source,
        jobs,
        local_dir: local,
    })
}

/// The server's data directory on this host, when the server provably runs here: the
/// parent of this session's backend process is the postmaster whose PID the data
/// directory's postmaster.pid names, and its pg_control has the server's system identifier.
/// The directory is `data_directory`, or the postmaster's working directory for a role that
/// may not read that setting. None otherwise (another host, another PID namespace, or a directory not readable here).
pub fn local_data_directory(info: &ServerInfo) -> Option<PathBuf> {
    let backend = info.backend_pid;
    let stat = fs::read_to_string(format!("/proc/{backend}/stat")).ok()?;
    // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
    let ppid: u32 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    // A role that may not read data_directory: the postmaster's working directory, which
    // is its data directory (ChangeToDataDir, src/backend/utils/init/miscinit.c), readable
    // here by the server's own user or root, as its files are.
    let dir = if info.data_directory.is_empty() {
        fs::read_link(format!("/proc/{ppid}/cwd")).ok()?
    } else {
        PathBuf::from(&info.data_directory)
    };
    let postmaster = crate::pg::processes::postmaster_pid(&dir)?;
    if postmaster != ppid {
        tracing::debug!(
            "postmaster.pid names {postmaster}, the backend's parent is {ppid}: not this host"
        );
        return None;
    }
    match crate::pg::control::read_system_identifier(&dir) {
        Ok(id) if id == info.system_identifier => fs::canonicalize(&dir).ok(),
        _ => None,
    }
}

/// How many copy connections a libpq source opens: --jobs, or [`DEFAULT_LIBPQ_JOBS`] when
/// not given, fitted to the server's free slots ([`fit_connections`]).
pub fn libpq_connections(s: &PrimaryConn, sess: &Session, info: &ServerInfo) -> Result<usize> {
    let wanted = if s.jobs_given {
        s.jobs
    } else {
        DEFAULT_LIBPQ_JOBS
    };
    fit_connections(sess, info, wanted)
}

/// How many copy connections the server can take: `wanted`, or fewer when the server has
/// fewer free slots (max_connections less superuser_reserved_connections, reserved_connections
/// on 16+, and the client backends already connected; one is left for others).
///
/// Errors: no free slot at all.
pub fn fit_connections(sess: &Session, info: &ServerInfo, wanted: usize) -> Result<usize> {
    let reserved = if info.version_num >= 160000 {
        "current_setting('reserved_connections')::int"
    } else {
        "0"
    };
    let r = sess.query_row(
        "count free connection slots",
        &format!(
            "SELECT current_setting('max_connections')::int              - current_setting('superuser_reserved_connections')::int              - CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN 0 ELSE {reserved} END              - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int"
        ),
    )?;
    let free: i64 = r
        .first()
        .cloned()
        .flatten()
        .and_then(|v| v.parse().ok())
        .unwrap_or(wanted as i64 + 1);
    let usable = (free - 1).max(0) as usize;
    if usable == 0 {
        return Err(Error::Unsafe(format!(
            "the server has no free connection slot for copy connections ({free} free); raise max_connections or close sessions"
        )));
    }
    if usable < wanted {
        tracing::warn!(
            "using {usable} copy connection(s) instead of {wanted}: the server has only {free} free slot(s)"
        );
    }
    Ok(wanted.min(usable))
}

/// Refuses a --pg-path that is not the server's data_directory.
pub fn check_pg_path(pg_path: &Path, info: &ServerInfo) -> Result<PathBuf> {
    let given =
        fs::canonicalize(pg_path).map_err(|e| Error::io("resolve --pg-path", pg_path, e))?;
    let named = if info.data_directory.is_empty() {
        // A role that may not read the setting: the directory the server provably runs in,
        // else its pg_control must name the server's cluster.
        match local_data_directory(info) {
            Some(dir) => dir,
            None => {
                return match crate::pg::control::read_system_identifier(&given) {
                    Ok(id) if id == info.system_identifier => Ok(given),
                    _ => Err(Error::Config(format!(
                        "--pg-path {} does not hold the server's cluster (system identifier {})",
                        pg_path.display(),
                        info.system_identifier
                    ))),
                };
            }
        }
    } else {
        PathBuf::from(&info.data_directory)
    };
    let server = fs::canonicalize(&named).unwrap_or(named);
    if given != server {
        return Err(Error::Config(format!(
            "--pg-path {} is not the server's data_directory ({})",
            pg_path.display(),
            server.display()
        )));
    }
    Ok(given)
}
