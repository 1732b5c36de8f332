//! Asynchronous archive-push: the foreground waits for an acknowledgement in the spool; one
//! background pusher per stanza pushes ready WAL ahead of PostgreSQL's archiver.
//!
//! PostgreSQL's archiver runs `archive-push %p` for one file at a time. In asynchronous mode
//! that foreground command only waits for the file's acknowledgement; one background pusher
//! per stanza (kept single by the lock, started by the foreground when none runs) scans
//! `pg_wal/archive_status/*.ready` ahead of the archiver and pushes up to `--jobs` files at
//! once over the connections it keeps, writing an acknowledgement per file only once the file
//! is durable in every repository. A kill -9 of the pusher at any moment loses nothing: what
//! has no `.ok` is pushed again (and found already archived), and the lock dies with it.
use super::push::{resolve_path, wal_file_identity, Archiver};
use super::queue::{drop_segments, flush_gaps, queued_bytes, ready_files, segment_size};
use super::spool::{
    ensure_running, settings_fingerprint, write_lock_owner, Spool, ACK_POLL, IDLE_EXIT, SCAN_EVERY,
};
use crate::error::{Error, Result};
use crate::io::mib;
use crate::options::ArchiveConfig;
use crate::repo::wal::{WalFile, WalFileKind};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The hidden command that runs the background pusher for a `pg_wal` directory
/// (`archive-push-async WAL_DIR`, started by the foreground).
pub const PUSH_COMMAND: &str = "archive-push-async";

/// How long a failed file waits before the background pusher tries it again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Starts the background pusher for `wal_path`'s pg_wal directory unless one runs.
fn ensure_background(s: &ArchiveConfig, spool: &Spool, wal_path: &Path) -> Result<()> {
    let wal_dir = wal_path.parent().unwrap_or(Path::new("."));
    ensure_running(s, spool, "push", PUSH_COMMAND, wal_dir.as_os_str()).map(|_| ())
}

/// The foreground of asynchronous `archive-push`: returns once the background pusher has
/// acknowledged `wal_path`'s file, starting a pusher when none runs.
///
/// Errors: the pusher's error for this file (the `.error` file is removed, so the next call
/// waits for a new attempt) or its start-up error; no acknowledgement within
/// archive-timeout ([`Error::Unsafe`]).
pub fn push_foreground(s: &ArchiveConfig, wal_path: &Path) -> Result<()> {
    let stanza = s.stanza()?;
    let spool = Spool::open(s, stanza)?;
    let r = wait_for_ack(s, &spool, wal_path);
    if r.is_err() {
        // PostgreSQL's archiver may now wait up to a minute: the pusher wakes it once the
        // repositories take WAL again.
        let _ = crate::io::fs::write_whole(&spool.archiver_failed(), b"", crate::io::fs::FILE_MODE);
    }
    r
}

/// [`push_foreground`]'s wait for the acknowledgement of `wal_path`.
fn wait_for_ack(s: &ArchiveConfig, spool: &Spool, wal_path: &Path) -> Result<()> {
    let path = resolve_path(wal_path);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Config(format!("{} names no WAL file", path.display())))?
        .to_string();
    WalFile::parse(&name)?;
    spool.check_space()?;
    let (ok, err, global) = (
        spool.ack(&name, "ok"),
        spool.ack(&name, "error"),
        spool.ack("global", "error"),
    );
    let t = Instant::now();
    let mut next_check = t;
    let mut identity: Option<String> = None;
    loop {
        if let Ok(text) = fs::read_to_string(&ok) {
            // The acknowledgement must name these bytes: one left from another cluster or a
            // restored copy with the same file name is removed, and the file pushed.
            let me = match &identity {
                Some(i) => i.clone(),
                None => identity.insert(wal_file_identity(&path)?).clone(),
            };
            let (first, rest) = text.split_once('\n').unwrap_or((text.as_str(), ""));
            if first.trim() == me {
                // The pusher removes it once PostgreSQL has marked the file done.
                if !rest.trim().is_empty() {
                    tracing::warn!("{}", rest.trim());
                }
                tracing::debug!("{name} acknowledged after {} ms", t.elapsed().as_millis());
                return Ok(());
            }
            tracing::warn!(
                "{name}: the spool held an acknowledgement for other bytes ({}); pushing this file",
                first.trim()
            );
            let _ = fs::remove_file(&ok);
        }
        for e in [&err, &global] {
            if let Ok(text) = fs::read_to_string(e) {
                let _ = fs::remove_file(e);
                return Err(Error::Other(format!(
                    "asynchronous archive-push of {name} failed: {}",
                    text.trim()
                )));
            }
        }
        if Instant::now() >= next_check {
            ensure_background(s, spool, &path)?;
            next_check = Instant::now() + Duration::from_secs(1);
        }
        if t.elapsed().as_secs_f64() > s.archive.timeout {
            spool.check_space()?;
            return Err(Error::Unsafe(format!(
                "{name} was not acknowledged by the background pusher within {} s (archive-timeout); see {}",
                s.archive.timeout,
                spool.log("push").display()
            )));
        }
        std::thread::sleep(ACK_POLL);
    }
}

