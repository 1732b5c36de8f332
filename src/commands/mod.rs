//! One module per command; this one holds what several of them share.
pub mod archive_async;
pub mod archive_get;
pub mod archive_push;
pub mod backup;
pub mod base_backup;
pub mod check;
pub mod delta;
pub mod expire;
pub mod info;
pub mod recovery;
pub mod replica;
pub mod restore;
pub mod stanza_create;
pub mod verify;

use crate::error::{Error, Result};
use crate::options::Settings;
use crate::options::Transport;
use crate::pg::conninfo::ConnTarget;
use crate::pg::lsn::{self, Lsn};
use crate::pg::session::{self, ServerInfo, Session};
use crate::remote::libpq::LibpqSource;
use crate::repo::{FileEntry, Piece};
use crate::storage::Storage;
use crate::transfer::source::LocalSource;
use crate::transfer::Source;
use std::fs;
use std::path::{Path, PathBuf};

/// Connections a libpq source opens when --jobs is not given. Chosen on the network lab
/// (docs/libpq-source.md): enough streams to fill a long fat link, few enough for the
/// server's connection slots.
pub const DEFAULT_LIBPQ_JOBS: usize = 4;

/// Opens the repository the command uses (`--repo N`, else the first configured).
///
/// Errors: none configured, a posix path that is not a directory, an object store that
/// refuses the credentials or lacks the bucket.
pub fn open_repo(s: &Settings) -> Result<std::sync::Arc<dyn Storage>> {
    let (_, cfg) = s.repo()?;
    crate::storage::open(cfg)
}

/// The repositories a command that reads or sets up every repository works on: `--repo N`
/// alone, else every configured one in order (repo1 first).
///
/// Errors: none configured, or `--repo N` not configured.
pub fn repos_in_scope(s: &Settings) -> Result<Vec<(u8, &crate::options::RepoConfig)>> {
    if s.repo.is_some() {
        return Ok(vec![s.repo()?]);
    }
    s.repo()?;
    Ok(s.repos.iter().map(|(n, c)| (*n, c)).collect())
}

/// Opens every repository in scope ([`repos_in_scope`]), in order.
///
/// Errors: as [`crate::storage::open`], for the first repository that cannot be opened.
pub fn open_repos(s: &Settings) -> Result<Vec<(u8, std::sync::Arc<dyn Storage>)>> {
    repos_in_scope(s)?
        .into_iter()
        .map(|(n, cfg)| Ok((n, crate::storage::open(cfg)?)))
        .collect()
}

/// Finds the repository that holds backup `set` (a label or `latest`) of `stanza`: with
/// `--repo N` that one; else the first configured repository that has it (for `latest`, the
/// first with a complete backup), as pgBackRest's restore searches. A repository that
/// cannot be opened is skipped with a warning.
///
/// Returns the repository's number, its store and the backup's label. Errors: no repository
/// has the set (the message names what each one said).
pub fn open_repo_with_set(
    s: &Settings,
    stanza: &str,
    set: &str,
) -> Result<(u8, std::sync::Arc<dyn Storage>, String)> {
    let scope = repos_in_scope(s)?;
    let single = scope.len() == 1;
    let mut why = Vec::new();
    for (n, cfg) in scope {
        let found = crate::storage::open(cfg).and_then(|store| {
            crate::repo::read_stanza(&*store, stanza)?;
            let label = crate::repo::resolve_set(&*store, stanza, set)?;
            Ok((n, store, label))
        });
        match found {
            Ok(f) => return Ok(f),
            Err(e) if single => return Err(e),
            Err(e) => {
                tracing::warn!("repo{n}: {e}");
                why.push(format!("repo{n}: {e}"));
            }
        }
    }
    Err(Error::Repo(format!(
        "no repository holds backup '{set}' of stanza '{stanza}' ({})",
        why.join("; ")
    )))
}

