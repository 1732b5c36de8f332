//! The queue of WAL waiting to be archived (`pg_wal/archive_status/*.ready`) and its limit,
//! `archive-push-queue-max`: past it, segments are dropped instead of archived and the gap is
//! recorded, durably in the spool first, then in every repository (`crate::repo::wal::Gap`).
use super::push::Archiver;
use super::spool::Spool;
use crate::error::{Error, Result};
use crate::io::mib;
use crate::options::ArchiveConfig;
use crate::pg::lsn;
use crate::repo::wal::{self, Gap, WalFile, WalFileKind};
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Names of the files PostgreSQL has marked ready to archive (`archive_status/<f>.ready`),
/// sorted: timeline history files first (PostgreSQL archives them first too), then by name.
pub fn ready_files(wal_dir: &Path) -> Result<Vec<String>> {
    let status = wal_dir.join("archive_status");
    let mut out: Vec<String> = fs::read_dir(&status)
        .map_err(|e| Error::io("list", &status, e))?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".ready"))
                .map(str::to_owned)
        })
        .collect();
    out.sort_by_key(|n| (!n.ends_with(".history"), n.clone()));
    Ok(out)
}

/// Writes the gap records waiting in the spool into every repository, removing each once
/// all have it. Errors are logged and left for the next call (the record stays).
pub fn flush_gaps(spool: &Spool, archiver: &Archiver) {
    let Ok(rd) = fs::read_dir(spool.gap_dir()) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let Some(gap) = fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice::<Gap>(&b).ok())
        else {
            continue;
        };
        // Every repository is tried (no short cut): each that has it is one fewer to retry.
        let mut all = true;
        for st in archiver.repos() {
            let n = st.repo();
            if let Err(e) = wal::record_gap(st, &gap) {
                tracing::warn!(
                    "repo{n}: gap record {}-{} not written yet: {e}",
                    gap.first,
                    gap.last
                );
                all = false;
            }
        }
        if all {
            let _ = fs::remove_file(&p);
        }
    }
}

/// Drops `names` (segments waiting to be archived) because the queue passed its limit:
/// records the gaps (one per run of consecutive segments) in the spool, durably, then in the
/// repositories when they answer; returns the warning each acknowledgement carries.
///
/// Errors: the spool record cannot be written (then nothing is dropped).
pub fn drop_segments(
    spool: &Spool,
    archiver: &Archiver,
    names: &[String],
    seg_size: u64,
    reason: &str,
) -> Result<String> {
    let mut runs: Vec<(String, String, u64)> = Vec::new();
    let mut prev: Option<(u32, u64)> = None;
    for n in names {
        let cur = lsn::parse_wal_segment_name(n, seg_size);
        match (runs.last_mut(), prev, cur) {
            (Some(run), Some((pt, ps)), Some((t, sn))) if pt == t && ps + 1 == sn => {
                run.1 = n.clone();
                run.2 += 1;
            }
            _ => runs.push((n.clone(), n.clone(), 1)),
        }
        prev = cur;
    }
    let recorded = crate::repo::rfc3339(chrono::Utc::now());
    for (first, last, count) in &runs {
        let gap = Gap {
            first: first.clone(),
            last: last.clone(),
            segments: *count,
            recorded: recorded.clone(),
            reason: reason.to_string(),
        };
        let p = spool.gap_dir().join(format!("{first}-{last}.json"));
        let json = serde_json::to_vec_pretty(&gap)
            .map_err(|e| Error::Other("cannot encode a gap record".into()).because(e))?;
        let tmp = p.with_extension("tmp");
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::io::fs::FILE_MODE)
            .open(&tmp)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, &json)?;
                f.sync_all()
            })
            .and_then(|_| fs::rename(&tmp, &p))
            .map_err(|e| Error::io("write", &p, e))?;
    }
    crate::io::fs::fsync_dir(&spool.gap_dir())?;
    flush_gaps(spool, archiver);
    let what = runs
        .iter()
        .map(|(f, l, _)| {
            if f == l {
                f.clone()
            } else {
                format!("{f} to {l}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "WAL DROPPED: {} segment(s) ({what}) were not archived because {reason}; the gap is recorded in the repository: no point-in-time recovery can cross it, take a new backup",
        names.len()
    ))
}

/// Bytes of WAL `names` hold in `wal_dir` (their sizes on disk; a file that vanished counts 0).
pub fn queued_bytes(wal_dir: &Path, names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|n| fs::metadata(wal_dir.join(n)).ok())
        .map(|m| m.len())
        .sum()
}

