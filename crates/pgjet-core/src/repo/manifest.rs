//! The backup manifest: everything needed to verify and restore a backup (stored as described
//! in [`super::manifest_io`]).
use crate::codec::Compression;
use crate::pg::lsn::Lsn;
pub use crate::transfer::nonzero_ranges;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// The most logical bytes one piece (and so one chunk or bundle) holds: 8 MiB.
pub const MAX_PIECE_SIZE: u64 = 8 << 20;
// The engine's units become pieces: none may exceed what a manifest accepts.
const _: () = assert!(crate::transfer::CHUNK_SIZE <= MAX_PIECE_SIZE);

/// One range of a file and where its bytes are stored: a frame (compressed on its own) of
/// this backup or, in a differential or incremental backup, of an older backup of the
/// chain (`backup`). A piece is the whole frame, or a slice of it (`frame`): block-level
/// backups store the changed 8 KiB blocks of a range together in one frame and refer to
/// the unchanged blocks inside the frames of older backups.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Piece {
    /// Label of the backup whose `data/` holds the object; absent: this backup. Always the
    /// backup that stored the frame (never one that only refers to it), so a reader finds
    /// every frame in one step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// Object (below the backup's `data/`) that holds the frame.
    pub object: String,
    /// Byte offset of the frame in the object.
    pub offset: u64,
    /// Frame length in bytes.
    pub stored_size: u64,
    /// XXH3-128 (hex) of the frame's bytes.
    pub stored_xxh3: String,
    /// Offset of the range in the file, bytes.
    pub logical_offset: u64,
    /// Length of the range, bytes (zero pages included).
    pub logical_size: u64,
    /// Runs `[first, count]` of all-zero 8 KiB pages, counted from `logical_offset`, that are
    /// not in the frame (restored as holes). The frame holds the other bytes in order.
    /// Empty for a slice (the frame's runs are in `frame`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zero_pages: Vec<[u32; 2]>,
    /// XXH3-128 (hex) of the logical bytes of the range. Absent only for a slice whose bytes
    /// the backup did not read (the frame's own hash, in `frame`, checks them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
    /// CRC32C of the logical bytes of the range; absent when `xxh3` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<u32>,
    /// Present when the range is a part of the frame: `logical_size` bytes from `skip` of
    /// the frame's logical bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<FrameSlice>,
}

/// The frame a slice [`Piece`] takes its bytes from, described as a whole.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FrameSlice {
    /// Logical bytes of the whole frame (zero pages included).
    pub size: u64,
    /// Where the piece's range starts in the frame's logical bytes.
    pub skip: u64,
    /// Runs `[first, count]` of all-zero 8 KiB pages of the frame, counted from its start,
    /// that are not stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zero_pages: Vec<[u32; 2]>,
    /// XXH3-128 (hex) of the frame's logical bytes.
    pub xxh3: String,
}

impl Piece {
    /// The all-zero page runs of the piece's own range, counted from `logical_offset`:
    /// `zero_pages`, or for a slice the frame's runs that fall whole inside the slice (none
    /// when the slice does not start on a page boundary of the frame).
    pub fn range_zero_pages(&self) -> std::borrow::Cow<'_, [[u32; 2]]> {
        let Some(f) = &self.frame else {
            return std::borrow::Cow::Borrowed(&self.zero_pages);
        };
        let page = crate::pg::checksum::BLCKSZ as u64;
        if f.skip % page != 0 {
            return std::borrow::Cow::Owned(Vec::new());
        }
        let (first, last) = (f.skip / page, (f.skip + self.logical_size) / page);
        let mut out = Vec::new();
        for [a, n] in &f.zero_pages {
            let (a, b) = (
                u64::from(*a).max(first),
                (u64::from(*a) + u64::from(*n)).min(last),
            );
            if a < b {
                out.push([(a - first) as u32, (b - a) as u32]);
            }
        }
        std::borrow::Cow::Owned(out)
    }
}

impl crate::transfer::PieceOffset for Piece {
    fn logical_offset(&self) -> u64 {
        self.logical_offset
    }
    fn logical_end(&self) -> u64 {
        self.logical_offset + self.logical_size
    }
}

/// A regular file of the backup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// Path relative to the data directory, '/'-separated; tablespace files are below
    /// `pg_tblspc/<oid>/`, WAL below `pg_wal/`.
    pub path: String,
    /// Logical size, bytes.
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: i64,
    /// Permission bits.
    pub mode: u32,
    /// CRC32C of the whole file (combined from the pieces); absent when a piece's is
    /// (restore computes it from the bytes it writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<u32>,
    /// The frames, in logical order, covering `[0, size)`; empty for an empty file.
    pub pieces: Vec<Piece>,
    /// Blocks whose page checksum failed twice (real corruption in the source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub page_errors: Vec<u32>,
}

