//! Which files and directories of a data directory a backup copies, skips, or keeps
//! empty, and which files carry page checksums: the rules of PostgreSQL's
//! `src/backend/backup/basebackup.c` (`excludeDirContents`, `excludeFiles`, `sendDir`,
//! `sendTablespace`, `is_checksummed_file` / `verify_page_checksum`) for PostgreSQL 15
//! to 18, with relation file names parsed as in
//! `src/backend/storage/file/reinit.c` (`parse_filename_for_nontemp_relation`) and
//! `src/backend/storage/file/fd.c` (`looks_like_temp_rel_name`).
//!
//! Paths are relative to the data directory, `/`-separated, without a leading `./`
//! (e.g. `base/5/16384`, `pg_tblspc/16384/PG_15_202209061/5/16385`).

use std::collections::HashSet;

/// What a backup does with one directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Copy the file, or copy the directory and walk into it.
    Include,
    /// Skip the entry entirely (and, for a directory, everything below it).
    Exclude,
    /// Keep the directory itself (so it exists, with its permissions, after restore) but
    /// skip everything in it; e.g. `pg_wal`, `pg_replslot`, `pg_stat_tmp`.
    IncludeDirOnly,
}

/// Prefix of temporary files and of temporary-file directories (`PG_TEMP_FILE_PREFIX`
/// and `PG_TEMP_FILES_DIR`, both `pgsql_tmp`; `src/include/common/file_utils.h`).
pub const PG_TEMP_FILE_PREFIX: &str = "pgsql_tmp";

/// Directories whose contents PostgreSQL removes or rebuilds at startup; the backup keeps
/// them empty (`excludeDirContents` in basebackup.c, identical in 15..18). Matched
/// against the entry's own name at any depth, as basebackup.c does.
pub const EXCLUDE_DIR_CONTENTS: &[&str] = &[
    "pg_stat_tmp",
    "pg_replslot",
    "pg_dynshmem",
    "pg_notify",
    "pg_serial",
    "pg_snapshots",
    "pg_subtrans",
];

/// Files never copied (`excludeFiles` in basebackup.c, identical in 15..18): `(name,
/// match_prefix)`. Matched against the entry's own name at any depth; with
/// `match_prefix` any name starting with it matches (`pg_internal.init.1234` too).
pub const EXCLUDE_FILES: &[(&str, bool)] = &[
    ("postgresql.auto.conf.tmp", false),
    ("current_logfiles.tmp", false),
    ("pg_internal.init", true),
    ("backup_label", false),
    ("tablespace_map", false),
    ("backup_manifest", false),
    ("postmaster.pid", false),
    ("postmaster.opts", false),
];

/// Fork name suffixes allowed after `_` in a relation file name, i.e. every fork but
/// `main` (`forkNames[1..]` in `src/common/relpath.c`).
const FORK_SUFFIXES: &[&str] = &["fsm", "vm", "init"];

/// Longest relation number in a file name, in digits (`RELNUMBERCHARS` = `OIDCHARS`,
/// `src/include/common/relpath.h`).
const RELNUMBERCHARS: usize = 10;

/// The parts of a non-temporary relation file name `<relnumber>[_<fork>][.<segno>]`.
struct RelFileName<'a> {
    relnumber: &'a str,
    fork: Option<&'a str>,
    segno: Option<&'a str>,
}

/// Number of leading ASCII digits of `s`.
fn leading_digits(s: &str) -> usize {
    s.bytes().take_while(|b| b.is_ascii_digit()).count()
}

/// Parses `[_<fork>][.<segno>]` and requires the end of the name after it.
fn parse_fork_and_segment(rest: &str) -> Option<(Option<&str>, Option<&str>)> {
    let mut rest = rest;
    let mut fork = None;
    if let Some(after) = rest.strip_prefix('_') {
        let f = FORK_SUFFIXES.iter().find(|f| after.starts_with(**f))?;
        fork = Some(&after[..f.len()]);
        rest = &after[f.len()..];
    }
    let mut segno = None;
    if let Some(after) = rest.strip_prefix('.') {
        let n = leading_digits(after);
        if n == 0 {
            return None;
        }
        segno = Some(&after[..n]);
        rest = &after[n..];
    }
    rest.is_empty().then_some((fork, segno))
}

