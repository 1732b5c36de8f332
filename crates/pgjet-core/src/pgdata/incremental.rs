//! A kept copy re-synced by PostgreSQL's own incremental `BASE_BACKUP` (17+): the copy is
//! described to the server as a prior backup ([`kept_manifest`], sent with
//! `UPLOAD_MANIFEST`), the server sends each relation file it summarized as an
//! `INCREMENTAL.<name>` file holding only the blocks WAL changed since the copy's redo point,
//! and each is applied in place ([`IncrementalFile`]) as pg_combinebackup would rebuild the
//! file from it; every other file comes whole.
//!
//! Why the copy may stand as a prior backup: a backup taken from WAL position S holds, in
//! every page, every change made before S; a data directory whose latest checkpoint's redo
//! point is R holds every change made before R (the checkpoint flushed them), and a page
//! changed after R was changed by WAL at or after R, which the summaries from R list. So R
//! is the manifest's start, along the path of timelines from R to the source's
//! ([`super::delta_target::timeline_path`], which refuses a copy that may hold WAL the source never
//! had). The server checks that path against its history and its WAL summaries
//! (basebackup_incremental.c PrepareForIncrementalBackup).
//!
//! The `INCREMENTAL.` file (basebackup.c sendFile, PostgreSQL 17 and 18): in the server's
//! byte order, u32 magic [`INCREMENTAL_MAGIC`], u32 block count n, u32 truncation block
//! length, n u32 block numbers (ascending, relative to the segment file); when n > 0, zeros
//! up to the next multiple of 8192 bytes; then the n blocks, in the list's order. The file
//! rebuilt (pg_combinebackup's reconstruct.c) is max(truncation length, last block + 1)
//! blocks long: a listed block from the increment, another block below the truncation
//! length from the prior file (zeros where that file is shorter), zeros above it.
use crate::error::{Error, Result};
use crate::pg::lsn::Lsn;
use crate::pg::pg_manifest::{PgManifestWriter, PgWalRange};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The first u32 of an `INCREMENTAL.` file (src/include/backup/basebackup_incremental.h).
pub const INCREMENTAL_MAGIC: u32 = 0xd3ae_1f0d;

/// The prefix the server puts on the last component of an incremental file's name.
pub const PREFIX: &str = "INCREMENTAL.";

/// PostgreSQL's page, BLCKSZ: 8192 bytes.
const BLOCK: u64 = 8192;

/// Blocks in one relation segment file (RELSEG_SIZE of a default build: 1 GiB of 8 KiB
/// pages); pg_combinebackup refuses a header above it, and so do we.
const RELSEG_BLOCKS: u32 = 131_072;

/// The name a received `INCREMENTAL.` file stands for (`base/5/INCREMENTAL.16384.1` ->
/// `base/5/16384.1`); None for any other name.
pub fn plain_name(path: &str) -> Option<String> {
    let (dir, name) = match path.rsplit_once('/') {
        Some((d, n)) => (Some(d), n),
        None => (None, path),
    };
    let rest = name.strip_prefix(PREFIX).filter(|r| !r.is_empty())?;
    Some(match dir {
        Some(d) => format!("{d}/{rest}"),
        None => rest.to_string(),
    })
}

/// The backup_manifest (version 2) that describes the kept copy `pg_path` to the server as
/// a prior backup: the files a base backup of it would hold (its listing as a source,
/// [`crate::pg::datadir::list_data_directory`], with the tablespace version directory
/// `tablespace_dir`; the server looks only at the relation files' paths, and sends a file
/// not listed whole), without checksums, and the WAL ranges of `path` (the (timeline, from,
/// to) parts from the copy's redo point to the source's timeline, oldest first:
/// [`super::delta_target::timeline_path`]), newest first as PostgreSQL writes them. The last range
/// ends where it starts: the server wants it to end at or before the new backup's start,
/// and a range of an earlier timeline to end at its switch point, as those do.
///
/// Errors: a directory that cannot be listed.
pub fn kept_manifest(
    pg_path: &Path,
    version_num: u32,
    system_identifier: u64,
    tablespace_dir: &str,
    path: &[(u32, Lsn, Lsn)],
) -> Result<Vec<u8>> {
    let listing =
        crate::pg::datadir::list_data_directory(pg_path, version_num, tablespace_dir, false)?;
    let mem = |e: std::io::Error| Error::Other("manifest in memory".into()).because(e);
    let mut w = PgManifestWriter::new(Vec::new(), version_num.max(170000), system_identifier)
        .map_err(mem)?;
    for f in &listing.files {
        w.file_unchecked(&f.path, f.size, f.mtime).map_err(mem)?;
    }
    w.finish(&manifest_ranges(path)).map_err(mem)
}