/// A directory of the backup (restored even when empty).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DirEntry {
    pub path: String,
    pub mode: u32,
}

/// A tablespace of the cluster at backup time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Tablespace {
    pub oid: u32,
    pub name: String,
    /// Directory the pg_tblspc link pointed to on the source.
    pub location: String,
}

/// What is known of a backup when it starts: the first line of the stored manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestHeader {
    /// Repository format version.
    pub format: u32,
    pub label: String,
    /// "full", "diff" or "incr".
    #[serde(rename = "type")]
    pub backup_type: String,
    /// For "diff" and "incr": the backup this one was taken against (diff: the newest full;
    /// incr: the newest backup). Its start LSN decided which blocks changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    pub stanza: String,
    #[serde(with = "crate::repo::u64_string")]
    pub system_identifier: u64,
    pub pg_version: String,
    pub pg_version_num: u32,
    pub catalog_version: u32,
    /// RFC 3339 UTC.
    pub start_time: String,
    pub start_lsn: Lsn,
    /// Bytes.
    pub wal_segment_size: u64,
    /// Bytes.
    pub block_size: u32,
    pub data_checksums: bool,
    pub compression: Compression,
    pub tablespaces: Vec<Tablespace>,
    /// The databases when the backup started: (OID, xmin of its pg_database row), sorted
    /// ([`crate::pg::session::Session::databases`]). A later diff or incr takes a database's
    /// blocks from this backup only when the database still has the same pair (a database
    /// created again by file copy under a reused OID carries old page LSNs). Empty in
    /// backups of older pgjet versions: they cannot be references.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<(u32, u32)>,
}

/// What is known of a backup when it stops: part of the last line of the stored manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StopInfo {
    /// RFC 3339 UTC.
    pub stop_time: String,
    pub stop_lsn: Lsn,
    /// Timeline of the backup (START TIMELINE of its backup_label).
    pub timeline: u32,
    /// backup_label text returned by pg_backup_stop.
    pub backup_label: String,
    /// tablespace_map text returned by pg_backup_stop (None when there are no tablespaces).
    pub tablespace_map: Option<String>,
    /// WAL segments stored under `pg_wal/`, first to last.
    pub wal_segments: Vec<String>,
    /// When the cluster archived WAL and the backup checked the archive: the first and last
    /// WAL segment of the backup (the segments holding the start LSN and the stop LSN's last
    /// byte, on `timeline`), the last of them seen in the archive before the backup
    /// completed. A point-in-time recovery from this backup replays the archive from
    /// `archive_start`. Absent otherwise (the backup relies on the WAL it holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_stop: Option<String>,
}

/// A backup's manifest, whole in memory (see [`super::manifest_io`] for how it is stored
/// and streamed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupManifest {
    #[serde(flatten)]
    pub header: ManifestHeader,
    #[serde(flatten)]
    pub stop: StopInfo,
    /// Total logical bytes.
    pub size: u64,
    /// Total stored bytes.
    pub stored_size: u64,
    pub directories: Vec<DirEntry>,
    pub files: Vec<FileEntry>,
}

