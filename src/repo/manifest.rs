//! The backup manifest (`manifest.json`): everything needed to verify and restore a backup.
use crate::codec::Compression;
use crate::pg::lsn::Lsn;
use serde::{Deserialize, Serialize};

/// One stored frame: a contiguous range of a file's logical bytes, compressed on its own.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Piece {
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zero_pages: Vec<[u32; 2]>,
    /// XXH3-128 (hex) of the logical bytes of the range.
    pub xxh3: String,
    /// CRC32C of the logical bytes of the range.
    pub crc32c: u32,
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
    /// CRC32C of the whole file (combined from the pieces).
    pub crc32c: u32,
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

/// A backup's manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupManifest {
    /// Repository format version.
    pub format: u32,
    pub label: String,
    /// "full".
    #[serde(rename = "type")]
    pub backup_type: String,
    pub stanza: String,
    #[serde(with = "crate::repo::u64_string")]
    pub system_identifier: u64,
    pub pg_version: String,
    pub pg_version_num: u32,
    pub catalog_version: u32,
    /// RFC 3339 UTC.
    pub start_time: String,
    pub stop_time: String,
    pub start_lsn: Lsn,
    pub stop_lsn: Lsn,
    pub timeline: u32,
    /// Bytes.
    pub wal_segment_size: u64,
    /// Bytes.
    pub block_size: u32,
    pub data_checksums: bool,
    pub compression: Compression,
    /// backup_label text returned by pg_backup_stop.
    pub backup_label: String,
    /// tablespace_map text returned by pg_backup_stop (None when there are no tablespaces).
    pub tablespace_map: Option<String>,
    pub tablespaces: Vec<Tablespace>,
    /// WAL segments stored under `pg_wal/`, first to last.
    pub wal_segments: Vec<String>,
    /// Total logical bytes.
    pub size: u64,
    /// Total stored bytes.
    pub stored_size: u64,
    pub directories: Vec<DirEntry>,
    pub files: Vec<FileEntry>,
}
