//! Walking a data directory the way PostgreSQL's base backup does (see
//! src/backend/backup/basebackup.c): which directories and files are copied, which are
//! skipped ([`crate::pg::exclude`]), and where the tablespaces are.
//!
//! The walk does not care where the directory is: it asks a [`DirLister`] for the entries of
//! whole levels of directories at once (breadth first), so a lister on the other side of a
//! network pays one round trip per level of depth (about six for a data directory), not one
//! per directory. [`LocalLister`] reads this host's filesystem.
use crate::error::{Error, Result};
use crate::pg::exclude::{self, Decision};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file of the listing, as the engine copies it (the listing of a million files is
/// handed to the engine without a copy).
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Path relative to the data directory, as recorded in the manifest and as the
    /// [`Source`] reads it. Boxed (16 bytes, no spare capacity): a listing holds a million.
    pub path: Box<str>,
    /// Size in bytes seen when the file list was made; bytes past it are not copied (WAL
    /// replay recreates them) and a shorter file is padded with zeros (basebackup.c does the same).
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: i64,
    /// Permission bits.
    pub mode: u32,
    /// For relation files of a cluster with data checksums: the segment number (the `.N`
    /// suffix), used to compute block numbers. None: no page checks.
    pub checksum_segno: Option<u32>,
}

impl SourceFile {
    /// A file of `size` bytes without page checks, mode 0600 and no modification time: WAL
    /// segments, pg_control, test files.
    pub fn plain(path: &str, size: u64) -> SourceFile {
        SourceFile {
            path: path.into(),
            size,
            mtime: 0,
            mode: 0o600,
            checksum_segno: None,
        }
    }
}

/// The permission bits PostgreSQL gives the directories and files of a cluster: 0700/0600,
/// or 0750/0640 when the cluster allows group access (`initdb -g`, data_directory_mode
/// 0750). The data directory's own mode decides: group access when it has the bits of 0750
/// (SetDataDirectoryCreatePerm in src/common/file_perm.c; PG_DIR_MODE_GROUP and
/// PG_FILE_MODE_GROUP in src/include/common/file_perm.h). PostgreSQL starts only on a data
/// directory of mode 0700 or 0750 (checkDataDir, src/backend/utils/init/miscinit.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDirModes {
    /// Mode of a directory: 0700 or 0750.
    pub dir: u32,
    /// Mode of a file: 0600 or 0640.
    pub file: u32,
}

impl DataDirModes {
    /// Owner access only: 0700/0600 (PostgreSQL's default).
    pub const OWNER: DataDirModes = DataDirModes {
        dir: 0o700,
        file: 0o600,
    };
    /// Group access: 0750/0640.
    pub const GROUP: DataDirModes = DataDirModes {
        dir: 0o750,
        file: 0o640,
    };

    /// The modes of a cluster whose data directory has permission bits `mode`.
    pub fn of_mode(mode: u32) -> DataDirModes {
        if mode & 0o750 == 0o750 {
            DataDirModes::GROUP
        } else {
            DataDirModes::OWNER
        }
    }

    /// The modes of the cluster whose directories are `dirs` (relative path, mode), as a
    /// [`Listing`] or a backup's manifest records them: those of its `global` directory,
    /// which initdb creates with the data directory's mode (a listing has no entry for the
    /// data directory itself). [`DataDirModes::OWNER`] when `global` is missing.
    pub fn of_listing(dirs: &[(String, u32)]) -> DataDirModes {
        dirs.iter()
            .find(|(p, _)| p == "global")
            .map(|(_, m)| DataDirModes::of_mode(*m))
            .unwrap_or(DataDirModes::OWNER)
    }

    /// The modes of the data directory `pg_path` on this host, from its mode (as PostgreSQL
    /// decides when it starts). Errors: [`Error::Io`] when it cannot be read.
    pub fn of_dir(pg_path: &Path) -> Result<DataDirModes> {
        let meta = fs::metadata(pg_path).map_err(|e| Error::io("stat", pg_path, e))?;
        Ok(DataDirModes::of_mode(meta.permissions().mode()))
    }
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
    pub files: Vec<SourceFile>,
    pub tablespaces: Vec<TablespaceLink>,
}

/// What kind of entry a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    /// A symbolic link that is not followed (only `pg_wal` and `pg_tblspc/<oid>` are).
    Symlink,
    /// A socket, FIFO or device: never copied.
    Other,
}

/// One entry of a listed directory.
#[derive(Debug, Clone)]
pub struct Entry {
    /// File name (no '/').
    pub name: Box<str>,
    pub kind: EntryKind,
    /// Bytes (files).
    pub size: u64,
    /// Unix seconds.
    pub mtime: i64,
    /// Permission bits.
    pub mode: u32,
}