/// Whether the kept copy `target` can be re-synced by an incremental `BASE_BACKUP` from the
/// server behind `conn` (whose facts are `info`), its tablespaces staying at `locations`
/// ((OID, directory)), and the manifest to upload for it. None,
/// with the reason in the log, when the server sends the whole stream instead: a server
/// before 17, `summarize_wal` off (and the setting that turns it on), a copy that proves no
/// redo point, a tablespace that moves, or a copy not on the server's timeline history
/// ([`super::delta_target::timeline_path`]). Everything is read on the replication connection
/// (`SHOW`, `IDENTIFY_SYSTEM`, `TIMELINE_HISTORY`): REPLICATION is all the role needs.
/// Call before the kept copy's pg_control is removed.
///
/// Errors: the replication connection fails; the copy cannot be listed.
pub fn plan(
    conn: &mut crate::remote::replication::ReplConn,
    info: &crate::pg::session::ServerInfo,
    target: &Path,
    locations: &[(u32, std::path::PathBuf)],
) -> Result<Option<Vec<u8>>> {
    let version_num = info.version_num;
    let whole = |why: &str| {
        tracing::info!(
            "delta over the BASE_BACKUP stream: {why}; the server sends every file, so the whole cluster crosses the link, and only the blocks that differ are written here"
        );
        Ok(None)
    };
    if version_num < 170000 {
        return whole(&format!(
            "PostgreSQL {} has no incremental BASE_BACKUP (17 and later: only the blocks changed since the kept copy's redo point cross the link); --transport libpq reads only what differs, with the rights `pgjet check --source` lists for it",
            version_num / 10000
        ));
    }
    if !crate::io::tuning::get().delta_summaries {
        return whole("PGJET_DELTA_SUMMARIES=0");
    }
    if conn.show("summarize_wal")?.as_deref() != Some("on") {
        return whole(
            "summarize_wal is off on the server (ALTER SYSTEM SET summarize_wal = on and a reload make the next re-sync send only the changed blocks)",
        );
    }
    let Some(point) = super::delta_target::summaries_since(target) else {
        return whole("the kept copy proves no redo point (pg_control missing or damaged, or an unfinished copy)");
    };
    // The kept files are described where they are now: a tablespace moved elsewhere
    // (--tablespace-map) would have its increments applied to other files.
    let links = crate::pg::datadir::local_tablespace_links(target).unwrap_or_default();
    let moved = links.iter().find(|l| {
        !locations
            .iter()
            .any(|(oid, at)| *oid == l.oid && *at == l.target)
    });
    if let Some(l) = moved {
        return whole(&format!(
            "tablespace {} moves from {} (--tablespace-map)",
            l.oid,
            l.target.display()
        ));
    }
    if locations.len() != links.len() {
        return whole("the kept copy's tablespaces are not the primary's");
    }
    if info.catalog_version == 0 && !locations.is_empty() {
        return whole(
            "the catalog version, which names the tablespaces' directories, is not known (no ordinary session, and the kept copy's pg_control does not give it)",
        );
    }
    let (system_identifier, tli, pos) = conn.identify_system()?;
    let Ok(pos) = pos.parse::<Lsn>() else {
        return whole(&format!("IDENTIFY_SYSTEM gave the position '{pos}'"));
    };
    let history = if tli > 1 && tli != point.timeline {
        crate::pg::lsn::parse_history(&conn.timeline_history(tli)?)
    } else {
        Vec::new()
    };
    let own = super::delta_target::own_wal(target, info.wal_segment_size);
    let path = match super::delta_target::timeline_path(&history, tli, &point, pos, &own) {
        Ok(p) => p,
        Err(why) => return whole(&why),
    };
    let manifest = kept_manifest(
        target,
        version_num,
        system_identifier,
        &info.tablespace_dir(),
        &path,
    )?;
    tracing::info!(
        "delta over the BASE_BACKUP stream: incremental (PostgreSQL {}): the server's WAL summaries from the kept copy's redo point {} on timeline {} pick the blocks it sends",
        version_num / 10000,
        point.redo,
        point.timeline
    );
    Ok(Some(manifest))
}

