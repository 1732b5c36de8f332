//! The repository: stanza info, backup manifests, object names, locks. The format is
//! documented in docs/repository-format.md (format version [`REPO_FORMAT`]).
//!
//! Layout below the repository root:
//!
//! ```text
//! <stanza>/stanza.json                 StanzaInfo
//! <stanza>/lock/backup.json           the backup lock (see [`lock`])
//! <stanza>/backup/<label>/manifest.jsonl.zst  the manifest, a stream of JSON lines
//! <stanza>/backup/<label>/summary.json  written last (its presence = complete)
//! <stanza>/backup/<label>/data/<object>  stored frames
//! <stanza>/archive/<TLI>/...          the WAL archive (see [`wal`])
//! ```
pub mod backup;
pub mod delta;
pub mod label;
pub mod lock;
pub mod manifest;
pub mod manifest_io;
pub mod open;
pub mod read_back;
pub mod retention;
pub mod sink;
pub mod wal;

use crate::error::{Error, Result};
use crate::storage::Storage;
use serde::{Deserialize, Serialize};

pub use label::{new_label, rfc3339};
pub use lock::StanzaLock;
pub use manifest::{
    BackupManifest, DirEntry, FileEntry, ManifestHeader, Piece, StopInfo, Tablespace,
    MAX_PIECE_SIZE,
};
pub use manifest_io::{
    manifest_name, read_manifest, read_summary, scan_manifest, summary_name, write_manifest,
    BackupSummary, Entry, ManifestReader, ScannedManifest,
};

/// Version of the repository format this build writes and reads.
/// 2: the manifest is a zstd stream of JSON lines and `summary.json` marks completeness.
pub const REPO_FORMAT: u32 = 2;

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

/// Name of the stanza info object.
pub fn stanza_info_name(stanza: &str) -> String {
    format!("{stanza}/stanza.json")
}
/// Directory of one backup.
pub fn backup_dir(stanza: &str, label: &str) -> String {
    format!("{stanza}/backup/{label}")
}
/// Name of a stored object of a backup.
pub fn object_name(stanza: &str, label: &str, object: &str) -> String {
    format!("{stanza}/backup/{label}/data/{object}")
}

/// Reads the stanza info; a missing stanza is an error that points at stanza-create.
pub fn read_stanza(store: &dyn Storage, stanza: &str) -> Result<StanzaInfo> {
    let name = stanza_info_name(stanza);
    if !store.exists(&name)? {
        return Err(Error::Repo(format!(
            "stanza '{stanza}' does not exist in the repository; run `pgjet stanza-create` first"
        )));
    }
    let info: StanzaInfo = serde_json::from_slice(&store.get(&name)?)
        .map_err(|e| Error::Repo(format!("{name} is not valid: {e}")))?;
    if info.format != REPO_FORMAT {
        return Err(Error::Repo(format!(
            "{name} has format {}, this pgjet reads {REPO_FORMAT}",
            info.format
        )));
    }
    Ok(info)
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

/// Labels of every backup directory of a stanza, complete or not, oldest first.
pub fn list_backups(store: &dyn Storage, stanza: &str) -> Result<Vec<String>> {
    store.list(&format!("{stanza}/backup"))
}

/// A label for a backup starting now that no backup of `stanza` has in any of `stores`
/// (every configured repository a command could restore from: a label names one backup
/// wherever it is searched for). Labels have one-second resolution, so this waits for the
/// next second while the label is taken. Returns the start time and the label. A repository
/// that cannot be listed is skipped with a warning (the backup's own repository is listed
/// again when the backup writes there).
///
/// Errors: `stores` is empty.
pub fn new_unique_label(
    stores: &[(u8, &dyn Storage)],
    stanza: &str,
) -> Result<(chrono::DateTime<chrono::Utc>, String)> {
    if stores.is_empty() {
        return Err(Error::Config("no repository is configured".into()));
    }
    loop {
        let started = chrono::Utc::now();
        let label = new_label(started);
        let mut taken = false;
        for (n, store) in stores {
            match list_backups(*store, stanza) {
                Ok(labels) => taken |= labels.contains(&label),
                Err(e) => tracing::warn!("repo{n}: cannot list the backups: {e}"),
            }
        }
        if !taken {
            return Ok((started, label));
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Checks that a command can write to the stanza's part of the repository: a probe object
/// `<stanza>/check.<pid>` is written durably and removed (documented in
/// docs/repository-format.md).
///
/// Errors: the store's.
pub fn check_writable(store: &dyn Storage, stanza: &str) -> Result<()> {
    let probe = format!("{stanza}/check.{}", std::process::id());
    store.put_durable(&probe, b"pgjet check\n")?;
    store.delete(&probe)
}

/// Labels of the complete backups of a stanza (those with a summary), oldest first.
pub fn list_complete(store: &dyn Storage, stanza: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for label in list_backups(store, stanza)? {
        if store.exists(&summary_name(stanza, &label))? {
            out.push(label);
        }
    }
    Ok(out)
}

/// Labels of backup directories with no summary: interrupted backups.
pub fn list_incomplete(store: &dyn Storage, stanza: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for label in list_backups(store, stanza)? {
        if !label.ends_with(".tmp") && !store.exists(&summary_name(stanza, &label))? {
            out.push(label);
        }
    }
    Ok(out)
}

/// Resolves `--set` (a label or `latest`) to a complete backup's label.
pub fn resolve_set(store: &dyn Storage, stanza: &str, set: &str) -> Result<String> {
    let labels = list_complete(store, stanza)?;
    if set == "latest" {
        return labels
            .last()
            .cloned()
            .ok_or_else(|| Error::Repo(format!("stanza '{stanza}' has no complete backup")));
    }
    if labels.iter().any(|l| l == set) {
        Ok(set.to_string())
    } else {
        Err(Error::Repo(format!(
            "backup '{set}' not found in stanza '{stanza}' (complete backups: {})",
            labels.join(", ")
        )))
    }
}