/// True for a relative '/'-separated path with no empty, `.` or `..` component and no NUL.
pub fn is_safe_relative_path(p: &str) -> bool {
    !p.is_empty()
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

impl DirEntry {
    /// Checks the directory's path (see [`BackupManifest::validate`]).
    pub fn check(&self) -> Result<(), String> {
        if !is_safe_relative_path(&self.path) {
            return Err(format!(
                "directory path {:?} is not a safe relative path",
                self.path
            ));
        }
        Ok(())
    }
}

impl FileEntry {
    /// Checks what restore and verify rely on in one file line, so a damaged or edited line
    /// is refused before any of its bytes is written: a safe relative path, object names of
    /// digits only, pieces that cover the file exactly and in order, frame and piece sizes
    /// within the format's bounds, zero-page runs inside their piece. Returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let f = self;
        if !is_safe_relative_path(&f.path) {
            return Err(format!(
                "file path {:?} is not a safe relative path",
                f.path
            ));
        }
        let mut expected = 0u64;
        let mut crcs = true;
        for p in &f.pieces {
            if let Some(b) = &p.backup {
                if !super::label::is_label(b) {
                    return Err(format!("{}: backup label {b:?} is not valid", f.path));
                }
            }
            crcs &= p.crc32c.is_some();
            if p.crc32c.is_some() != p.xxh3.is_some() {
                return Err(format!(
                    "{}: a piece at offset {} has one of its two checksums",
                    f.path, p.logical_offset
                ));
            }
            if p.object.is_empty()
                || p.object.len() > 20
                || !p.object.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(format!(
                    "{}: object name {:?} is not valid",
                    f.path, p.object
                ));
            }
            if p.logical_offset != expected
                || p.logical_size == 0
                || p.logical_size > MAX_PIECE_SIZE
            {
                return Err(format!(
                    "{}: pieces do not cover the file in order at offset {expected}",
                    f.path
                ));
            }
            if p.stored_size > MAX_PIECE_SIZE + MAX_PIECE_SIZE / 8 + 4096
                || p.offset.checked_add(p.stored_size).is_none()
            {
                return Err(format!(
                    "{}: a frame of {} bytes is out of bounds",
                    f.path, p.stored_size
                ));
            }
            if nonzero_ranges(p.logical_size as usize, &p.zero_pages).is_none() {
                return Err(format!("{}: zero-page runs do not fit their piece", f.path));
            }
            match &p.frame {
                None if p.xxh3.is_none() => {
                    return Err(format!(
                        "{}: the piece at offset {} has no checksum",
                        f.path, p.logical_offset
                    ))
                }
                Some(fr)
                    if fr.size == 0
                        || fr.size > MAX_PIECE_SIZE
                        || fr
                            .skip
                            .checked_add(p.logical_size)
                            .is_none_or(|e| e > fr.size)
                        || !p.zero_pages.is_empty()
                        || nonzero_ranges(fr.size as usize, &fr.zero_pages).is_none() =>
                {
                    return Err(format!(
                        "{}: the slice at offset {} does not fit its frame",
                        f.path, p.logical_offset
                    ));
                }
                _ => {}
            }
            expected += p.logical_size;
        }
        if expected != f.size {
            return Err(format!(
                "{}: pieces cover {expected} of {} bytes",
                f.path, f.size
            ));
        }
        if f.crc32c.is_none() && crcs {
            return Err(format!("{}: the file's CRC32C is missing", f.path));
        }
        Ok(())
    }
}

impl BackupManifest {
    /// The listing this manifest describes, to clean a delta target with.
    pub fn listing(&self) -> crate::pg::datadir::Listing {
        crate::pg::datadir::Listing {
            dirs: self
                .directories
                .iter()
                .map(|d| (d.path.clone(), d.mode))
                .collect(),
            files: self
                .files
                .iter()
                .map(|f| crate::pg::datadir::SourceFile {
                    path: f.path.as_str().into(),
                    size: f.size,
                    mtime: f.mtime,
                    mode: f.mode,
                    checksum_segno: None,
                })
                .collect(),
            tablespaces: Vec::new(),
        }
    }

    /// Checks everything restore and verify rely on, so a damaged or edited manifest is
    /// refused before any byte is written: every line ([`DirEntry::check`],
    /// [`FileEntry::check`]), unique paths, a pg_control, and a file for every WAL segment
    /// named. Returns what is wrong. (A streamed manifest gets the same checks from
    /// [`super::manifest_io::ManifestChecks`].)
    pub fn validate(&self) -> Result<(), String> {
        let mut seen = HashSet::new();
        for d in &self.directories {
            d.check()?;
        }
        for f in &self.files {
            f.check()?;
            if !seen.insert(f.path.as_str()) {
                return Err(format!("file {} is listed twice", f.path));
            }
        }
        if !seen.contains("global/pg_control") {
            return Err("global/pg_control is missing".into());
        }
        for seg in &self.stop.wal_segments {
            if !seen.contains(format!("pg_wal/{seg}").as_str()) {
                return Err(format!("WAL segment {seg} is named but not stored"));
            }
        }
        Ok(())
    }
}

/// The file's CRC32C, combined from its pieces in order (0 for a file without pieces, the
/// CRC-32C of no bytes); None when a piece's CRC is unknown (a slice of an older backup's
/// frame). The first piece's CRC is taken as it is, uncombined: with zlib's matrix
/// method a combine cost about 12 µs, 30% of a backup's CPU at 100 000 one-piece files
/// (docs/benchmark-notes.md); [`crate::pg::pg_manifest::crc32c_combine`] is cheaper now,
/// but nothing need be combined there.
pub fn file_crc(pieces: &[Piece]) -> Option<u32> {
    match pieces.split_first() {
        None => Some(0),
        Some((first, rest)) => rest.iter().try_fold(first.crc32c?, |crc, p| {
            Some(crate::pg::pg_manifest::crc32c_combine(
                crc,
                p.crc32c?,
                p.logical_size,
            ))
        }),
    }
}