/// The WAL ranges of a kept copy's manifest from its timeline path (see [`kept_manifest`]).
fn manifest_ranges(path: &[(u32, Lsn, Lsn)]) -> Vec<PgWalRange> {
    let last = path.len().saturating_sub(1);
    path.iter()
        .enumerate()
        .rev()
        .map(|(i, &(timeline, start, end))| PgWalRange {
            timeline,
            start,
            end: if i == last { start } else { end },
        })
        .collect()
}

/// `backup_label` of an incremental backup without its `INCREMENTAL FROM LSN:` and
/// `INCREMENTAL FROM TLI:` lines: the server refuses to start on a label that has them
/// ("this is an incremental backup, not a data directory", xlogrecovery.c
/// read_backup_label), and pg_combinebackup leaves them out of the directory it builds.
pub fn plain_label(label: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(label.len());
    for line in label.split_inclusive(|&b| b == b'\n') {
        if !line.starts_with(b"INCREMENTAL FROM ") {
            out.extend_from_slice(line);
        }
    }
    out
}

/// Counters of an in-place application: bytes found equal, bytes written.
pub trait Counted {
    fn add_same(&self, n: u64);
    fn add_written(&self, n: u64);
}

/// One `INCREMENTAL.` file being applied in place to the kept file it stands for, as its
/// bytes arrive (see the module's documentation): the header first, then each block
/// compared with the kept one and written where it differs.
pub struct IncrementalFile {
    path: PathBuf,
    file: fs::File,
    /// The kept file's length in blocks before anything was applied.
    old_blocks: u64,
    head: Vec<u8>,
    /// The header's length once its first 12 bytes are in: 12 + 4n, rounded up to 8192
    /// when n > 0.
    head_len: Option<usize>,
    blocks: Vec<u32>,
    next: usize,
    block: Vec<u8>,
}

