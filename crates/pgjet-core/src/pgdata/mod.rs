//! Writing a data directory: checking and preparing the target (the data directory and
//! each tablespace's), creating files sparse at their size, the settings appended to
//! postgresql.auto.conf, the sync at the end, and (in [`delta_target`]) re-syncing an existing copy
//! of the same cluster with the marker that proves an unfinished directory's identity.
//! `restore` and `replica-create` both write through here.
//!
//! Modes: a written data directory gets the modes PostgreSQL gives the source cluster
//! ([`DataDirModes`]: 0700/0600, or 0750/0640 when the cluster allows group access): the
//! data directory and the tablespace directories from the recorded mode of `global`,
//! every other directory and file its recorded mode, exactly, whatever the umask (pgBackRest
//! restores recorded modes the same way, under its neutral umask).
pub mod copy;
pub mod debian;
pub mod delta_target;
pub mod finish;
pub mod incremental;
pub mod own_settings;
pub mod pitr;
pub mod recovery;
pub mod restore;
pub mod standby;
pub mod standby_slot;
pub mod stream_dir;
pub mod write;

use crate::error::{Error, Result};
use crate::io::fs::{create_new_file, set_mtime, SyncHandle};
pub use crate::pg::datadir::DataDirModes;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Refuses a target directory that holds anything, naming a postmaster.pid in particular.
/// A missing directory is fine.
pub fn check_empty_target(dir: &Path, what: &str) -> Result<()> {
    if dir.join("postmaster.pid").exists() {
        return Err(Error::Unsafe(format!(
            "{what} {} holds a postmaster.pid: a cluster may be running there; pgjet will not write over it",
            dir.display()
        ))
        .with_hint(format!(
            "stop that cluster first (pg_ctl stop -D {}); then --delta writes only what differs into it, if it is a copy of the same cluster",
            dir.display()
        )));
    }
    match fs::read_dir(dir) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(Error::Unsafe(format!(
                    "{what} {} is not empty",
                    dir.display()
                ))
                .with_hint("to bring an existing copy of the same cluster up to date, add --delta (only what differs is written); otherwise choose an empty directory, or empty this one"));
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

/// Creates `dir` (a data directory or a tablespace directory) and any missing parents with
/// mode `mode` (0700 or 0750, [`DataDirModes::dir`]), and gives `dir` exactly that mode, as
/// PostgreSQL wants its data directory (an existing one too). Parents get `mode` less the
/// umask, as initdb's `pg_mkdir_p` gives them.
///
/// Errors: [`Error::Io`] naming the directory.
pub fn create_cluster_dir(dir: &Path, mode: u32) -> Result<()> {
    crate::io::fs::create_dir_all(dir, mode)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
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

/// The catalog version of the kept copy at `pg_path` (its pg_control) when its `PG_VERSION`
/// is `major`; 0 (not known) otherwise.
pub fn kept_catalog_version(pg_path: &Path, major: &str) -> u32 {
    let same_major =
        fs::read_to_string(pg_path.join("PG_VERSION")).is_ok_and(|v| v.trim() == major);
    match crate::pg::control::read_control(pg_path) {
        Ok(c) if same_major => c.catalog_version,
        _ => 0,
    }
}

/// The tablespaces of the kept copy at `pg_path`, from its `pg_tblspc` links: (OID, "" (the
/// name is not stored there), the link's target). Empty when it has none.
/// Errors: a `pg_tblspc` that cannot be read.
pub fn kept_tablespaces(pg_path: &Path) -> Result<Vec<(u32, String, String)>> {
    let dir = pg_path.join("pg_tblspc");
    let entries = match fs::read_dir(&dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("read", &dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("read", &dir, e))?;
        let Some(oid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(to) = fs::read_link(entry.path()) {
            out.push((oid, String::new(), to.display().to_string()));
        }
    }
    out.sort();
    Ok(out)
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

/// Checks the targets without touching anything: every --tablespace-map entry names a
/// tablespace, the data directory and every tablespace directory are empty (or absent),
/// hold no postmaster.pid, and none of them is inside another. Returns (oid, location).
pub fn plan_locations(
    pg_path: &Path,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
) -> Result<Vec<(u32, PathBuf)>> {
    let locations = tablespace_locations(tablespaces, map)?;
    check_empty_target(pg_path, "target directory")?;
    for ((oid, dir), (_, name, _)) in locations.iter().zip(tablespaces) {
        check_empty_target(dir, &format!("tablespace {name} (OID {oid}) directory"))?;
    }
    let all: Vec<PathBuf> = std::iter::once(pg_path.to_path_buf())
        .chain(locations.iter().map(|(_, d)| d.clone()))
        .map(|p| normalize(&p))
        .collect::<Result<_>>()?;
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.starts_with(b) || b.starts_with(a) {
                return Err(Error::Config(format!(
                    "target directories {} and {} overlap: the data directory and each tablespace need a directory of their own",
                    a.display(),
                    b.display()
                )));
            }
        }
    }
    Ok(locations)
}

/// An absolute path with `.` components dropped; `..` is refused (it would hide overlaps).
fn normalize(p: &Path) -> Result<PathBuf> {
    use std::path::Component;
    if !p.is_absolute() {
        return Err(Error::Config(format!(
            "{} must be an absolute path",
            p.display()
        )));
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(Error::Config(format!(
                    "{} must not contain '..'",
                    p.display()
                )))
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Checks the targets and creates the data directory, the tablespace directories and links
/// (pg_tblspc/<oid> -> location) and every directory of `dirs` (relative path, recorded
/// mode). The data directory and the tablespace directories get the cluster's directory
/// mode ([`DataDirModes::of_listing`]), every directory of `dirs` exactly its recorded mode
/// (0: the cluster's). `tablespaces`: (oid, name, original location). Right after the data
/// directory, before anything is made in it, comes the marker of an unfinished copy of the
/// cluster `system_identifier` ([`delta_target::write_marker`]): a copy killed at any moment after
/// this returns or fails is one `--delta` takes up. Returns (oid, chosen location).
pub fn prepare_target(
    pg_path: &Path,
    system_identifier: u64,
    tablespaces: &[(u32, String, String)],
    map: &[(String, PathBuf)],
    dirs: &[(String, u32)],
) -> Result<Vec<(u32, PathBuf)>> {
    let locations = plan_locations(pg_path, tablespaces, map)?;
    let modes = DataDirModes::of_listing(dirs);
    create_cluster_dir(pg_path, modes.dir)?;
    // The marker first: a copy killed at any later moment is one `--delta` may take up.
    delta_target::write_marker(pg_path, system_identifier)?;
    for (oid, dir) in &locations {
        create_cluster_dir(dir, modes.dir)?;
        let tblspc = pg_path.join("pg_tblspc");
        crate::io::fs::create_dir_all(&tblspc, modes.dir)?;
        let link = tblspc.join(oid.to_string());
        std::os::unix::fs::symlink(dir, &link)
            .map_err(|e| Error::io("create tablespace link", &link, e))?;
    }
    for (rel, mode) in dirs {
        if let Some(rest) = rel.strip_prefix("pg_tblspc/") {
            if !rest.contains('/') {
                continue; // the link itself, made above
            }
        }
        let p = pg_path.join(rel);
        let mode = if *mode == 0 { modes.dir } else { *mode };
        match fs::DirBuilder::new().mode(mode).create(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create directory", &p, e)),
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("chmod", &p, e))?;
    }
    Ok(locations)
}

/// Creates `rel` below `pg_path` empty at `size` bytes (sparse: unwritten pages stay
/// holes) with permission bits `mode` (0: 0600), making its parent directory if missing.
/// Returns its path and the open file. Errors: the file exists, or cannot be made.
pub fn create_file(pg_path: &Path, rel: &str, size: u64, mode: u32) -> Result<(PathBuf, File)> {
    let p = pg_path.join(rel);
    let f = create_new_file(&p, mode)?;
    if size > 0 {
        f.set_len(size).map_err(|e| Error::io("size", &p, e))?;
    }
    Ok((p, f))
}

/// Creates every file (rel path, size, mode) with [`create_file`] and returns their paths.
pub fn create_files(pg_path: &Path, files: &[(&str, u64, u32)]) -> Result<Vec<PathBuf>> {
    files
        .iter()
        .map(|(rel, size, mode)| create_file(pg_path, rel, *size, *mode).map(|(p, _)| p))
        .collect()
}

/// Sets each file's modification time (Unix seconds).
pub fn set_mtimes(paths: &[PathBuf], mtimes: &[i64]) -> Result<()> {
    paths
        .iter()
        .zip(mtimes)
        .try_for_each(|(p, t)| set_mtime(p, *t))
}

/// Appends settings to postgresql.auto.conf (read by PostgreSQL after postgresql.conf);
/// created with exactly the permission bits `mode` when missing.
pub fn append_auto_conf(pg_path: &Path, lines: &[String], mode: u32) -> Result<()> {
    let p = pg_path.join("postgresql.auto.conf");
    let existed = p.exists();
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(mode)
        .open(&p)
        .map_err(|e| Error::io("open", &p, e))?;
    if !existed {
        crate::io::fs::set_exact_mode(&f, &p, mode)?;
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io("write", &p, e))
}

/// Handles on the data directory, a symlinked pg_wal and every tablespace directory, opened
/// before the first file is written and synced (one syncfs per filesystem) when everything
/// is written.
pub struct TargetSync(Vec<SyncHandle>);

impl TargetSync {
    /// Opens the handles; call right after [`prepare_target`].
    pub fn open(pg_path: &Path, locations: &[(u32, PathBuf)]) -> Result<TargetSync> {
        let mut v = vec![SyncHandle::open(pg_path)?];
        // A pg_wal kept as a symbolic link (a delta keeps it) may lie on another filesystem.
        let wal = pg_path.join("pg_wal");
        if wal.is_symlink() && wal.is_dir() {
            v.push(SyncHandle::open(&wal)?);
        }
        for (_, dir) in locations {
            v.push(SyncHandle::open(dir)?);
        }
        Ok(TargetSync(v))
    }

    /// Flushes the filesystems; errors if any writeback since [`TargetSync::open`] failed.
    pub fn sync(&self) -> Result<()> {
        self.0.iter().try_for_each(SyncHandle::syncfs)
    }
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

    /// prepare_target and create_file under a strict umask (077): the data directory, the
    /// tablespace directory and every directory and file get the recorded (or the cluster's)
    /// modes exactly; a cluster without group access gets 0700/0600.
    #[test]
    fn a_written_data_directory_keeps_the_clusters_modes_whatever_the_umask() {
        crate::io::fs::with_umask_in_child(
            "pgdata::tests::a_written_data_directory_keeps_the_clusters_modes_whatever_the_umask",
            0o077,
            || {
                for modes in [DataDirModes::GROUP, DataDirModes::OWNER] {
                    let d = tempfile::tempdir().unwrap();
                    let (pg, ts) = (d.path().join("pg/data"), d.path().join("ts"));
                    let dirs: Vec<(String, u32)> = [
                        ("base", modes.dir),
                        ("base/5", modes.dir),
                        ("global", modes.dir),
                        ("pg_tblspc", modes.dir),
                        ("pg_tblspc/16500", modes.dir),
                        ("pg_tblspc/16500/PG_15_1", modes.dir),
                        ("pg_wal", modes.dir),
                        ("pg_wal/archive_status", 0),
                    ]
                    .iter()
                    .map(|(p, m)| (p.to_string(), *m))
                    .collect();
                    let tablespaces = [(16500, "ts1".to_string(), ts.display().to_string())];
                    prepare_target(&pg, 1, &tablespaces, &[], &dirs).unwrap();
                    // The unfinished copy's marker, removed once a copy ends.
                    assert!(pg.join(delta_target::MARKER).exists());
                    delta_target::remove_marker(&pg).unwrap();
                    create_files(
                        &pg,
                        &[
                            ("base/5/1", 8192, modes.file),
                            ("global/pg_control", 8192, modes.file),
                        ],
                    )
                    .unwrap();
                    append_auto_conf(&pg, &["a = 1".into()], modes.file).unwrap();
                    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
                    assert_eq!(mode(&pg), modes.dir);
                    assert_eq!(mode(&ts), modes.dir);
                    assert_eq!(DataDirModes::of_dir(&pg).unwrap(), modes);
                    // The data directory's (the tablespace link not followed) and the
                    // tablespace's: 6 directories, 3 files; PG_15_1.
                    let mut all = crate::io::fs::modes_below(&pg);
                    all.extend(crate::io::fs::modes_below(&ts));
                    assert_eq!(all.len(), 10, "{all:?}");
                    for (p, is_dir, m) in all {
                        let want = if is_dir { modes.dir } else { modes.file };
                        assert_eq!(m, want, "{} is {m:04o}, not {want:04o}", p.display());
                    }
                }
            },
        );
    }

    #[test]
    fn overlapping_targets_are_refused() {
        let ts: Vec<(u32, String, String)> = vec![
            (16400, "ts1".into(), "/nonexistent/o/ts1".into()),
            (16401, "ts2".into(), "/nonexistent/o/ts2".into()),
        ];
        let plan = |maps: &[&str]| {
            let map = parse_tablespace_map(&maps.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
            plan_locations(Path::new("/nonexistent/x/data"), &ts, &map)
        };
        assert!(plan(&["ts1=/nonexistent/x/a", "ts2=/nonexistent/x/b"]).is_ok());
        assert!(plan(&["ts1=/nonexistent/x/a", "ts2=/nonexistent/x/a"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x/a", "ts2=/nonexistent/x/a/./sub"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x/data/ts", "ts2=/nonexistent/x/b"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x", "ts2=/nonexistent/y"]).is_err());
        assert!(plan(&["ts1=/nonexistent/x/a/../b", "ts2=/nonexistent/y"]).is_err());
    }
}