/// Lists directories of a data directory, wherever it is.
pub trait DirLister {
    /// Lists each of `dirs` (relative to the data directory, "" for the data directory
    /// itself). A directory that no longer exists gives None (PostgreSQL removed it; WAL
    /// replay agrees). `pg_wal` given as a symbolic link to a directory is listed as a
    /// directory; so are `pg_tblspc/<oid>` links when asked for their contents.
    ///
    /// Errors: a directory that exists but cannot be read; a name that is not UTF-8.
    fn list_dirs(&self, dirs: &[String]) -> Result<Vec<Option<Vec<Entry>>>>;
}

/// Lists a data directory on this host.
pub struct LocalLister<'a> {
    pub pgdata: &'a Path,
}

impl DirLister for LocalLister<'_> {
    fn list_dirs(&self, dirs: &[String]) -> Result<Vec<Option<Vec<Entry>>>> {
        dirs.iter().map(|d| self.list_one(d)).collect()
    }
}

/// A directory with at least this many entries has them stat'ed by [`LIST_THREADS`] threads:
/// a stat with a cold cache costs about 10 µs on this project's machine (100 000 files in
/// 1.07 s with `find`), so a database of a million relation files would take ~11 s on one.
const PARALLEL_STAT_MIN: usize = 2048;
/// Threads that stat the entries of one large directory.
const LIST_THREADS: usize = 4;

impl LocalLister<'_> {
    fn list_one(&self, rel: &str) -> Result<Option<Vec<Entry>>> {
        let dir = self.pgdata.join(rel);
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !rel.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(Error::io("list", &dir, e)),
        };
        // One vector of entries, named first and stat'ed in place (by several threads for a
        // large directory), so a million names are never held twice.
        let mut entries = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| Error::io("list", &dir, e))?;
            let Some(name) = ent.file_name().to_str().map(Box::<str>::from) else {
                return Err(Error::Unsafe(format!(
                    "{} has a name that is not valid UTF-8; pgjet cannot record it faithfully",
                    ent.path().display()
                )));
            };
            entries.push(Entry {
                name,
                kind: EntryKind::Other,
                size: 0,
                mtime: 0,
                mode: 0,
            });
        }
        entries.shrink_to_fit();
        // Fills each entry of `part`; true for those that vanished since they were listed.
        let stat_all = |part: &mut [Entry]| -> Result<Vec<bool>> {
            part.iter_mut().map(|e| stat_entry(&dir, rel, e)).collect()
        };
        let vanished: Vec<bool> = if entries.len() < PARALLEL_STAT_MIN {
            stat_all(&mut entries)?
        } else {
            let per = entries.len().div_ceil(LIST_THREADS);
            let results: Vec<Result<Vec<bool>>> = std::thread::scope(|s| {
                let handles: Vec<_> = entries
                    .chunks_mut(per)
                    .map(|part| s.spawn(move || stat_all(part)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Other(format!("listing {} failed", dir.display())))
                        })
                    })
                    .collect()
            });
            let mut all = Vec::with_capacity(entries.len());
            for r in results {
                all.extend(r?);
            }
            all
        };
        if vanished.contains(&true) {
            let mut gone = vanished.into_iter();
            entries.retain(|_| !gone.next().unwrap_or(false));
        }
        Ok(Some(entries))
    }
}

/// Fills `e` (named, in directory `dir`, `rel` inside the data directory) from a stat of
/// it; true when it vanished since it was listed.
fn stat_entry(dir: &Path, rel: &str, e: &mut Entry) -> Result<bool> {
    let abs = dir.join(&*e.name);
    let meta = match fs::symlink_metadata(&abs) {
        Ok(m) => m,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(err) => return Err(Error::io("stat", &abs, err)),
    };
    let ft = meta.file_type();
    // pg_wal may be a symlink to another disk (initdb -X): follow it like a directory.
    let (kind, meta) = if ft.is_symlink() && rel.is_empty() && &*e.name == "pg_wal" {
        match fs::metadata(&abs) {
            Ok(m) if m.is_dir() => (EntryKind::Dir, m),
            _ => (EntryKind::Symlink, meta),
        }
    } else if ft.is_symlink() {
        (EntryKind::Symlink, meta)
    } else if ft.is_dir() {
        (EntryKind::Dir, meta)
    } else if ft.is_file() {
        (EntryKind::File, meta)
    } else {
        (EntryKind::Other, meta)
    };
    e.kind = kind;
    e.size = meta.len();
    e.mtime = meta.mtime();
    e.mode = meta.permissions().mode() & 0o7777;
    Ok(false)
}

