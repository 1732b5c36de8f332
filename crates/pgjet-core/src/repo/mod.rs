//! The repository: stanza info, backup manifests, object names, locks. The format is
//! documented in docs/repository-format.md (format version [`REPO_FORMAT`]).
//!
//! Layout below the repository root:
//!
//! ```text
//! <stanza>/stanza.json                 StanzaInfo
//! <stanza>/lock/backup-<epoch>.json   the backup lock's records (see [`lock`])
//! <stanza>/backup/<label>/manifest.jsonl.zst  the manifest, a stream of JSON lines
//! <stanza>/backup/<label>/summary.json  written last (its presence = complete)
//! <stanza>/backup/<label>/data/<object>  stored frames
//! <stanza>/archive/<TLI>/...          the WAL archive (see [`wal`])
//! ```
pub mod backup_target;
pub mod chain;
pub mod cipher;
pub mod cipher_keys;
pub mod cipher_store;
pub mod frame;
pub mod handle;
pub mod incremental;
pub mod kek_cache;
pub mod label;
pub mod lock;
pub mod manifest;
pub mod manifest_io;
pub mod open;
pub mod read_back;
pub mod restore_delta;
pub mod restore_target;
pub mod resume;
pub mod retention;
pub mod sink;
pub mod stanza;
pub mod wal;
pub mod wal_tail;

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

pub use label::{new_label, rfc3339};
pub use lock::StanzaLock;
pub use manifest::{
    BackupManifest, DirEntry, FileEntry, FrameSlice, ManifestHeader, Piece, StopInfo, Tablespace,
    MAX_PIECE_SIZE,
};
pub use manifest_io::{BackupSummary, Entry, ManifestReader, ScannedManifest};
pub use stanza::{new_unique_label, stanza_names, Backup, Stanza};

/// Version of the repository format this build writes and reads.
/// 2: the manifest is a zstd stream of JSON lines and `summary.json` marks completeness.
pub const REPO_FORMAT: u32 = 2;
/// Format of the manifest and summary of a differential or incremental backup: format 2
/// with pieces that name older backups and slices of frames (a reader of format 2 only
/// would look for those frames in the wrong backup). Full backups keep format 2.
pub const CHAIN_FORMAT: u32 = 3;

/// What a stanza records about its cluster; a repository stanza belongs to one cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StanzaInfo {
    /// Repository format version ([`REPO_FORMAT`]).
    pub format: u32,
    pub stanza: String,
    /// pg_control's system identifier (pg_control_system()).
    #[serde(with = "u64_string")]
    pub system_identifier: u64,
    /// Major version, e.g. "15" or "18".
    pub pg_version: String,
    /// server_version_num, e.g. 150020.
    pub pg_version_num: u32,
    /// catalog_version_no from pg_control.
    pub catalog_version: u32,
    /// RFC 3339 UTC time of stanza-create.
    pub created: String,
    /// The cluster's WAL segment size in bytes (absent in stanzas made before the WAL
    /// archive: 16 MiB, PostgreSQL's default, is assumed then).
    #[serde(default = "default_wal_segment_size")]
    pub wal_segment_size: u64,
}

/// PostgreSQL's default WAL segment size, bytes (`DEFAULT_XLOG_SEG_SIZE`, pg_config_manual.h).
pub fn default_wal_segment_size() -> u64 {
    16 << 20
}

/// Serializes a u64 as a JSON string (system identifiers do not fit a JavaScript number).
pub mod u64_string {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Refuses a cluster whose identity differs from the stanza's.
pub fn check_same_cluster(
    info: &StanzaInfo,
    system_identifier: u64,
    pg_version: &str,
) -> Result<()> {
    if info.system_identifier != system_identifier {
        return Err(Error::Repo(format!(
            "stanza '{}' belongs to the cluster with system identifier {}, but this cluster has system identifier {system_identifier}",
            info.stanza, info.system_identifier
        )));
    }
    if info.pg_version != pg_version {
        return Err(Error::Repo(format!(
            "stanza '{}' holds PostgreSQL {} backups, but the cluster runs PostgreSQL {pg_version}",
            info.stanza, info.pg_version
        )));
    }
    Ok(())
}