impl IncrementalFile {
    /// Opens the kept file `rel` (the name the increment stands for, relative to `root`)
    /// for reading and writing. A shorter one is fine (its missing blocks read as zeros, as
    /// pg_combinebackup reads a shorter prior file); a missing one is not: the server
    /// sends an increment only for a file the manifest listed.
    ///
    /// Errors: the file is missing ([`Error::Unsafe`]: it went away since it was listed,
    /// say a tablespace moved by `--tablespace-map`; a new run sends it whole) or cannot be
    /// opened.
    pub fn open(root: &Path, rel: &str) -> Result<IncrementalFile> {
        let path = root.join(rel);
        let file = match fs::OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Unsafe(format!(
                    "{}: the server sent the changes of this file, which the kept copy held when it was described, and it is gone; run replica-create again (it then comes whole)",
                    path.display()
                )))
            }
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len();
        if len % BLOCK != 0 {
            // A partial last block is not the prior file's (pg_combinebackup reads whole
            // blocks): cut it, so that what follows reads as zeros.
            file.set_len(len / BLOCK * BLOCK)
                .map_err(|e| Error::io("size", &path, e))?;
        }
        Ok(IncrementalFile {
            path,
            file,
            old_blocks: len / BLOCK,
            head: Vec::with_capacity(12),
            head_len: None,
            blocks: Vec::new(),
            next: 0,
            block: Vec::with_capacity(BLOCK as usize),
        })
    }

    fn corrupt(&self, why: String) -> Error {
        Error::Corrupt {
            label: "BASE_BACKUP stream (incremental)".into(),
            files: vec![format!("{} ({why})", self.path.display())],
        }
    }

    /// Takes the next bytes of the increment. Errors: a header that is not PostgreSQL's
    /// (magic, counts above a segment, block numbers out of order), more block data than
    /// the header lists, a read or write of the kept file that fails.
    pub fn feed(&mut self, mut data: &[u8], count: &dyn Counted) -> Result<()> {
        while !data.is_empty() {
            let want = self.head_len.unwrap_or(12);
            if self.head.len() < want {
                let n = (want - self.head.len()).min(data.len());
                self.head.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.head.len() == 12 && self.head_len.is_none() {
                    self.parse_counts()?;
                }
                if self.head_len == Some(self.head.len()) && self.blocks.len() < self.count() {
                    self.parse_blocks()?;
                }
                continue;
            }
            let n = (BLOCK as usize - self.block.len()).min(data.len());
            self.block.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.block.len() == BLOCK as usize {
                self.put_block(count)?;
            }
        }
        Ok(())
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.head[at..at + 4].try_into().unwrap_or_default())
    }

    fn count(&self) -> usize {
        self.u32_at(4) as usize
    }

    fn parse_counts(&mut self) -> Result<()> {
        let (magic, n, trunc) = (self.u32_at(0), self.u32_at(4), self.u32_at(8));
        if magic != INCREMENTAL_MAGIC {
            return Err(self.corrupt(format!(
                "magic {magic:#010x}, not an incremental file's {INCREMENTAL_MAGIC:#010x}"
            )));
        }
        if n > RELSEG_BLOCKS || trunc > RELSEG_BLOCKS {
            return Err(self.corrupt(format!(
                "{n} blocks, truncation length {trunc}: more than a segment's {RELSEG_BLOCKS}"
            )));
        }
        let mut len = 12 + 4 * n as usize;
        if n > 0 {
            len = len.div_ceil(BLOCK as usize) * BLOCK as usize;
        }
        self.head_len = Some(len);
        if n == 0 {
            self.prepare()?;
        }
        Ok(())
    }

    fn parse_blocks(&mut self) -> Result<()> {
        let n = self.count();
        self.blocks = (0..n).map(|i| self.u32_at(12 + 4 * i)).collect();
        if let Some(w) = self.blocks.windows(2).find(|w| w[0] >= w[1]) {
            return Err(self.corrupt(format!(
                "block numbers out of order ({} then {})",
                w[0], w[1]
            )));
        }
        if let Some(b) = self.blocks.iter().find(|&&b| b >= RELSEG_BLOCKS) {
            return Err(self.corrupt(format!("block {b} past a segment")));
        }
        self.prepare()
    }

    /// Once the header is known: the file's final length in blocks, blocks from the
    /// truncation length up to it that the increment does not bring zeroed where the kept
    /// file has them, and the file set to that length (the kept blocks past it dropped).
    fn prepare(&mut self) -> Result<()> {
        let trunc = self.u32_at(8) as u64;
        let last = self.blocks.last().map_or(0, |&b| b as u64 + 1);
        let len = trunc.max(last);
        let zeros = vec![0u8; BLOCK as usize];
        for b in trunc..len.min(self.old_blocks) {
            if self.blocks.binary_search(&(b as u32)).is_err() {
                self.file
                    .write_all_at(&zeros, b * BLOCK)
                    .map_err(|e| Error::io("write", &self.path, e))?;
            }
        }
        self.file
            .set_len(len * BLOCK)
            .map_err(|e| Error::io("size", &self.path, e))
    }

    fn put_block(&mut self, count: &dyn Counted) -> Result<()> {
        let Some(&b) = self.blocks.get(self.next) else {
            return Err(self.corrupt(format!(
                "more block data than the {} blocks its header lists",
                self.blocks.len()
            )));
        };
        self.next += 1;
        let at = b as u64 * BLOCK;
        let mut old = vec![0u8; BLOCK as usize];
        let got = if (b as u64) < self.old_blocks {
            self.file
                .read_exact_at(&mut old, at)
                .map_err(|e| Error::io("read", &self.path, e))
                .map(|_| true)?
        } else {
            false
        };
        if got && old == self.block {
            count.add_same(BLOCK);
        } else {
            self.file
                .write_all_at(&self.block, at)
                .map_err(|e| Error::io("write", &self.path, e))?;
            count.add_written(BLOCK);
        }
        self.block.clear();
        Ok(())
    }

    /// Ends the increment. Errors: a header or block data cut short.
    pub fn finish(self) -> Result<()> {
        let whole = self.head_len.is_some_and(|l| self.head.len() == l);
        if !whole || self.next != self.blocks.len() || !self.block.is_empty() {
            return Err(self.corrupt(format!(
                "cut short: {} of {} blocks",
                self.next,
                self.blocks.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::Relaxed;

    #[derive(Default)]
    struct C(AtomicU64, AtomicU64);
    impl Counted for C {
        fn add_same(&self, n: u64) {
            self.0.fetch_add(n, Relaxed);
        }
        fn add_written(&self, n: u64) {
            self.1.fetch_add(n, Relaxed);
        }
    }

    /// An increment as the server builds it.
    fn increment(trunc: u32, blocks: &[(u32, u8)]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&INCREMENTAL_MAGIC.to_ne_bytes());
        v.extend_from_slice(&(blocks.len() as u32).to_ne_bytes());
        v.extend_from_slice(&trunc.to_ne_bytes());
        for (b, _) in blocks {
            v.extend_from_slice(&b.to_ne_bytes());
        }
        if !blocks.is_empty() {
            v.resize(v.len().div_ceil(8192) * 8192, 0);
        }
        for (_, fill) in blocks {
            v.extend(std::iter::repeat_n(*fill, 8192));
        }
        v
    }

    fn file_of(blocks: &[u8]) -> Vec<u8> {
        blocks
            .iter()
            .flat_map(|&f| std::iter::repeat_n(f, 8192))
            .collect()
    }

    /// Applies `inc` over a kept file of `kept` blocks, fed in pieces of `step` bytes.
    fn apply(kept: &[u8], inc: &[u8], step: usize) -> (Vec<u8>, u64, u64) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("16384"), file_of(kept)).unwrap();
        let c = C::default();
        let mut f = IncrementalFile::open(d.path(), "16384").unwrap();
        for piece in inc.chunks(step) {
            f.feed(piece, &c).unwrap();
        }
        f.finish().unwrap();
        (
            std::fs::read(d.path().join("16384")).unwrap(),
            c.0.load(Relaxed),
            c.1.load(Relaxed),
        )
    }

    #[test]
    fn rebuilds_as_pg_combinebackup() {
        // Blocks 1 and 3 changed; truncation length 4: block 0 and 2 kept.
        for step in [1, 7, 4096, 1 << 20] {
            let (got, same, wrote) = apply(&[1, 2, 3, 4], &increment(4, &[(1, 9), (3, 4)]), step);
            assert_eq!(got, file_of(&[1, 9, 3, 4]), "step {step}");
            assert_eq!((same, wrote), (8192, 8192));
        }
        // Nothing changed: the file as it was (12 bytes, no padding).
        assert_eq!(apply(&[1, 2], &increment(2, &[]), 5).0, file_of(&[1, 2]));
        // Truncated to 2 blocks, then block 3 written again: 2 becomes zeros, 4+ dropped.
        assert_eq!(
            apply(&[1, 2, 3, 4, 5, 6], &increment(2, &[(3, 7)]), 8192).0,
            file_of(&[1, 2, 0, 7])
        );
        // Grown past the kept file: the gap reads as zeros.
        assert_eq!(
            apply(&[1], &increment(3, &[(4, 5)]), 100).0,
            file_of(&[1, 0, 0, 0, 5])
        );
        // Shrunk, nothing rewritten.
        assert_eq!(apply(&[1, 2, 3], &increment(1, &[]), 12).0, file_of(&[1]));
    }

    #[test]
    fn refuses_what_the_server_does_not_send() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("1"), file_of(&[1])).unwrap();
        let c = C::default();
        let feed = |bytes: &[u8]| {
            let mut f = IncrementalFile::open(d.path(), "1").unwrap();
            f.feed(bytes, &c).and_then(|_| f.finish())
        };
        let mut bad = increment(1, &[(0, 1)]);
        bad[0] ^= 1;
        assert!(feed(&bad).unwrap_err().to_string().contains("magic"));
        let mut order = increment(3, &[(1, 1), (2, 2)]);
        order[12..16].copy_from_slice(&2u32.to_ne_bytes());
        assert!(feed(&order).unwrap_err().to_string().contains("order"));
        let whole = increment(3, &[(1, 1), (2, 2)]);
        assert!(feed(&whole[..whole.len() - 1])
            .unwrap_err()
            .to_string()
            .contains("cut short"));
        let mut more = increment(2, &[(1, 1)]);
        more.extend(std::iter::repeat_n(0, 8192));
        assert!(feed(&more)
            .unwrap_err()
            .to_string()
            .contains("more block data"));
        let mut big = increment(1, &[]);
        big[8..12].copy_from_slice(&(RELSEG_BLOCKS + 1).to_ne_bytes());
        assert!(feed(&big).unwrap_err().to_string().contains("segment"));
    }

    #[test]
    fn names_labels_and_ranges() {
        assert_eq!(
            plain_name("base/5/INCREMENTAL.16384.1").as_deref(),
            Some("base/5/16384.1")
        );
        assert_eq!(plain_name("INCREMENTAL.x").as_deref(), Some("x"));
        assert_eq!(plain_name("base/5/16384"), None);
        assert_eq!(plain_name("base/5/INCREMENTAL."), None);
        let label = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nSTART TIMELINE: 1\nINCREMENTAL FROM LSN: 0/1000028\nINCREMENTAL FROM TLI: 1\nLABEL: x\n";
        assert_eq!(
            plain_label(label),
            b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nSTART TIMELINE: 1\nLABEL: x\n".to_vec()
        );
        let r = manifest_ranges(&[
            (1, Lsn(0x100), Lsn(0x400)),
            (2, Lsn(0x400), Lsn(0x600)),
            (3, Lsn(0x600), Lsn(0x900)),
        ]);
        assert_eq!(
            r.iter()
                .map(|r| (r.timeline, r.start.0, r.end.0))
                .collect::<Vec<_>>(),
            vec![(3, 0x600, 0x600), (2, 0x400, 0x600), (1, 0x100, 0x400)]
        );
    }

    #[test]
    fn manifest_lists_the_kept_files_with_its_checksum() {
        // A missing file is refused: its increment cannot be applied.
        let e = IncrementalFile::open(std::path::Path::new("/nonexistent"), "1").err();
        assert!(e.is_some_and(|e| e.to_string().contains("is gone")));
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("base/5")).unwrap();
        std::fs::create_dir_all(d.path().join("global")).unwrap();
        std::fs::write(d.path().join("base/5/16384"), [0u8; 16]).unwrap();
        std::fs::write(d.path().join("global/1262"), [0u8; 8]).unwrap();
        std::fs::write(d.path().join("postgresql.conf"), "x").unwrap();
        std::fs::create_dir_all(d.path().join("pg_tblspc")).unwrap();
        let m = kept_manifest(
            d.path(),
            170004,
            42,
            "PG_17_202406281",
            &[(1, Lsn(0x100), Lsn(0x900))],
        )
        .unwrap();
        let text = String::from_utf8(m.clone()).unwrap();
        assert!(text.starts_with(
            "{ \"PostgreSQL-Backup-Manifest-Version\": 2,\n\"System-Identifier\": 42,"
        ));
        assert!(text.contains("\"Path\": \"base/5/16384\", \"Size\": 16,"));
        assert!(text.contains("\"Path\": \"global/1262\", \"Size\": 8,"));
        // As a base backup lists it: configuration too, which the server sends whole.
        assert!(text.contains("\"Path\": \"postgresql.conf\""));
        assert!(
            text.contains("{ \"Timeline\": 1, \"Start-LSN\": \"0/100\", \"End-LSN\": \"0/100\" }")
        );
        // The server's check (parse_manifest.c verify_manifest_checksum): SHA-256 of all
        // but the last line.
        use sha2::Digest;
        let body_end = text[..text.len() - 1].rfind('\n').unwrap() + 1;
        let digest = hex::encode(sha2::Sha256::digest(&m[..body_end]));
        assert!(text[body_end..].contains(&digest));
    }
}