/// Reads the tablespace links in `<pgdata>/pg_tblspc` on this host, by OID.
pub fn local_tablespace_links(pgdata: &Path) -> Result<Vec<TablespaceLink>> {
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
    Ok(links)
}

/// Lists `pgdata` on this host (see [`walk`]).
pub fn list_data_directory(
    pgdata: &Path,
    version_num: u32,
    tablespace_dir: &str,
    checksums: bool,
) -> Result<Listing> {
    let links = local_tablespace_links(pgdata)?;
    walk(
        &LocalLister { pgdata },
        links,
        version_num,
        tablespace_dir,
        checksums,
    )
}

/// A directory waiting to be listed: its relative path and whether only its sub-directories
/// are kept (a directory whose contents the backup skips, see [`Decision::IncludeDirOnly`]).
struct Pending {
    rel: String,
    dirs_only: bool,
    /// Record the directory itself once it is found (a tablespace's version directory,
    /// which no parent listing names).
    record_self: bool,
}

/// Lists what a base backup copies, level by level through `lister`. `tablespaces` are the
/// cluster's tablespace links; `tablespace_dir` is the per-version directory inside each
/// (`PG_<major>_<catalog version>`, see TABLESPACE_VERSION_DIRECTORY in
/// src/include/catalog/catalog.h); only it is copied, as basebackup.c does.
/// `checksums`: whether the cluster has data checksums.
///
/// Files and directories that vanish while listing are skipped: PostgreSQL removed them and
/// WAL replay will agree. Errors: those of the lister.
pub fn walk(
    lister: &dyn DirLister,
    tablespaces: Vec<TablespaceLink>,
    version_num: u32,
    tablespace_dir: &str,
    checksums: bool,
) -> Result<Listing> {
    let mut l = Listing::default();
    // The cluster's directory mode, for the directories the walk records without having
    // seen them; known once the data directory's level is listed.
    let mut dir_mode = DataDirModes::OWNER.dir;
    let mut level = vec![Pending {
        rel: String::new(),
        dirs_only: false,
        record_self: false,
    }];
    let mut tablespaces_queued = false;
    while !level.is_empty() {
        let names: Vec<String> = level.iter().map(|p| p.rel.clone()).collect();
        let listed = lister.list_dirs(&names)?;
        let mut next = Vec::new();
        for (p, entries) in level.iter().zip(listed) {
            let Some(mut entries) = entries else {
                continue;
            };
            if p.record_self {
                l.dirs.push((p.rel.clone(), dir_mode));
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            if p.dirs_only {
                keep_subdirs(&p.rel, &entries, version_num, dir_mode, &mut l);
            } else {
                visit(&p.rel, entries, version_num, checksums, &mut l, &mut next);
            }
        }
        if !tablespaces_queued {
            // The tablespaces join the walk at the level below the data directory.
            tablespaces_queued = true;
            dir_mode = DataDirModes::of_listing(&l.dirs).dir;
            for t in &tablespaces {
                let base = format!("pg_tblspc/{}", t.oid);
                l.dirs.push((base.clone(), dir_mode));
                next.push(Pending {
                    rel: format!("{base}/{tablespace_dir}"),
                    dirs_only: false,
                    record_self: true,
                });
            }
        }
        level = next;
    }
    l.tablespaces = tablespaces;
    Ok(l)
}

/// Records the sub-directories PostgreSQL expects inside a directory whose contents are
/// skipped (e.g. pg_wal/archive_status), with their modes; one the source lacks gets
/// `dir_mode`, the cluster's.
fn keep_subdirs(rel: &str, entries: &[Entry], version_num: u32, dir_mode: u32, l: &mut Listing) {
    let mut subs: Vec<(String, u32)> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::Dir)
        .map(|e| (format!("{rel}/{}", e.name), e.mode))
        .filter(|(s, _)| exclude::classify(s, true, version_num) != Decision::Exclude)
        .collect();
    // basebackup.c sends these even when they are missing.
    if rel == "pg_wal" {
        for d in ["pg_wal/archive_status", "pg_wal/summaries"] {
            if exclude::classify(d, true, version_num) != Decision::Exclude
                && !subs.iter().any(|(s, _)| s == d)
            {
                subs.push((d.to_string(), dir_mode));
            }
        }
    }
    subs.sort();
    l.dirs.extend(subs);
}