/// `parse_filename_for_nontemp_relation` (reinit.c): 1 to 10 digits, optional
/// `_fsm`/`_vm`/`_init`, optional `.<digits>`, nothing else.
fn parse_nontemp_relation(name: &str) -> Option<RelFileName<'_>> {
    let n = leading_digits(name);
    if n == 0 || n > RELNUMBERCHARS {
        return None;
    }
    let (fork, segno) = parse_fork_and_segment(&name[n..])?;
    Some(RelFileName {
        relnumber: &name[..n],
        fork,
        segno,
    })
}

/// `looks_like_temp_rel_name` (fd.c): `t<digits>_<digits>[_<fork>][.<digits>]`, the files
/// of temporary tables (`t<backend id>_<relnumber>`).
pub fn looks_like_temp_rel_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('t') else {
        return false;
    };
    let n = leading_digits(rest);
    if n == 0 {
        return false;
    }
    let Some(rest) = rest[n..].strip_prefix('_') else {
        return false;
    };
    let m = leading_digits(rest);
    if m == 0 {
        return false;
    }
    parse_fork_and_segment(&rest[m..]).is_some()
}

/// Segment number of a relation file: `"16384"` -> `Some(0)`, `"16384.3"` -> `Some(3)`,
/// `"16384_fsm.1"` -> `Some(1)`. `None` when the name is not a (non-temporary) relation
/// file name as `parse_filename_for_nontemp_relation` (reinit.c) defines it, or when
/// the segment number is `0` or does not fit a u32 (PostgreSQL never writes `.0`;
/// basebackup.c of 15/16 rejects it as "invalid segment number 0"). If given a path,
/// only the part after the last `/` is looked at.
///
/// The checksum block number of block `i` of the file is `segno * RELSEG_SIZE + i`.
pub fn relation_segment_number(file_name: &str) -> Option<u32> {
    let name = file_name.rsplit('/').next().unwrap_or(file_name);
    let rel = parse_nontemp_relation(name)?;
    match rel.segno {
        None => Some(0),
        Some(digits) => match digits.parse::<u32>() {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
    }
}

/// Major version (15, 16, ...) of a `server_version_num` such as 150020.
fn major_of(pg_version_num: u32) -> u32 {
    pg_version_num / 10000
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// True when the directory `components` (already split) is a database directory that can
/// hold relation files: `base/<digits>` or `pg_tblspc/<oid>/PG_<..>/<digits>`.
fn is_db_dir(components: &[&str]) -> bool {
    match components {
        ["base", db] => all_digits(db),
        ["pg_tblspc", _, ver, db] => ver.starts_with("PG_") && all_digits(db),
        _ => false,
    }
}

/// What a backup does with `rel_path` (see the module doc for the path form; `is_dir`
/// says whether the entry is a directory, or a symlink to one under `pg_tblspc`).
/// `pg_version_num` is `server_version_num` (150000..=189999 supported).
///
/// Rules, from basebackup.c `sendDir`/`sendTablespace`, checked on the entry's own name
/// at any depth unless stated:
/// - names starting with `pgsql_tmp` (temporary files and directories) -> `Exclude`;
/// - `.DS_Store` (macOS Finder files) -> `Exclude`. Added to basebackup.c in 17 and
///   back-patched: PostgreSQL 15.20 skips it too (checked against a real
///   `pg_basebackup`), and skipping it is harmless on older minors;
/// - [`EXCLUDE_FILES`] (`postmaster.pid`, `backup_label`, `pg_internal.init*`, ...)
///   -> `Exclude`;
/// - in a database directory (`base/<db>`, `pg_tblspc/<oid>/PG_*/<db>`): temporary
///   relation files `t<n>_<n>...` -> `Exclude`;
/// - [`EXCLUDE_DIR_CONTENTS`] directories -> `IncludeDirOnly`, anything below them
///   -> `Exclude`;
/// - `pg_wal` -> `IncludeDirOnly`; `pg_wal/archive_status` and (17+) `pg_wal/summaries`
///   -> `IncludeDirOnly`; anything else below `pg_wal` -> `Exclude`. basebackup.c
///   writes these directories even when they do not exist, so a restore should create
///   them regardless;
/// - inside `pg_tblspc/<oid>/` only this version's `PG_<major>_<catversion>` directory
///   is copied (other entries, e.g. another major version's directory left by
///   pg_upgrade, -> `Exclude`);
/// - everything else -> `Include`. `global/pg_control` is `Include`, but basebackup.c
///   copies it *last*, after every other file, and so should the caller.
///
/// Unlogged relations need the sibling names and are decided by
/// [`excluded_relation_files`].
pub fn classify(rel_path: &str, is_dir: bool, pg_version_num: u32) -> Decision {
    let rel_path = rel_path.trim_start_matches("./").trim_end_matches('/');
    if rel_path.is_empty() || rel_path == "." {
        return Decision::Include;
    }
    let components: Vec<&str> = rel_path.split('/').collect();
    // Ancestors first: a directory whose contents are skipped hides everything below it.
    for (depth, comp) in components.iter().enumerate() {
        let is_last = depth + 1 == components.len();
        let entry_is_dir = if is_last { is_dir } else { true };
        let parents = &components[..depth];
        match entry_decision(comp, parents, entry_is_dir, pg_version_num) {
            Decision::Exclude => return Decision::Exclude,
            Decision::IncludeDirOnly if !is_last => {
                return inside_dir_only(parents, comp, &components[depth + 1..], pg_version_num);
            }
            Decision::IncludeDirOnly => return Decision::IncludeDirOnly,
            Decision::Include => {}
        }
    }
    Decision::Include
}

/// Decision for an entry below a directory that is kept empty. Only `pg_wal` has
/// sub-directories that are kept (themselves empty).
fn inside_dir_only(parents: &[&str], dir: &str, below: &[&str], pg_version_num: u32) -> Decision {
    if parents.is_empty() && dir == "pg_wal" && below.len() == 1 {
        let keep = below[0] == "archive_status"
            || (below[0] == "summaries" && major_of(pg_version_num) >= 17);
        if keep {
            return Decision::IncludeDirOnly;
        }
    }
    Decision::Exclude
}

/// Decision for one entry `name` whose parent directories are `parents`, ignoring
/// anything deeper.
fn entry_decision(name: &str, parents: &[&str], is_dir: bool, pg_version_num: u32) -> Decision {
    if name.starts_with(PG_TEMP_FILE_PREFIX) {
        return Decision::Exclude;
    }
    if name == ".DS_Store" {
        return Decision::Exclude;
    }
    let excluded_file = EXCLUDE_FILES.iter().any(|(pattern, prefix)| {
        if *prefix {
            name.starts_with(pattern)
        } else {
            name == *pattern
        }
    });
    if excluded_file {
        return Decision::Exclude;
    }
    if is_db_dir(parents) && looks_like_temp_rel_name(name) {
        return Decision::Exclude;
    }
    if EXCLUDE_DIR_CONTENTS.contains(&name) {
        // basebackup.c writes a directory entry for it; a plain file of that name has no
        // sensible meaning, skip it.
        return if is_dir {
            Decision::IncludeDirOnly
        } else {
            Decision::Exclude
        };
    }
    if parents.is_empty() && name == "pg_wal" {
        return Decision::IncludeDirOnly;
    }
    // pg_tblspc/<oid>/<entry>: only this version's PG_<major>_<catversion> directory.
    if let ["pg_tblspc", _oid] = parents {
        let prefix = format!("PG_{}_", major_of(pg_version_num));
        if !(is_dir && name.starts_with(&prefix)) {
            return Decision::Exclude;
        }
    }
    Decision::Include
}

/// Given every file name in one database directory (`base/<oid>` or a tablespace's
/// `PG_*/<oid>`), the names a backup skips (basebackup.c `sendDir`):
/// - temporary relations, `t<digits>_<digits>[_<fork>][.<segno>]`;
/// - every fork and segment of an unlogged relation except its `_init` fork: a relation
///   number `N` is unlogged when `N_init` is among the names; then `N`, `N.1`, `N_fsm`,
///   `N_vm`, ... are skipped and `N_init` (and `N_init.<segno>`) kept. Restore recreates
///   the main fork from the init fork (PostgreSQL does so at startup, reinit.c).
///
/// Names that match none of these (including non-relation files) are not returned.
pub fn excluded_relation_files(db_dir_file_names: &[&str]) -> HashSet<String> {
    let names: HashSet<&str> = db_dir_file_names.iter().copied().collect();
    let mut out = HashSet::new();
    for &name in db_dir_file_names {
        if looks_like_temp_rel_name(name) {
            out.insert(name.to_string());
            continue;
        }
        if let Some(rel) = parse_nontemp_relation(name) {
            if rel.fork != Some("init")
                && names.contains(format!("{}_init", rel.relnumber).as_str())
            {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// True when pages of the file at `rel_path` carry data checksums a backup should
/// verify: a non-temporary relation file (see [`relation_segment_number`]) directly in
/// `global/`, `base/<db>/` or `pg_tblspc/<oid>/PG_*/<db>/`.
///
/// This is PostgreSQL 17's rule (basebackup.c verifies only relation files). PostgreSQL
/// 15/16 verified every file in those directories except `pg_control`,
/// `pg_filenode.map`, `pg_internal.init*` and `PG_VERSION` (`noChecksumFiles`); on a
/// normal cluster both rules select the same files, and the 17 rule does not report
/// false failures for stray non-relation files.
pub fn is_checksummed_file(rel_path: &str) -> bool {
    let rel_path = rel_path.trim_start_matches("./");
    let components: Vec<&str> = rel_path.split('/').collect();
    let Some((name, dir)) = components.split_last() else {
        return false;
    };
    let relation_dir = matches!(dir, ["global"]) || is_db_dir(dir);
    relation_dir && relation_segment_number(name).is_some()
}

/// True for a segment of a relation's main fork (`<relnumber>` or `<relnumber>.<segno>`,
/// no `_fsm`, `_vm` or `_init`) in `global/` or a database directory: the files whose
/// pages carry an LSN that every WAL-logged change sets (a differential or incremental
/// backup compares them block by block; see `crate::repo::incremental`).
pub fn is_main_fork_file(rel_path: &str) -> bool {
    let name = rel_path.rsplit('/').next().unwrap_or(rel_path);
    is_checksummed_file(rel_path) && parse_nontemp_relation(name).is_some_and(|r| r.fork.is_none())
}

/// The database OID of a file inside a database directory (`base/<db>/...` or
/// `pg_tblspc/<spc>/PG_<ver>/<db>/...`); None elsewhere (`global/`, SLRUs, configuration).
pub fn database_of(rel_path: &str) -> Option<u32> {
    let components: Vec<&str> = rel_path.split('/').collect();
    let dir = components.split_last()?.1;
    if !is_db_dir(dir) {
        return None;
    }
    dir.last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::*;

    #[test]
    fn database_of_paths() {
        assert_eq!(database_of("base/5/16384"), Some(5));
        assert_eq!(
            database_of("pg_tblspc/16390/PG_15_202209061/16401/16402.1"),
            Some(16401)
        );
        assert_eq!(database_of("global/1262"), None);
        assert_eq!(database_of("pg_xact/0000"), None);
        assert_eq!(database_of("base/pgsql_tmp/x"), None);
    }

    #[test]
    fn main_fork_files() {
        for yes in [
            "base/5/16384",
            "base/5/16384.2",
            "global/1262",
            "pg_tblspc/1/PG_15_2/5/16390",
        ] {
            assert!(is_main_fork_file(yes), "{yes}");
        }
        for no in [
            "base/5/16384_fsm",
            "base/5/16384_vm.1",
            "base/5/16384_init",
            "base/5/PG_VERSION",
            "pg_xact/0000",
            "base/5/t3_16384",
        ] {
            assert!(!is_main_fork_file(no), "{no}");
        }
    }

    const V15: u32 = 150020;
    const V16: u32 = 160004;
    const V17: u32 = 170002;
    const V18: u32 = 180006;
    const ALL: [u32; 4] = [V15, V16, V17, V18];

    #[test]
    fn ordinary_files_are_included() {
        for v in ALL {
            for (p, d) in [
                ("", true),
                ("PG_VERSION", false),
                ("postgresql.conf", false),
                ("postgresql.auto.conf", false),
                ("pg_hba.conf", false),
                ("base", true),
                ("base/5", true),
                ("base/5/16384", false),
                ("base/5/16384_fsm", false),
                ("base/5/pg_filenode.map", false),
                ("global", true),
                ("global/1262", false),
                ("global/pg_control", false),
                ("pg_xact", true),
                ("pg_xact/0000", false),
                ("pg_multixact/offsets/0000", false),
                ("pg_logical/replorigin_checkpoint", false),
                ("pg_stat", true),
                ("pg_stat/pgstat.stat", false),
                ("current_logfiles", false),
                ("log/postgresql.log", false),
                ("pg_tblspc", true),
                ("postmaster.opts.bak", false),
            ] {
                assert_eq!(classify(p, d, v), Include, "{p} on {v}");
            }
        }
    }

    #[test]
    fn exclude_files_at_any_depth() {
        for v in ALL {
            for p in [
                "postmaster.pid",
                "postmaster.opts",
                "backup_label",
                "tablespace_map",
                "backup_manifest",
                "postgresql.auto.conf.tmp",
                "current_logfiles.tmp",
                "global/pg_internal.init",
                "global/pg_internal.init.4242",
                "global/pg_internal.initx",
                "base/5/pg_internal.init",
                "pg_tblspc/16384/PG_15_202209061/5/pg_internal.init",
                "somedir/backup_label",
            ] {
                assert_eq!(classify(p, false, v), Exclude, "{p} on {v}");
            }
        }
        // Exact names only for non-prefix entries.
        assert_eq!(classify("backup_label.old", false, V15), Include);
        assert_eq!(classify("postmaster.pidx", false, V15), Include);
    }

    #[test]
    fn temp_files_and_dirs_anywhere() {
        for v in ALL {
            for (p, d) in [
                ("base/pgsql_tmp", true),
                ("base/pgsql_tmp/pgsql_tmp1234.0", false),
                ("base/5/pgsql_tmp", true),
                ("pgsql_tmp_foo", false),
                ("pgsql_tmpdir/x", false),
                ("pg_tblspc/16384/PG_16_202307071/pgsql_tmp", true),
            ] {
                assert_eq!(classify(p, d, v), Exclude, "{p} on {v}");
            }
        }
    }

    #[test]
    fn ds_store_everywhere() {
        for v in ALL {
            assert_eq!(classify(".DS_Store", false, v), Exclude);
            assert_eq!(classify("base/5/.DS_Store", false, v), Exclude);
        }
    }

    #[test]
    fn dir_contents_excluded() {
        for v in ALL {
            for d in EXCLUDE_DIR_CONTENTS {
                assert_eq!(classify(d, true, v), IncludeDirOnly, "{d}");
                assert_eq!(classify(&format!("{d}/somefile"), false, v), Exclude, "{d}");
                assert_eq!(classify(&format!("{d}/sub"), true, v), Exclude, "{d}");
                assert_eq!(classify(&format!("{d}/sub/x"), false, v), Exclude, "{d}");
            }
            assert_eq!(classify("pg_replslot/myslot/state", false, v), Exclude);
            assert_eq!(classify("pg_subtrans/0000", false, v), Exclude);
            // Names are matched at any depth, as basebackup.c compares d_name.
            assert_eq!(classify("pg_logical/pg_snapshots", true, v), IncludeDirOnly);
        }
    }

    #[test]
    fn pg_wal_rules() {
        for v in ALL {
            assert_eq!(classify("pg_wal", true, v), IncludeDirOnly);
            assert_eq!(
                classify("pg_wal/000000010000000000000001", false, v),
                Exclude
            );
            assert_eq!(classify("pg_wal/00000002.history", false, v), Exclude);
            assert_eq!(classify("pg_wal/archive_status", true, v), IncludeDirOnly);
            assert_eq!(
                classify(
                    "pg_wal/archive_status/000000010000000000000001.done",
                    false,
                    v
                ),
                Exclude
            );
            assert_eq!(
                classify(
                    "pg_wal/summaries/0000000100000000010000280000000001000100.summary",
                    false,
                    v
                ),
                Exclude
            );
            assert_eq!(classify("pg_wal/other", true, v), Exclude);
            // Only the top-level pg_wal.
            assert_eq!(classify("base/pg_wal", true, v), Include);
        }
        assert_eq!(classify("pg_wal/summaries", true, V15), Exclude);
        assert_eq!(classify("pg_wal/summaries", true, V16), Exclude);
        assert_eq!(classify("pg_wal/summaries", true, V17), IncludeDirOnly);
        assert_eq!(classify("pg_wal/summaries", true, V18), IncludeDirOnly);
    }

    #[test]
    fn tablespaces() {
        assert_eq!(classify("pg_tblspc/16384", true, V15), Include);
        assert_eq!(
            classify("pg_tblspc/16384/PG_15_202209061", true, V15),
            Include
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_15_202209061/5", true, V15),
            Include
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_15_202209061/5/16385", false, V15),
            Include
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_15_202209061/5/16385_vm.2", false, V15),
            Include
        );
        // Another major version's directory (left by pg_upgrade) and stray files.
        assert_eq!(
            classify("pg_tblspc/16384/PG_14_202107181", true, V15),
            Exclude
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_14_202107181/5/16385", false, V15),
            Exclude
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_18_202506291", true, V18),
            Include
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_18_202506291", true, V17),
            Exclude
        );
        assert_eq!(classify("pg_tblspc/16384/README", false, V15), Exclude);
        // Temporary relations in a tablespace database directory.
        assert_eq!(
            classify("pg_tblspc/16384/PG_15_202209061/5/t3_16390", false, V15),
            Exclude
        );
        assert_eq!(
            classify("pg_tblspc/16384/PG_15_202209061/5/t3_16390_fsm", false, V15),
            Exclude
        );
    }

    #[test]
    fn temp_relations_only_in_db_dirs() {
        for v in ALL {
            assert_eq!(classify("base/5/t3_16390", false, v), Exclude);
            assert_eq!(classify("base/5/t12_5.1", false, v), Exclude);
            assert_eq!(classify("base/5/t3_16390_init", false, v), Exclude);
            assert_eq!(classify("global/t3_16390", false, v), Include);
            assert_eq!(classify("t3_16390", false, v), Include);
            assert_eq!(classify("base/5/t3_", false, v), Include);
        }
    }

    #[test]
    fn temp_rel_names() {
        for yes in ["t3_16390", "t12_5.1", "t1_2_fsm", "t1_2_vm.3", "t1_2_init"] {
            assert!(looks_like_temp_rel_name(yes), "{yes}");
        }
        for no in [
            "t_1",
            "t1_",
            "t1",
            "3_16390",
            "t1_2_main",
            "t1_2_fsmx",
            "t1_2.",
            "t1_2.x",
            "tx_1",
            "t1_2_",
        ] {
            assert!(!looks_like_temp_rel_name(no), "{no}");
        }
    }

    #[test]
    fn unlogged_and_temp_in_db_dir() {
        let names = [
            "16384",
            "16384_fsm",
            "16384_vm",
            "16384.1", // logged
            "16391",
            "16391_fsm",
            "16391.1",
            "16391_vm",
            "16391_init",
            "16391_init.1", // unlogged
            "t3_99999",
            "t3_99999_fsm",
            "PG_VERSION",
            "pg_filenode.map",
            "pg_internal.init",
        ];
        let ex = excluded_relation_files(&names);
        let mut got: Vec<&str> = ex.iter().map(|s| s.as_str()).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                "16391",
                "16391.1",
                "16391_fsm",
                "16391_vm",
                "t3_99999",
                "t3_99999_fsm"
            ]
        );
        assert!(excluded_relation_files(&[]).is_empty());
        // An init fork alone is kept.
        assert!(excluded_relation_files(&["5_init"]).is_empty());
    }

    #[test]
    fn segment_numbers() {
        assert_eq!(relation_segment_number("16384"), Some(0));
        assert_eq!(relation_segment_number("16384.3"), Some(3));
        assert_eq!(relation_segment_number("16384_fsm.1"), Some(1));
        assert_eq!(relation_segment_number("16384_vm"), Some(0));
        assert_eq!(relation_segment_number("16384_init"), Some(0));
        assert_eq!(relation_segment_number("base/5/16384.12"), Some(12));
        assert_eq!(
            relation_segment_number("4294967295.4294967295"),
            Some(u32::MAX)
        );
        for no in [
            "",
            "PG_VERSION",
            "pg_filenode.map",
            "pg_internal.init",
            "t3_16384",
            "16384_main",
            "16384.0",
            "16384.",
            "16384.x",
            "16384_fsm_vm",
            "12345678901",
            "16384.99999999999",
            ".DS_Store",
            "16384 ",
        ] {
            assert_eq!(relation_segment_number(no), None, "{no:?}");
        }
    }

    #[test]
    fn checksummed_files() {
        for yes in [
            "global/1262",
            "global/1262_fsm",
            "base/5/16384",
            "base/5/16384.1",
            "base/1/2606_vm",
            "pg_tblspc/16384/PG_15_202209061/5/16385",
            "./base/5/16384",
        ] {
            assert!(is_checksummed_file(yes), "{yes}");
        }
        for no in [
            "global/pg_control",
            "global/pg_filenode.map",
            "global/pg_internal.init",
            "base/5/PG_VERSION",
            "base/5/pg_filenode.map",
            "base/5/pg_internal.init",
            "base/5/t3_16384",
            "base/5/.DS_Store",
            "base/16384",
            "pg_xact/0000",
            "16384",
            "pg_tblspc/16384/PG_15_202209061/16385",
            "base/5/pgsql_tmp/16384",
            "pg_multixact/members/0000",
        ] {
            assert!(!is_checksummed_file(no), "{no}");
        }
    }
}
