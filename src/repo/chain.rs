//! The chain of a differential or incremental backup: the older backups whose frames its
//! pieces name ([`super::manifest::ManifestEnd::references`]), each checked before a byte is
//! read from it.
use super::{Backup, BackupSummary};
use crate::codec::CompressType;
use crate::error::{Error, Result};

/// The older backups a backup's pieces name, with the compression of their frames, in the
/// order of `end.references` (oldest first: labels sort by time).
///
/// Each reference must be complete (its summary present and valid, of this stanza), older
/// than the backup (its label sorts before), and of the same cluster (system identifier,
/// major version, block size). A full backup has none and gets an empty chain.
///
/// Errors: [`Error::Repo`] naming the first reference that is missing, incomplete, newer or
/// of another cluster, with what to do.
pub fn open_chain(backup: &Backup, summary: &BackupSummary) -> Result<Vec<(String, CompressType)>> {
    let (label, h) = (backup.label(), &summary.header);
    let mut chain = Vec::with_capacity(summary.end.references.len());
    for r in &summary.end.references {
        if r.as_str() >= label {
            return Err(Error::Repo(format!(
                "backup {label} names backup {r} as a reference, but a reference must be older"
            )));
        }
        let other = backup.stanza().backup(r);
        let s = other.summary().map_err(|e| {
            Error::Repo(format!(
                "backup {label} depends on backup {r}, which cannot be read ({e}); \
                 restore or verify another backup, or take a new full backup"
            ))
        })?;
        let o = &s.header;
        if o.system_identifier != h.system_identifier
            || o.pg_version != h.pg_version
            || o.block_size != h.block_size
        {
            return Err(Error::Repo(format!(
                "backup {label} depends on backup {r}, which is of another cluster \
                 (system identifier {} PostgreSQL {}, against {} PostgreSQL {})",
                o.system_identifier, o.pg_version, h.system_identifier, h.pg_version
            )));
        }
        chain.push((r.clone(), o.compression.kind));
    }
    Ok(chain)
}

/// What the cluster is now, for choosing a reference ([`choose_reference`]).
pub struct ClusterNow {
    pub system_identifier: u64,
    pub pg_version: String,
    /// Bytes.
    pub block_size: u32,
    pub data_checksums: bool,
    /// The timeline of the latest checkpoint (pg_control_checkpoint()).
    pub timeline: u32,
}

/// The reference of a differential (`diff_only`: the newest full backup) or incremental
/// backup (the newest complete backup of any type) among `complete` (labels, oldest first),
/// or why there can be none and the backup must be full.
///
/// A backup can serve as reference only when its blocks are exactly what the page LSN rule
/// assumes: same cluster and major version, 8 KiB blocks ([`crate::pg::checksum::BLCKSZ`]),
/// data checksums not turned on since (pages written before then carry no checksum, and
/// hint-bit changes were not WAL-logged), and the same timeline (after a promotion, pages
/// of the old timeline past the branch point may sit in the reference with LSNs the new
/// timeline reuses).
///
/// Errors: a summary that cannot be read.
pub fn choose_reference(
    stanza: &super::Stanza,
    complete: &[String],
    diff_only: bool,
    now: &ClusterNow,
) -> Result<std::result::Result<BackupSummary, String>> {
    let label = if diff_only {
        complete.iter().rev().find(|l| l.ends_with('F'))
    } else {
        complete.last()
    };
    let Some(label) = label else {
        return Ok(Err(format!(
            "the stanza holds no {} backup",
            if diff_only { "full" } else { "complete" }
        )));
    };
    let s = stanza.backup(label).summary()?;
    let h = &s.header;
    let why = if h.system_identifier != now.system_identifier || h.pg_version != now.pg_version {
        Some(format!(
            "backup {label} is of another cluster or major version (system identifier {}, PostgreSQL {})",
            h.system_identifier, h.pg_version
        ))
    } else if h.block_size != crate::pg::checksum::BLCKSZ as u32
        || now.block_size != crate::pg::checksum::BLCKSZ as u32
    {
        Some(format!(
            "the block size is {} bytes; changed blocks are found in 8 KiB blocks only",
            now.block_size
        ))
    } else if now.data_checksums && !h.data_checksums {
        Some(format!(
            "data checksums were turned on after backup {label}"
        ))
    } else if h.databases.is_empty() {
        Some(format!(
            "backup {label} was taken by an older pgjet that did not record its databases"
        ))
    } else if s.end.stop.timeline != now.timeline {
        Some(format!(
            "backup {label} is of timeline {}, the cluster is on timeline {} now",
            s.end.stop.timeline, now.timeline
        ))
    } else {
        None
    };
    Ok(match why {
        Some(w) => Err(w),
        None => Ok(s),
    })
}