/// Classifies the entries of one directory `rel`: files go to the listing, directories to
/// the listing and to `next`.
fn visit(
    rel: &str,
    entries: Vec<Entry>,
    version_num: u32,
    checksums: bool,
    l: &mut Listing,
    next: &mut Vec<Pending>,
) {
    let skip_rel = if is_database_dir(rel) {
        let names: Vec<&str> = entries.iter().map(|e| &*e.name).collect();
        exclude::excluded_relation_files(&names)
    } else {
        Default::default()
    };
    // Room for every file at once (no doubling: a database directory may hold a million).
    // The entries are taken from the end and their vector shrunk as it empties, so a
    // directory's entries and its listed files are not both whole in memory; the new tails
    // are put back in directory order below.
    l.files.reserve(entries.len());
    let (files_before, dirs_before, next_before) = (l.files.len(), l.dirs.len(), next.len());
    let mut entries = entries;
    let mut taken = 0usize;
    while let Some(e) = entries.pop() {
        taken += 1;
        if taken.is_multiple_of(SHRINK_EVERY) {
            entries.shrink_to_fit();
        }
        let child = if rel.is_empty() {
            e.name.to_string()
        } else {
            format!("{rel}/{}", e.name)
        };
        if rel.is_empty() && &*e.name == "pg_tblspc" {
            // Its entries are the tablespaces, walked on their own.
            l.dirs.push((child, e.mode));
            continue;
        }
        match e.kind {
            EntryKind::Symlink => {
                tracing::warn!("skipping symbolic link {child}");
                continue;
            }
            EntryKind::Other => continue,
            EntryKind::File | EntryKind::Dir => {}
        }
        let is_dir = e.kind == EntryKind::Dir;
        match exclude::classify(&child, is_dir, version_num) {
            Decision::Exclude => continue,
            Decision::IncludeDirOnly => {
                if is_dir {
                    l.dirs.push((child.clone(), e.mode));
                    next.push(Pending {
                        rel: child,
                        dirs_only: true,
                        record_self: false,
                    });
                }
                continue;
            }
            Decision::Include => {}
        }
        if is_dir {
            l.dirs.push((child.clone(), e.mode));
            next.push(Pending {
                rel: child,
                dirs_only: false,
                record_self: false,
            });
        } else {
            if skip_rel.contains(&*e.name) {
                continue;
            }
            let checksum_segno = if checksums && exclude::is_checksummed_file(&child) {
                exclude::relation_segment_number(&e.name)
            } else {
                None
            };
            l.files.push(SourceFile {
                path: child.into_boxed_str(),
                size: e.size,
                mtime: e.mtime,
                mode: e.mode,
                checksum_segno,
            });
        }
    }
    l.files[files_before..].reverse();
    l.dirs[dirs_before..].reverse();
    next[next_before..].reverse();
}