/// How to reach the primary: --source, else --pg-socket-path/--pg-port/--pg-user.
/// Errors: a bad connection string or TLS setting.
pub fn primary_target(s: &Settings) -> Result<ConnTarget> {
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

/// Connects to the primary: --source, else --pg-socket-path/--pg-port/--pg-user. Returns how
/// it was reached, the session and the server's facts. Errors: configuration, connection.
pub fn connect_primary(s: &Settings) -> Result<(ConnTarget, Session, ServerInfo)> {
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
pub fn open_primary(s: &Settings, check_pg_path_arg: bool) -> Result<Primary> {
    let (target, sess, info) = connect_primary(s)?;
    let transport = s.transport;
    let local = match transport {
        Transport::Libpq => None,
        Transport::Auto | Transport::Local => local_data_directory(&sess, &info),
    };
    if transport == Transport::Local && local.is_none() {
        return Err(Error::Config(format!(
            "--transport local: the server at {} does not run on this host (or its data directory {} is not readable here); use --transport libpq",
            target.describe, info.data_directory
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
                Box::new(LibpqSource::new(target.clone(), &sess, jobs)?),
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
/// None otherwise (another host, another PID namespace, or a directory not readable here).
pub fn local_data_directory(sess: &Session, info: &ServerInfo) -> Option<PathBuf> {
    let backend = sess.backend_pid().ok()?;
    let stat = fs::read_to_string(format!("/proc/{backend}/stat")).ok()?;
    // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
    let ppid: u32 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let dir = PathBuf::from(&info.data_directory);
    let pidfile = fs::read_to_string(dir.join("postmaster.pid")).ok()?;
    let postmaster: u32 = pidfile.lines().next()?.trim().parse().ok()?;
    if postmaster != ppid {
        tracing::debug!(
            "postmaster.pid names {postmaster}, the backend's parent is {ppid}: not this host"
        );
        return None;
    }
    match read_control_system_identifier(&dir) {
        Ok(id) if id == info.system_identifier => fs::canonicalize(&dir).ok(),
        _ => None,
    }
}

/// How many copy connections a libpq source opens: --jobs, or [`DEFAULT_LIBPQ_JOBS`] when
/// not given, fitted to the server's free slots ([`fit_connections`]).
pub fn libpq_connections(s: &Settings, sess: &Session, info: &ServerInfo) -> Result<usize> {
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
    let server = fs::canonicalize(&info.data_directory)
        .unwrap_or_else(|_| PathBuf::from(&info.data_directory));
    if given != server {
        return Err(Error::Config(format!(
            "--pg-path {} is not the server's data_directory ({})",
            pg_path.display(),
            info.data_directory
        )));
    }
    Ok(given)
}

/// Reads the system identifier from `<pgdata>/global/pg_control` (the first 8 bytes of
/// ControlFileData, see src/include/catalog/pg_control.h), to prove that a data directory
/// seen on this host is the one the session talks to.
pub fn read_control_system_identifier(pgdata: &Path) -> Result<u64> {
    let p = pgdata.join("global/pg_control");
    let bytes = fs::read(&p).map_err(|e| Error::io("read", &p, e))?;
    let first: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::Other(format!("{} is too short", p.display())))?;
    Ok(u64::from_le_bytes(first))
}

/// Refuses a target directory that holds anything, naming a postmaster.pid in particular.
/// A missing directory is fine.
pub fn check_empty_target(dir: &Path, what: &str) -> Result<()> {
    if dir.join("postmaster.pid").exists() {
        return Err(Error::Unsafe(format!(
            "{what} {} holds a postmaster.pid: a cluster may be running there; pgjet will not write over it",
            dir.display()
        )));
    }
    match fs::read_dir(dir) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(Error::Unsafe(format!(
                    "{what} {} is not empty",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(Error::Unsafe(format!(
            "{what} {} is a file, not an empty directory",
            dir.display()
        ))),
        Err(e) => Err(Error::io("list", dir, e)),
    }
}

/// Creates `dir` (and parents) with mode 0700, as PostgreSQL wants its data directory.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io("chmod", dir, e))
}

/// Parses `--tablespace-map ID=DIR` values into (id, dir).
pub fn parse_tablespace_map(values: &[String]) -> Result<Vec<(String, PathBuf)>> {
    values
        .iter()
        .map(|v| {
            let (id, dir) = v
                .split_once('=')
                .filter(|(i, d)| !i.is_empty() && !d.is_empty())
                .ok_or_else(|| {
                    Error::Config(format!(
                        "--tablespace-map '{v}' must look like ID=DIR (ID: tablespace OID or name)"
                    ))
                })?;
            let dir = PathBuf::from(dir);
            if !dir.is_absolute() {
                return Err(Error::Config(format!(
                    "--tablespace-map '{v}': DIR must be an absolute path"
                )));
            }
            Ok((id.to_string(), dir))
        })
        .collect()
}

/// Where each tablespace (oid, name, original location) goes: its --tablespace-map entry,
/// else its original location. Errors: a map entry that names no tablespace.
pub fn tablespace_locations(
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
) -> Result<Vec<(u32, PathBuf)>> {
    let known: Vec<(u32, String)> = tablespaces
        .iter()
        .map(|(o, n, _)| (*o, n.clone()))
        .collect();
    check_map_used(map, &known)?;
    Ok(tablespaces
        .iter()
        .map(|(oid, name, loc)| {
            (
                *oid,
                mapped_dir(map, *oid, name).unwrap_or_else(|| PathBuf::from(loc)),
            )
        })
        .collect())
}

/// Picks the mapped directory for tablespace (oid, name), or None.
pub fn mapped_dir(map: &[(String, PathBuf)], oid: u32, name: &str) -> Option<PathBuf> {
    map.iter()
        .find(|(id, _)| id == name || id.parse::<u32>().ok() == Some(oid))
        .map(|(_, d)| d.clone())
}

/// Refuses mapping entries that name no tablespace.
pub fn check_map_used(map: &[(String, PathBuf)], known: &[(u32, String)]) -> Result<()> {
    for (id, _) in map {
        if !known
            .iter()
            .any(|(oid, name)| id == name || id.parse::<u32>().ok() == Some(*oid))
        {
            return Err(Error::Config(format!(
                "--tablespace-map names tablespace '{id}', which the backup does not have"
            )));
        }
    }
    Ok(())
}

/// Rewrites tablespace_map text ("<oid> <path>" lines) with the new locations.
pub fn remap_tablespace_map(locations: &[(u32, PathBuf)]) -> String {
    locations
        .iter()
        .map(|(oid, dir)| format!("{oid} {}\n", dir.display()))
        .collect()
}

/// The file's CRC32C, combined from its pieces in order (0 for a file without pieces, the
/// CRC-32C of no bytes). The first piece's CRC is taken as it is: a combine costs about
/// 12 µs (zlib's matrix method, one squaring per bit of the length), which was 30% of a
/// backup's CPU at 100 000 one-piece files (docs/benchmark-notes.md).
pub fn file_crc(pieces: &[Piece]) -> u32 {
    match pieces.split_first() {
        None => 0,
        Some((first, rest)) => rest.iter().fold(first.crc32c, |crc, p| {
            crate::pg::pg_manifest::crc32c_combine(crc, p.crc32c, p.logical_size)
        }),
    }
}

/// Builds the manifest entry of a copied file.
pub fn file_entry(
    f: &crate::transfer::SourceFile,
    pieces: Vec<Piece>,
    page_errors: Vec<u32>,
) -> FileEntry {
    FileEntry {
        path: f.path.to_string(),
        size: f.size,
        mtime: f.mtime,
        mode: f.mode,
        crc32c: file_crc(&pieces),
        pieces,
        page_errors,
    }
}

/// A backup label like pgBackRest's: `YYYYMMDD-HHMMSSF` (UTC).
pub fn new_label(now: chrono::DateTime<chrono::Utc>) -> String {
    now.format("%Y%m%d-%H%M%SF").to_string()
}

/// RFC 3339 UTC timestamp with seconds.
pub fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Waits until WAL file `name` (a segment, or a history file) is in the archive of `store`,
/// checking every 100 ms for up to `timeout` seconds. Returns the seconds waited.
///
/// Errors: [`Error::Unsafe`] naming the file, the repository and what to check when it does
/// not arrive in time; the store's errors.
pub fn wait_archived(store: &dyn Storage, stanza: &str, name: &str, timeout: f64) -> Result<f64> {
    let file = crate::repo::wal::WalFile::parse(name)?;
    let t = std::time::Instant::now();
    loop {
        if crate::repo::wal::contains(store, stanza, &file)? {
            return Ok(t.elapsed().as_secs_f64());
        }
        if t.elapsed().as_secs_f64() >= timeout {
            return Err(Error::Unsafe(format!(
                "WAL file {name} did not reach the archive of stanza '{stanza}' in {} within {timeout} s (archive-timeout): check archive_command (it should run `pgjet --stanza={stanza} archive-push %p`) and the server log for its errors",
                store.describe()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {

    #[test]
    fn file_crc_is_the_crc_of_the_pieces_in_order() {
        let data: Vec<u8> = (0..30_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let piece = |off: usize, len: usize| Piece {
            object: "x".into(),
            offset: 0,
            stored_size: 0,
            stored_xxh3: String::new(),
            logical_offset: off as u64,
            logical_size: len as u64,
            zero_pages: Vec::new(),
            xxh3: String::new(),
            crc32c: crate::codec::crc32c(&data[off..off + len]),
        };
        assert_eq!(file_crc(&[]), crate::codec::crc32c(b""));
        assert_eq!(file_crc(&[piece(0, 30_000)]), crate::codec::crc32c(&data));
        assert_eq!(
            file_crc(&[piece(0, 8192), piece(8192, 10_000), piece(18_192, 11_808)]),
            crate::codec::crc32c(&data)
        );
    }
    use super::*;

    #[test]
    fn tablespace_map_values() {
        let m = parse_tablespace_map(&["ts1=/srv/a".into(), "16385=/srv/b".into()]).unwrap();
        assert_eq!(mapped_dir(&m, 16400, "ts1"), Some(PathBuf::from("/srv/a")));
        assert_eq!(
            mapped_dir(&m, 16385, "other"),
            Some(PathBuf::from("/srv/b"))
        );
        assert_eq!(mapped_dir(&m, 1, "none"), None);
        for bad in ["ts1", "=/srv", "ts1=", "ts1=relative/dir"] {
            assert!(
                matches!(parse_tablespace_map(&[bad.into()]), Err(Error::Config(_))),
                "{bad}"
            );
        }
        assert!(check_map_used(&m, &[(16400, "ts1".into()), (16385, "x".into())]).is_ok());
        assert!(check_map_used(&m, &[(16400, "ts1".into())]).is_err());
        assert_eq!(
            remap_tablespace_map(&[(16400, PathBuf::from("/srv/a"))]),
            "16400 /srv/a\n"
        );
    }

    #[test]
    fn empty_target_rules() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("new");
        assert!(check_empty_target(&missing, "target").is_ok());
        assert!(check_empty_target(d.path(), "target").is_ok());
        fs::write(d.path().join("x"), b"1").unwrap();
        let e = check_empty_target(d.path(), "target")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not empty"), "{e}");
        assert!(check_empty_target(&d.path().join("x"), "target").is_err());
        fs::write(d.path().join("postmaster.pid"), b"1").unwrap();
        let e = check_empty_target(d.path(), "target")
            .unwrap_err()
            .to_string();
        assert!(e.contains("postmaster.pid"), "{e}");
    }

    #[test]
    fn labels_sort_by_time() {
        use chrono::TimeZone;
        let a = chrono::Utc.with_ymd_and_hms(2026, 11, 21, 8, 5, 9).unwrap();
        let b = chrono::Utc
            .with_ymd_and_hms(2026, 11, 21, 10, 0, 0)
            .unwrap();
        assert_eq!(new_label(a), "20261121-080509F");
        assert!(new_label(a) < new_label(b));
    }
}
