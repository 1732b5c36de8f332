//! Walking a data directory the way PostgreSQL's base backup does (see
//! src/backend/backup/basebackup.c): which directories and files are copied, which are
//! skipped ([`crate::pg::exclude`]), and where the tablespaces are.
use crate::error::{Error, Result};
use crate::pg::exclude::{self, Decision};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file to copy.
#[derive(Debug, Clone)]
pub struct ListedFile {
    /// Path relative to the data directory ('/'-separated; tablespaces below pg_tblspc/<oid>/).
    pub rel: String,
    pub abs: PathBuf,
    /// Bytes.
    pub size: u64,
    /// Unix seconds.
    pub mtime: i64,
    pub mode: u32,
    /// Relation segment number when the file carries page checksums.
    pub checksum_segno: Option<u32>,
}

/// A tablespace link found in pg_tblspc.
#[derive(Debug, Clone)]
pub struct TablespaceLink {
    pub oid: u32,
    /// Directory the link points to.
    pub target: PathBuf,
}

/// What a backup of the data directory copies.
#[derive(Debug, Default)]
pub struct Listing {
    /// Directories (relative path, mode), parents before children.
    pub dirs: Vec<(String, u32)>,
    pub files: Vec<ListedFile>,
    pub tablespaces: Vec<TablespaceLink>,
}

/// Lists `pgdata`. `tablespace_dir` is the per-version directory inside each tablespace
/// (`PG_<major>_<catalog version>`, see TABLESPACE_VERSION_DIRECTORY in
/// src/include/catalog/catalog.h); only it is copied, as basebackup.c does.
/// `checksums`: whether the cluster has data checksums.
///
/// Errors: any directory or file that cannot be read (a file that vanishes while listing is
/// skipped: PostgreSQL removed it and WAL replay will agree).
pub fn list_data_directory(
    pgdata: &Path,
    version_num: u32,
    tablespace_dir: &str,
    checksums: bool,
) -> Result<Listing> {
    let mut l = Listing::default();
    walk(pgdata, "", version_num, checksums, &mut l)?;
    let tblspc = pgdata.join("pg_tblspc");
    let entries = fs::read_dir(&tblspc).map_err(|e| Error::io("list", &tblspc, e))?;
    let mut links = Vec::new();
    for ent in entries {
        let ent = ent.map_err(|e| Error::io("list", &tblspc, e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        let Ok(oid) = name.parse::<u32>() else {
            continue;
        };
        let link = ent.path();
        let target = fs::read_link(&link).map_err(|e| Error::io("read link", &link, e))?;
        links.push(TablespaceLink { oid, target });
    }
    links.sort_by_key(|t| t.oid);
    for t in &links {
        let base = format!("pg_tblspc/{}", t.oid);
        l.dirs.push((base.clone(), 0o700));
        let vdir = t.target.join(tablespace_dir);
        if vdir.is_dir() {
            walk(
                &vdir,
                &format!("{base}/{tablespace_dir}"),
                version_num,
                checksums,
                &mut l,
            )?;
        }
    }
    l.tablespaces = links;
    Ok(l)
}

fn walk(dir: &Path, rel: &str, version_num: u32, checksums: bool, l: &mut Listing) -> Result<()> {
    if !rel.is_empty() {
        let mode = fs::metadata(dir)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o700);
        l.dirs.push((rel.to_string(), mode));
    }
    let mut entries: Vec<(String, PathBuf)> = Vec::new();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !rel.is_empty() => return Ok(()),
        Err(e) => return Err(Error::io("list", dir, e)),
    };
    for ent in rd {
        let ent = ent.map_err(|e| Error::io("list", dir, e))?;
        let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
            return Err(Error::Unsafe(format!(
                "{} has a name that is not valid UTF-8; pgjet cannot record it faithfully",
                ent.path().display()
            )));
        };
        entries.push((name, ent.path()));
    }
    entries.sort();
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    let is_db_dir = is_database_dir(rel);
    let skip_rel = if is_db_dir {
        exclude::excluded_relation_files(&names)
    } else {
        Default::default()
    };
    for (name, abs) in &entries {
        let child = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if rel.is_empty() && name == "pg_tblspc" {
            l.dirs.push((child, 0o700));
            continue;
        }
        let meta = match fs::symlink_metadata(abs) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("stat", abs, e)),
        };
        let ft = meta.file_type();
        // pg_wal may be a symlink to another disk (initdb -X): follow it like a directory.
        let is_dir = ft.is_dir() || (ft.is_symlink() && abs.is_dir() && child == "pg_wal");
        if ft.is_symlink() && !is_dir {
            tracing::warn!("skipping symbolic link {child}");
            continue;
        }
        match exclude::classify(&child, is_dir, version_num) {
            Decision::Exclude => continue,
            Decision::IncludeDirOnly => {
                if is_dir {
                    l.dirs
                        .push((child.clone(), meta.permissions().mode() & 0o7777));
                    // Keep the directories PostgreSQL expects inside (e.g. pg_wal/archive_status).
                    if let Ok(rd) = fs::read_dir(abs) {
                        let mut subs: Vec<String> = rd
                            .flatten()
                            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                            .map(|e| format!("{child}/{}", e.file_name().to_string_lossy()))
                            .filter(|s| {
                                exclude::classify(s, true, version_num) != Decision::Exclude
                            })
                            .collect();
                        // basebackup.c sends these even when they are missing.
                        if child == "pg_wal" {
                            for d in ["pg_wal/archive_status", "pg_wal/summaries"] {
                                if exclude::classify(d, true, version_num) != Decision::Exclude
                                    && !subs.iter().any(|s| s == d)
                                {
                                    subs.push(d.to_string());
                                }
                            }
                        }
                        subs.sort();
                        l.dirs.extend(subs.into_iter().map(|s| (s, 0o700)));
                    }
                }
                continue;
            }
            Decision::Include => {}
        }
        if is_dir {
            walk(abs, &child, version_num, checksums, l)?;
        } else if ft.is_file() {
            if skip_rel.contains(name.as_str()) {
                continue;
            }
            let checksum_segno = if checksums && exclude::is_checksummed_file(&child) {
                exclude::relation_segment_number(name)
            } else {
                None
            };
            l.files.push(ListedFile {
                rel: child,
                abs: abs.clone(),
                size: meta.len(),
                mtime: meta.mtime(),
                mode: meta.permissions().mode() & 0o7777,
                checksum_segno,
            });
        }
    }
    Ok(())
}

/// True for `base/<oid>` and `pg_tblspc/<oid>/<version dir>/<oid>`: directories holding
/// relation files, where temporary and unlogged relations are sorted out.
fn is_database_dir(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match parts.as_slice() {
        ["base", db] => num(db),
        ["pg_tblspc", ts, _ver, db] => num(ts) && num(db),
        _ => false,
    }
}
