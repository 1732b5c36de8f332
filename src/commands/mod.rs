//! One module per command; this one holds what several of them share.
pub mod backup;
pub mod check;
pub mod info;
pub mod replica;
pub mod restore;
pub mod stanza_create;
pub mod verify;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::pg::lsn::{self, Lsn};
use crate::pg::session::{self, ServerInfo, Session};
use crate::repo::{FileEntry, Piece};
use crate::storage::posix::PosixStorage;
use std::fs;
use std::path::{Path, PathBuf};

/// Opens the repository at --repo-path.
pub fn open_repo(s: &Settings) -> Result<PosixStorage> {
    PosixStorage::open(s.repo_path()?)
}

/// Connects to the cluster described by --pg-socket-path, --pg-port, --pg-user.
pub fn connect_local(s: &Settings) -> Result<Session> {
    Session::connect(&session::local_config(
        &s.pg_socket_path,
        s.pg_port,
        &s.pg_user,
    ))
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

/// The file's CRC32C, combined from its pieces in order.
pub fn file_crc(pieces: &[Piece]) -> u32 {
    pieces.iter().fold(0u32, |crc, p| {
        crate::pg::pg_manifest::crc32c_combine(crc, p.crc32c, p.logical_size)
    })
}

/// Builds the manifest entry of a copied file.
pub fn file_entry(
    f: &crate::transfer::SourceFile,
    pieces: Vec<Piece>,
    page_errors: Vec<u32>,
) -> FileEntry {
    FileEntry {
        path: f.path.clone(),
        size: f.size,
        mtime: f.mtime,
        mode: f.mode,
        crc32c: file_crc(&pieces),
        pieces,
        page_errors,
    }
}

/// The WAL files a backup needs, as source files under `pgdata/pg_wal`: every segment from
/// the start LSN to the stop LSN on `timeline`, and the timeline's history file if any.
/// Each segment's first page header is checked (timeline, address, system identifier).
pub fn wal_source_files(
    pgdata: &Path,
    timeline: u32,
    start: Lsn,
    stop: Lsn,
    seg_size: u64,
    system_identifier: u64,
) -> Result<Vec<crate::transfer::SourceFile>> {
    use std::os::unix::fs::MetadataExt;
    let wal_dir = pgdata.join("pg_wal");
    let mut names = Vec::new();
    if timeline > 1 {
        let h = lsn::history_file_name(timeline);
        if wal_dir.join(&h).exists() {
            names.push(h);
        }
    }
    let first_segno = lsn::segno_of(start, seg_size);
    let mut out = Vec::new();
    let segs = lsn::wal_segments_for_range(timeline, start, stop, seg_size);
    for (i, name) in segs.iter().enumerate() {
        let abs = wal_dir.join(name);
        let f = fs::File::open(&abs).map_err(|e| Error::io("open WAL segment", &abs, e))?;
        let mut page = vec![0u8; 8192];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut page, 0)
            .map_err(|e| Error::io("read WAL segment", &abs, e))?;
        lsn::check_wal_segment_header(
            &page,
            timeline,
            first_segno + i as u64,
            seg_size,
            system_identifier,
        )
        .map_err(|why| {
            Error::Unsafe(format!(
                "WAL segment {} is not the one the backup needs: {why}",
                abs.display()
            ))
        })?;
        names.push(name.clone());
    }
    for name in names {
        let abs = wal_dir.join(&name);
        let meta = fs::metadata(&abs).map_err(|e| Error::io("stat WAL file", &abs, e))?;
        out.push(crate::transfer::SourceFile {
            path: format!("pg_wal/{name}"),
            abs,
            size: meta.len(),
            mtime: meta.mtime(),
            mode: 0o600,
            checksum_segno: None,
        });
    }
    Ok(out)
}

/// A backup label like pgBackRest's: `YYYYMMDD-HHMMSSF` (UTC).
pub fn new_label(now: chrono::DateTime<chrono::Utc>) -> String {
    now.format("%Y%m%d-%H%M%SF").to_string()
}

/// RFC 3339 UTC timestamp with seconds.
pub fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
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