/// Removes `out/<file>.ok` and `.error` of files no longer ready to archive (PostgreSQL
/// marked them done, or they are from another cluster) and not in flight.
fn remove_stale_acks(spool: &Spool, ready: &HashSet<&str>, in_flight: &HashSet<String>) {
    let Ok(rd) = fs::read_dir(spool.dir.join("out")) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        let Some(base) = n.strip_suffix(".ok").or_else(|| n.strip_suffix(".error")) else {
            continue;
        };
        if base != "global" && !ready.contains(base) && !in_flight.contains(base) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// What the background pusher knows of the files it was given.
#[derive(Default)]
struct Queue {
    /// Handed to a worker, no result yet.
    in_flight: HashSet<String>,
    /// Failed: not before this instant again.
    retry: HashMap<String, Instant>,
}

impl Queue {
    /// A worker's result: the acknowledgement (`.ok` naming the bytes, once durable
    /// everywhere) or the error.
    fn finished(&mut self, spool: &Spool, name: String, r: Result<String, String>) -> Result<()> {
        self.in_flight.remove(&name);
        match r {
            Ok(identity) => {
                spool.write_ack(&name, "ok", &format!("{identity}\n"))?;
                let _ = fs::remove_file(spool.ack(&name, "error"));
                self.retry.remove(&name);
            }
            Err(msg) => {
                tracing::error!("{name}: {msg}");
                spool.write_ack(&name, "error", &msg)?;
                self.retry.insert(name, Instant::now() + RETRY_AFTER);
            }
        }
        Ok(())
    }

    /// Hands the `waiting` files that are neither in flight nor waiting for a retry to the
    /// workers, until `limit` are in flight. True when it handed out any.
    ///
    /// Errors: the workers have stopped.
    fn hand_out(
        &mut self,
        waiting: &[String],
        limit: usize,
        work_tx: &crossbeam_channel::Sender<String>,
    ) -> Result<bool> {
        let now = Instant::now();
        let mut sent = false;
        for n in waiting {
            if self.in_flight.len() >= limit {
                break;
            }
            if self.in_flight.contains(n) || self.retry.get(n).map(|t| *t > now).unwrap_or(false) {
                continue;
            }
            self.in_flight.insert(n.clone());
            if work_tx.send(n.clone()).is_err() {
                return Err(Error::Other("the push workers stopped".into()));
            }
            sent = true;
        }
        Ok(sent)
    }
}

/// A push worker's result: the file name with the identity of its bytes, or the error
/// message.
type PushResult = (String, Result<String, String>);

/// The background pusher: pushes every ready file of `wal_dir` with up to `--jobs` at once
/// until it has been idle for [`IDLE_EXIT`] (or the directory is gone). Returns at once when
/// another pusher holds the lock.
///
/// Errors: the spool cannot be used; the repositories cannot be opened (written to
/// `global.error` for the foreground too).
pub fn push_background(s: &ArchiveConfig, wal_dir: &Path) -> Result<()> {
    let stanza = s.stanza()?;
    let spool = Spool::open(s, stanza)?;
    let Some(mut lock) = spool.try_lock("push")? else {
        return Ok(());
    };
    let _ = write_lock_owner(&mut lock, &settings_fingerprint(s));
    let Some(archiver) = open_archiver(s, &spool, wal_dir)? else {
        return Ok(());
    };
    tracing::info!(
        "background pusher for {} started ({} job(s))",
        wal_dir.display(),
        s.jobs
    );
    flush_gaps(&spool, &archiver);
    let (work_tx, work_rx) = crossbeam_channel::unbounded::<String>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<PushResult>();
    let workers = spawn_workers(s.jobs, &archiver, wal_dir, &work_rx, &done_tx);
    drop(done_tx);
    let mut q = Queue::default();
    let mut idle_since = Instant::now();
    let mut last_gap_flush = Instant::now();
    let mut last_clean = Instant::now() - Duration::from_secs(2);
    loop {
        // Results first: each acknowledgement as soon as its file is durable everywhere.
        while let Ok((name, r)) = done_rx.try_recv() {
            q.finished(&spool, name, r)?;
        }
        if !wal_dir.join("archive_status").is_dir() {
            tracing::info!("{} is gone; the background pusher stops", wal_dir.display());
            break;
        }
        let ready = ready_files(wal_dir)?;
        let ready_set: HashSet<&str> = ready.iter().map(String::as_str).collect();
        q.retry.retain(|n, _| ready_set.contains(n.as_str()));
        // Acknowledgements of files PostgreSQL has marked done go (once a second).
        if last_clean.elapsed() > Duration::from_secs(1) {
            remove_stale_acks(&spool, &ready_set, &q.in_flight);
            last_clean = Instant::now();
        }
        let waiting: Vec<String> = ready
            .iter()
            .filter(|n| !spool.ack(n, "ok").exists())
            .cloned()
            .collect();
        if let Some(max) = s.archive.push_queue_max {
            if drop_over_limit(&spool, &archiver, wal_dir, &waiting, &q, max)? {
                continue;
            }
        }
        wake_archiver_if_failed(&spool, wal_dir, &ready);
        let sent = q.hand_out(&waiting, s.jobs * 2, &work_tx)?;
        if last_gap_flush.elapsed() > Duration::from_secs(5) {
            flush_gaps(&spool, &archiver);
            last_gap_flush = Instant::now();
        }
        if waiting.is_empty() && q.in_flight.is_empty() {
            if idle_since.elapsed() > IDLE_EXIT {
                break;
            }
        } else {
            idle_since = Instant::now();
        }
        if !sent {
            // Wake for a result at once, else rescan after SCAN_EVERY.
            if let Ok((name, r)) = done_rx.recv_timeout(SCAN_EVERY) {
                q.finished(&spool, name, r)?;
            }
        }
    }
    drop(work_tx);
    for w in workers {
        let _ = w.join();
    }
    flush_gaps(&spool, &archiver);
    tracing::info!("background pusher for {} ends", wal_dir.display());
    Ok(())
}

/// Opens the repositories to push to. A failure is written to the spool's `global.error` for
/// the foreground and the open tried again (after 1 s, doubling up to 5 s) while `wal_dir`
/// has files ready to archive: a pusher that ended would leave no one to notice the
/// repositories coming back while PostgreSQL's archiver waits its minute. None once nothing
/// is ready any more.
///
/// Errors: the spool cannot be written.
fn open_archiver(
    s: &ArchiveConfig,
    spool: &Spool,
    wal_dir: &Path,
) -> Result<Option<Arc<Archiver>>> {
    let mut wait = RETRY_AFTER;
    loop {
        match Archiver::open(s) {
            Ok(a) => {
                let _ = fs::remove_file(spool.ack("global", "error"));
                return Ok(Some(Arc::new(a)));
            }
            Err(e) => {
                tracing::error!("cannot open the repositories, retrying: {e}");
                spool.write_ack("global", "error", &e.to_string())?;
            }
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_secs(5));
        if crate::io::cancel::cancelled().is_some()
            || ready_files(wal_dir).map_or(true, |r| r.is_empty())
        {
            return Ok(None);
        }
    }
}

/// Wakes PostgreSQL's archiver ([`crate::pg::archiver::wake_archiver`]) when a foreground
/// failed a file since the last wake and the oldest file ready now (the one the archiver
/// takes first) has its acknowledgement: the archiver, possibly waiting up to 60 s after
/// three failures, then goes through the acknowledged files at once.
fn wake_archiver_if_failed(spool: &Spool, wal_dir: &Path, ready: &[String]) {
    let mark = spool.archiver_failed();
    if !mark.exists()
        || !ready
            .iter()
            .min()
            .is_some_and(|n| spool.ack(n, "ok").exists())
    {
        return;
    }
    let _ = fs::remove_file(&mark);
    let data_dir = wal_dir.parent().unwrap_or(Path::new("."));
    match crate::pg::archiver::wake_archiver(data_dir) {
        Ok(Some(pid)) => tracing::info!(
            "woke PostgreSQL's archiver (PID {pid}): the repositories take WAL again"
        ),
        Ok(None) => tracing::debug!("no archiver of {} to wake", data_dir.display()),
        Err(e) => tracing::warn!("{e}"),
    }
}

/// Starts `jobs` push workers: each takes file names from `work`, pushes that file of
/// `wal_dir` with its own compressor and buffer, and sends the result to `done`. A worker
/// ends when `work` closes or `done` has no receiver (or when it cannot get a compressor).
fn spawn_workers(
    jobs: usize,
    archiver: &Arc<Archiver>,
    wal_dir: &Path,
    work: &crossbeam_channel::Receiver<String>,
    done: &crossbeam_channel::Sender<PushResult>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut workers = Vec::new();
    for _ in 0..jobs {
        let (rx, tx, a, dir) = (
            work.clone(),
            done.clone(),
            archiver.clone(),
            wal_dir.to_path_buf(),
        );
        workers.push(std::thread::spawn(move || {
            let mut c = match a.compressor() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("{e}");
                    return;
                }
            };
            let mut buf = Vec::new();
            for name in rx {
                let r = a.push(&dir.join(&name), &mut c, &mut buf).map_err(|e| {
                    tracing::info!("{}", e.hint());
                    e.to_string()
                });
                if tx.send((name, r)).is_err() {
                    return;
                }
            }
        }));
    }
    workers
}