/// Entries of a directory taken between two shrinks of their vector in [`visit`] (about
/// 3 MiB of entries: few reallocations, and the memory follows the listing closely).
const SHRINK_EVERY: usize = 65536;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A data directory in memory: relative directory path -> entries.
    struct MemLister(BTreeMap<String, Vec<Entry>>, std::cell::RefCell<usize>);

    impl DirLister for MemLister {
        fn list_dirs(&self, dirs: &[String]) -> Result<Vec<Option<Vec<Entry>>>> {
            *self.1.borrow_mut() += 1;
            Ok(dirs.iter().map(|d| self.0.get(d).cloned()).collect())
        }
    }

    fn file(name: &str, size: u64) -> Entry {
        Entry {
            name: name.into(),
            kind: EntryKind::File,
            size,
            mtime: 7,
            mode: 0o600,
        }
    }
    fn dir(name: &str) -> Entry {
        Entry {
            name: name.into(),
            kind: EntryKind::Dir,
            size: 0,
            mtime: 7,
            mode: 0o700,
        }
    }

    #[test]
    fn walks_level_by_level_with_basebackup_rules() {
        let mut m = BTreeMap::new();
        m.insert(
            String::new(),
            vec![
                dir("base"),
                dir("global"),
                dir("pg_wal"),
                dir("pg_tblspc"),
                file("postmaster.pid", 10),
                file("PG_VERSION", 3),
            ],
        );
        m.insert("base".into(), vec![dir("5")]);
        m.insert(
            "base/5".into(),
            vec![
                file("16384", 8192),
                file("16390", 8192),
                file("16390_init", 0),
                file("t3_16400", 8192),
            ],
        );
        m.insert("global".into(), vec![file("pg_control", 8192)]);
        m.insert(
            "pg_wal".into(),
            vec![
                file("000000010000000000000001", 16 << 20),
                dir("archive_status"),
            ],
        );
        m.insert("pg_tblspc/16500/PG_15_1".into(), vec![dir("5")]);
        m.insert(
            "pg_tblspc/16500/PG_15_1/5".into(),
            vec![file("16501", 16384)],
        );
        let lister = MemLister(m, Default::default());
        let links = vec![TablespaceLink {
            oid: 16500,
            target: PathBuf::from("/ts"),
        }];
        let l = walk(&lister, links, 150000, "PG_15_1", true).unwrap();
        let files: Vec<(&str, Option<u32>)> = l
            .files
            .iter()
            .map(|f| (&*f.path, f.checksum_segno))
            .collect();
        assert_eq!(
            files,
            vec![
                ("PG_VERSION", None),
                ("global/pg_control", None),
                ("base/5/16384", Some(0)),
                ("base/5/16390_init", Some(0)),
                ("pg_tblspc/16500/PG_15_1/5/16501", Some(0)),
            ]
        );
        let dirs: Vec<&str> = l.dirs.iter().map(|d| d.0.as_str()).collect();
        for d in [
            "base",
            "base/5",
            "pg_wal",
            "pg_wal/archive_status",
            "pg_tblspc",
            "pg_tblspc/16500",
            "pg_tblspc/16500/PG_15_1",
            "pg_tblspc/16500/PG_15_1/5",
        ] {
            assert!(dirs.contains(&d), "{d} missing from {dirs:?}");
        }
        // One call per level of depth, not one per directory.
        assert_eq!(*lister.1.borrow(), 3);
    }

    #[test]
    fn a_cluster_with_group_access_records_its_directory_mode_everywhere() {
        let g = |name: &str| Entry {
            mode: 0o750,
            ..dir(name)
        };
        let mut m = BTreeMap::new();
        m.insert(
            String::new(),
            vec![g("base"), g("global"), g("pg_wal"), g("pg_tblspc")],
        );
        m.insert("base".into(), vec![]);
        m.insert("global".into(), vec![]);
        // pg_wal/archive_status is missing: recorded all the same, with the cluster's mode.
        m.insert("pg_wal".into(), vec![]);
        m.insert("pg_tblspc/16500/PG_15_1".into(), vec![g("5")]);
        m.insert("pg_tblspc/16500/PG_15_1/5".into(), vec![]);
        let links = vec![TablespaceLink {
            oid: 16500,
            target: PathBuf::from("/ts"),
        }];
        let l = walk(
            &MemLister(m, Default::default()),
            links,
            150000,
            "PG_15_1",
            true,
        )
        .unwrap();
        assert!(l.dirs.iter().any(|(p, _)| p == "pg_wal/archive_status"));
        assert!(l.dirs.iter().any(|(p, _)| p == "pg_tblspc/16500/PG_15_1"));
        for (p, mode) in &l.dirs {
            assert_eq!(*mode, 0o750, "{p}");
        }
        assert_eq!(DataDirModes::of_listing(&l.dirs), DataDirModes::GROUP);
    }

    #[test]
    fn data_directory_modes_follow_postgresql() {
        assert_eq!(DataDirModes::of_mode(0o700), DataDirModes::OWNER);
        assert_eq!(DataDirModes::of_mode(0o40750), DataDirModes::GROUP);
        assert_eq!(DataDirModes::of_mode(0o755), DataDirModes::GROUP);
        // Group read without search is not group access (file_perm.c wants both).
        assert_eq!(DataDirModes::of_mode(0o740), DataDirModes::OWNER);
        assert_eq!(DataDirModes::of_listing(&[]), DataDirModes::OWNER);
        let dirs = vec![("base".to_string(), 0o750), ("global".to_string(), 0o700)];
        assert_eq!(DataDirModes::of_listing(&dirs), DataDirModes::OWNER);
    }

    #[test]
    fn a_large_directory_is_listed_whole_by_several_threads() {
        let dir = tempfile::tempdir().unwrap();
        let n = PARALLEL_STAT_MIN * 2 + 7;
        for i in 0..n {
            std::fs::write(dir.path().join(format!("{i}")), vec![1u8; i % 10]).unwrap();
        }
        let l = LocalLister { pgdata: dir.path() };
        let got = l.list_one("").unwrap().unwrap();
        assert_eq!(got.len(), n);
        let mut names: Vec<usize> = got
            .iter()
            .map(|e| {
                let i: usize = e.name.parse().unwrap();
                assert_eq!((e.kind, e.size), (EntryKind::File, (i % 10) as u64));
                i
            })
            .collect();
        names.sort_unstable();
        assert_eq!(names, (0..n).collect::<Vec<_>>());
    }
}