/// The WAL segment size of a queue: the size of its first segment file (PostgreSQL's
/// segments are all one size), or 16 MiB.
pub fn segment_size(wal_dir: &Path, names: &[String]) -> u64 {
    names
        .iter()
        .filter(|n| lsn::is_wal_segment_name(n))
        .find_map(|n| fs::metadata(wal_dir.join(n)).ok())
        .map(|m| m.len())
        .unwrap_or(16 << 20)
}

/// Synchronous archive-push with a queue limit: when the WAL waiting in `archive_status`
/// (this file included) passes `max` bytes, a segment is dropped instead of archived, and the
/// gap recorded. Returns the warning when it dropped the file.
pub fn drop_if_queue_full(
    s: &ArchiveConfig,
    archiver: &Archiver,
    path: &Path,
    max: u64,
) -> Result<Option<String>> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if WalFile::parse(name)?.kind != WalFileKind::Segment {
        return Ok(None);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let ready = match ready_files(dir) {
        Ok(r) => r,
        // No archive_status next to the file: not PostgreSQL's queue, nothing to measure.
        Err(_) => return Ok(None),
    };
    let size = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let queued = size * ready.len().max(1) as u64;
    if queued <= max {
        return Ok(None);
    }
    let spool = Spool::open(s, archiver.stanza())?;
    let reason = format!(
        "archive-push-queue-max ({}) was exceeded: {} waited to be archived",
        mib(max),
        mib(queued)
    );
    drop_segments(&spool, archiver, &[name.to_string()], size, &reason).map(Some)
}

/// What the archive-push queue and the spool show on this host, for one stanza.
#[derive(Debug, Default, PartialEq)]
pub struct QueueView {
    /// Segments (and other WAL files) PostgreSQL marked ready and pgjet has not archived.
    pub ready: u64,
    /// Seconds since the oldest of them was marked (0 when none).
    pub oldest_age: f64,
    /// Error files in the spool (a segment's last attempt failed, or the pusher could not
    /// start).
    pub errors: u64,
    /// Unix seconds of the newest of them (None when none).
    pub last_error: Option<f64>,
}

/// The queue of `pg_wal/archive_status` under `pg_path` and the error files of the
/// asynchronous pusher in `spool_out` (`<spool-path>/archive/<stanza>/out`); a missing
/// directory counts as empty. Errors: none (unreadable entries are skipped).
pub fn queue_view(
    pg_path: &std::path::Path,
    spool_out: &std::path::Path,
    now: std::time::SystemTime,
) -> QueueView {
    let modified = |p: std::path::PathBuf| std::fs::metadata(p).ok()?.modified().ok();
    let wal = pg_path.join("pg_wal");
    let ready = ready_files(&wal).unwrap_or_default();
    let status = wal.join("archive_status");
    let oldest = ready
        .iter()
        .filter_map(|n| modified(status.join(format!("{n}.ready"))))
        .min();
    let errors: Vec<std::time::SystemTime> = std::fs::read_dir(spool_out)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".error"))
        .filter_map(|e| modified(e.path()))
        .collect();
    QueueView {
        ready: ready.len() as u64,
        oldest_age: oldest
            .and_then(|t| now.duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64().round()),
        errors: errors.len() as u64,
        last_error: errors.iter().max().and_then(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs() as f64)
        }),
    }
}