/// `archive-push-queue-max`: when the files `waiting` in `wal_dir` add up to more than `max`
/// bytes, the segments among them not in flight are dropped (a gap record in the archive,
/// a warning) and acknowledged with the warning, so PostgreSQL can recycle them. True when
/// it dropped some.
///
/// Errors: the gap record or an acknowledgement cannot be written, a file cannot be read.
fn drop_over_limit(
    spool: &Spool,
    archiver: &Archiver,
    wal_dir: &Path,
    waiting: &[String],
    q: &Queue,
    max: u64,
) -> Result<bool> {
    let queued = queued_bytes(wal_dir, waiting);
    if queued <= max {
        return Ok(false);
    }
    let droppable: Vec<String> = waiting
        .iter()
        .filter(|n| !q.in_flight.contains(*n))
        .filter(|n| {
            WalFile::parse(n)
                .map(|f| f.kind == WalFileKind::Segment)
                .unwrap_or(false)
        })
        .cloned()
        .collect();
    if droppable.is_empty() {
        return Ok(false);
    }
    let seg = segment_size(wal_dir, &droppable);
    let reason = format!(
        "archive-push-queue-max ({}) was exceeded: {} waited to be archived",
        mib(max),
        mib(queued)
    );
    let warning = drop_segments(spool, archiver, &droppable, seg, &reason)?;
    tracing::warn!("{warning}");
    for n in &droppable {
        let identity = wal_file_identity(&wal_dir.join(n))?;
        spool.write_ack(n, "ok", &format!("{identity}\n{warning}\n"))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::spool::test_settings as settings;

    #[test]
    fn the_foreground_gives_up_after_archive_timeout_and_drops_a_stale_acknowledgement() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), 1.0);
        let name = "000000010000000000000001";
        let wal = dir.path().join(name);
        fs::write(&wal, vec![7u8; 8192]).unwrap();
        let spool = Spool::open(&s, "main").unwrap();
        // A pusher that never answers: its lock is held, with no owner written (so the
        // foreground neither replaces nor starts one).
        let _held = spool.try_lock("push").unwrap().expect("the lock is free");
        // An acknowledgement for other bytes under this name (another cluster's).
        spool
            .write_ack(
                name,
                "ok",
                &format!("{}\n", super::super::push::wal_identity(b"other")),
            )
            .unwrap();
        let t = Instant::now();
        let e = push_foreground(&s, &wal).unwrap_err();
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
            "waited {waited:?}"
        );
        assert!(
            matches!(e, Error::Unsafe(_)) && e.to_string().contains("archive-timeout"),
            "{e}"
        );
        assert!(
            !spool.ack(name, "ok").exists(),
            "the stale acknowledgement stays"
        );

        // The pusher's acknowledgement of these bytes: accepted at once.
        spool
            .write_ack(
                name,
                "ok",
                &format!("{}\n", super::super::push::wal_identity(&[7u8; 8192])),
            )
            .unwrap();
        push_foreground(&s, &wal).unwrap();
        // An error acknowledgement reaches the caller, and goes (the next call waits anew).
        spool
            .write_ack(name, "error", "repo1: permission denied")
            .unwrap();
        let _ = fs::remove_file(spool.ack(name, "ok"));
        let e = push_foreground(&s, &wal).unwrap_err();
        assert!(e.to_string().contains("permission denied"), "{e}");
        assert!(!spool.ack(name, "error").exists());
    }
}