/// Builds the manifest entry of a copied file from the pieces its ranges were stored as
/// (a range of a block-level backup may be several pieces), in file order.
pub fn file_entry(
    f: &crate::pg::datadir::SourceFile,
    pieces: Vec<Vec<Piece>>,
    page_errors: Vec<u32>,
) -> FileEntry {
    let pieces: Vec<Piece> = pieces.into_iter().flatten().collect();
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

impl crate::transfer::PieceOffset for Vec<Piece> {
    fn logical_offset(&self) -> u64 {
        self.first().map_or(0, |p| p.logical_offset)
    }
    fn logical_end(&self) -> u64 {
        self.last().map_or(0, |p| p.logical_offset + p.logical_size)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small valid manifest (three files, one directory) in the current format.
    pub(crate) fn sample() -> BackupManifest {
        let piece = |off: u64, size: u64| {
            serde_json::json!({"object": "000001", "offset": 0, "stored_size": 10, "stored_xxh3": "x",
                "logical_offset": off, "logical_size": size, "xxh3": "y", "crc32c": 0})
        };
        serde_json::from_value(serde_json::json!({
            "format": crate::repo::REPO_FORMAT, "label": "L", "type": "full", "stanza": "s", "system_identifier": "1",
            "pg_version": "15", "pg_version_num": 150000, "catalog_version": 1,
            "start_time": "", "stop_time": "", "start_lsn": "0/1", "stop_lsn": "0/2", "timeline": 1,
            "wal_segment_size": 16777216, "block_size": 8192, "data_checksums": true,
            "compression": {"type": "zstd", "level": 1}, "backup_label": "", "tablespace_map": null,
            "tablespaces": [], "wal_segments": ["000000010000000000000001"], "size": 0, "stored_size": 0,
            "directories": [{"path": "base", "mode": 448}],
            "files": [
                {"path": "global/pg_control", "size": 8192, "mtime": 0, "mode": 384, "crc32c": 0, "pieces": [piece(0, 8192)]},
                {"path": "base/1/2", "size": 9437184, "mtime": 0, "mode": 384, "crc32c": 0,
                 "pieces": [piece(0, 8388608), piece(8388608, 1048576)]},
                {"path": "pg_wal/000000010000000000000001", "size": 0, "mtime": 0, "mode": 384, "crc32c": 0, "pieces": []}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn a_good_manifest_passes() {
        sample().validate().unwrap();
    }

    #[test]
    fn damaged_manifests_are_refused() {
        type Damage = Box<dyn Fn(&mut BackupManifest)>;
        let cases: Vec<(&str, Damage)> = vec![
            (
                "safe",
                Box::new(|m| m.files[1].path = "../../etc/passwd".into()),
            ),
            ("safe", Box::new(|m| m.directories[0].path = "/etc".into())),
            (
                "twice",
                Box::new(|m| m.files[1].path = "global/pg_control".into()),
            ),
            (
                "object",
                Box::new(|m| m.files[1].pieces[0].object = "../x".into()),
            ),
            (
                "cover",
                Box::new(|m| {
                    m.files[1].pieces.remove(0);
                }),
            ),
            ("cover", Box::new(|m| m.files[1].size += 1)),
            (
                "cover",
                Box::new(|m| m.files[1].pieces[1].logical_size = MAX_PIECE_SIZE + 1),
            ),
            (
                "bounds",
                Box::new(|m| m.files[1].pieces[0].stored_size = u64::MAX),
            ),
            (
                "zero-page",
                Box::new(|m| m.files[1].pieces[1].zero_pages = vec![[100, 100]]),
            ),
            (
                "pg_control",
                Box::new(|m| m.files[0].path = "global/other".into()),
            ),
            (
                "WAL segment",
                Box::new(|m| m.stop.wal_segments.push("000000010000000000000002".into())),
            ),
        ];
        for (want, damage) in cases {
            let mut m = sample();
            damage(&mut m);
            let err = m.validate().unwrap_err();
            assert!(err.contains(want), "expected '{want}' in: {err}");
        }
    }

    #[test]
    fn file_crc_is_the_crc_of_the_pieces_in_order() {
        let data: Vec<u8> = (0..30_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let piece = |off: usize, len: usize| Piece {
            backup: None,
            frame: None,
            object: "x".into(),
            offset: 0,
            stored_size: 0,
            stored_xxh3: String::new(),
            logical_offset: off as u64,
            logical_size: len as u64,
            zero_pages: Vec::new(),
            xxh3: None,
            crc32c: Some(crate::codec::crc32c(&data[off..off + len])),
        };
        assert_eq!(file_crc(&[]), Some(crate::codec::crc32c(b"")));
        assert_eq!(
            file_crc(&[piece(0, 30_000)]),
            Some(crate::codec::crc32c(&data))
        );
        assert_eq!(
            file_crc(&[piece(0, 8192), piece(8192, 10_000), piece(18_192, 11_808)]),
            Some(crate::codec::crc32c(&data))
        );
        // A slice of an older backup's frame has no CRC of its own: neither has the file.
        let mut slice = piece(8192, 10_000);
        slice.crc32c = None;
        assert_eq!(file_crc(&[piece(0, 8192), slice]), None);
    }
}
