//! Asynchronous archiving through the spool directory (`archive-async=y`).
//!
//! ```text
//! <spool-path>/archive/<stanza>/out/<file>.ok     acknowledged: durable in every repository
//!                                                 (or dropped by the queue limit: the file
//!                                                 then holds the warning)
//! <spool-path>/archive/<stanza>/out/<file>.error  the last attempt failed: the message
//! <spool-path>/archive/<stanza>/out/global.error  the background pusher could not start
//! <spool-path>/archive/<stanza>/push.lock         flock(2) held by the background pusher
//! <spool-path>/archive/<stanza>/push.log          its log
//! <spool-path>/archive/<stanza>/gap/<first>-<last>.json  gap records not yet in a repository
//! ```
//!
//! PostgreSQL's archiver runs `archive-push %p` for one file at a time. In asynchronous mode
//! that foreground command only waits for the file's acknowledgement; one background pusher
//! per stanza (kept single by the lock, started by the foreground when none runs) scans
//! `pg_wal/archive_status/*.ready` ahead of the archiver and pushes up to `--jobs` files at
//! once over the connections it keeps, writing an acknowledgement per file only once the file
//! is durable in every repository. A kill -9 of the pusher at any moment loses nothing: what
//! has no `.ok` is pushed again (and found already archived), and the lock dies with it.
use super::archive_push::{resolve_path, Archiver};
use super::*;
use crate::repo::wal::{self, Gap, WalFile, WalFileKind};
use std::collections::{HashMap, HashSet};
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

/// The hidden command that runs the background pusher for a `pg_wal` directory
/// (`archive-push-async WAL_DIR`, started by the foreground).
pub const PUSH_COMMAND: &str = "archive-push-async";

/// How long the background pusher (and the prefetcher, without a new request) stays with
/// nothing to do before it exits; the next foreground starts another. 2 s in unit tests,
/// which run a prefetcher in a thread and wait for it to end.
pub const IDLE_EXIT: Duration = Duration::from_secs(if cfg!(test) { 2 } else { 10 });

/// How often the background pusher scans archive_status when idle, and how often the
/// foreground looks for its acknowledgement: short, because PostgreSQL's archiver waits for
/// the foreground.
const SCAN_EVERY: Duration = Duration::from_millis(5);
const ACK_POLL: Duration = Duration::from_millis(2);

/// How long a failed file waits before the background pusher tries it again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The spool directory of one stanza.
pub struct Spool {
    dir: PathBuf,
}

impl Spool {
    /// Opens (creating if needed) `<spool-path>/archive/<stanza>` with `out/` and `gap/`.
    ///
    /// Errors: [`Error::Io`] when the spool path cannot be created (it must belong to the
    /// cluster's OS user).
    pub fn open(s: &Settings, stanza: &str) -> Result<Spool> {
        let dir = s.archive.spool_path.join("archive").join(stanza);
        for d in [dir.join("out"), dir.join("gap")] {
            fs::create_dir_all(&d).map_err(|e| Error::io("create spool directory", &d, e))?;
        }
        Ok(Spool { dir })
    }

    /// `out/<name>.<ext>`.
    pub fn ack(&self, name: &str, ext: &str) -> PathBuf {
        self.dir.join("out").join(format!("{name}.{ext}"))
    }

    /// Writes an acknowledgement (or error) file whole: a temporary file renamed into place.
    fn write_ack(&self, name: &str, ext: &str, text: &str) -> Result<()> {
        let p = self.ack(name, ext);
        super::archive_get::write_whole(&p, text.as_bytes())
    }

    /// Takes `<name>.lock` with flock(2) without waiting: Some(file) while held, None when
    /// another process holds it. The kernel releases it when the holder dies.
    pub fn try_lock(&self, name: &str) -> Result<Option<fs::File>> {
        let p = self.dir.join(format!("{name}.lock"));
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| Error::io("open", &p, e))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            Ok(Some(f))
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Ok(None)
            } else {
                Err(Error::io("lock", &p, e))
            }
        }
    }

    /// Path of a background process's log.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn gap_dir(&self) -> PathBuf {
        self.dir.join("gap")
    }
}

/// A fingerprint of this invocation's resolved settings (flags, `PGJET_*` environment and
/// config file together): a background process started with other settings (the
/// archive_command or pgjet.conf changed) is replaced.
fn settings_fingerprint(s: &Settings) -> String {
    format!(
        "{:032x}",
        xxhash_rust::xxh3::xxh3_128(format!("{s:?}").as_bytes())
    )
}

/// Records in the held lock file `lock` which process holds it, with which settings, and a
/// token unique to this process's lifetime: `<pid> <fingerprint> <token>`. Returns the token
/// (the prefetcher marks what it writes with it; a PID alone may come again after a reboot).
fn write_lock_owner(lock: &mut fs::File, fingerprint: &str) -> String {
    use std::io::{Seek, Write};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let token = format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(
            format!("{} {} {fingerprint}", std::process::id(), now.as_nanos()).as_bytes()
        )
    );
    let _ = lock.set_len(0);
    let _ = lock.seek(std::io::SeekFrom::Start(0));
    let _ = writeln!(lock, "{} {fingerprint} {token}", std::process::id());
    token
}

/// What lock `name`'s file says of its last holder ([`write_lock_owner`]): PID (0 when
/// unreadable), settings fingerprint and token (empty when not written).
fn lock_owner(spool: &Spool, name: &str) -> (i32, String, String) {
    let owner = fs::read_to_string(spool.dir.join(format!("{name}.lock"))).unwrap_or_default();
    let mut it = owner.split_whitespace();
    let pid = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let fingerprint = it.next().unwrap_or("").to_string();
    (pid, fingerprint, it.next().unwrap_or("").to_string())
}

/// Starts the background process `name` ("push" or "get") unless one runs with the same
/// settings; one that runs with other settings is stopped (SIGTERM: like a kill -9, it
/// leaves nothing half-done) and replaced. True when it started one.
fn ensure_running(
    s: &Settings,
    spool: &Spool,
    name: &str,
    command: &str,
    value: &std::ffi::OsStr,
) -> Result<bool> {
    let mine = settings_fingerprint(s);
    if spool.try_lock(name)?.is_none() {
        let (pid, theirs, _) = lock_owner(spool, name);
        if pid <= 0 || theirs.is_empty() || theirs == mine {
            return Ok(false);
        }
        tracing::info!(
            "the background {name} process (PID {pid}) runs with other settings: replacing it"
        );
        // SAFETY: kill(2) with a PID read from our own lock file; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let freed = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            spool.try_lock(name).map(|l| l.is_some()).unwrap_or(false)
        });
        if !freed {
            return Ok(false);
        }
    }
    // The lock was free (and is released again here): start one. Should two starts race,
    // the second finds the lock taken and exits.
    spawn_self(s, spool, name, command, value).map(|_| true)
}

/// Starts the background pusher for `wal_path`'s pg_wal directory unless one runs.
fn ensure_background(s: &Settings, spool: &Spool, wal_path: &Path) -> Result<()> {
    let wal_dir = wal_path.parent().unwrap_or(Path::new("."));
    ensure_running(s, spool, "push", PUSH_COMMAND, wal_dir.as_os_str()).map(|_| ())
}

/// The foreground of asynchronous `archive-push`: returns once the background pusher has
/// acknowledged `wal_path`'s file, starting a pusher when none runs.
///
/// Errors: the pusher's error for this file (the `.error` file is removed, so the next call
/// waits for a new attempt) or its start-up error; no acknowledgement within
/// archive-timeout ([`Error::Unsafe`]).
pub fn push_foreground(s: &Settings, wal_path: &Path) -> Result<()> {
    let stanza = s.stanza()?;
    let path = resolve_path(wal_path);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Config(format!("{} names no WAL file", path.display())))?
        .to_string();
    WalFile::parse(&name)?;
    let spool = Spool::open(s, stanza)?;
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
                None => identity
                    .insert(super::archive_push::wal_file_identity(&path)?)
                    .clone(),
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
            ensure_background(s, &spool, &path)?;
            next_check = Instant::now() + Duration::from_secs(1);
        }
        if t.elapsed().as_secs_f64() > s.archive.timeout {
            return Err(Error::Unsafe(format!(
                "{name} was not acknowledged by the background pusher within {} s (archive-timeout); see {}",
                s.archive.timeout,
                spool.log("push").display()
            )));
        }
        std::thread::sleep(ACK_POLL);
    }
}

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
        for (n, store) in archiver.repos() {
            if let Err(e) = wal::record_gap(&**store, archiver.stanza(), &gap) {
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
    let recorded = rfc3339(chrono::Utc::now());
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
            .map_err(|e| Error::Other(format!("cannot encode a gap record: {e}")))?;
        let tmp = p.with_extension("tmp");
        fs::File::create(&tmp)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, &json)?;
                f.sync_all()
            })
            .and_then(|_| fs::rename(&tmp, &p))
            .map_err(|e| Error::io("write", &p, e))?;
    }
    crate::storage::posix::fsync_dir(&spool.gap_dir())?;
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

/// Bytes of WAL `names` hold in `wal_dir` (their sizes on disk; a file that vanished counts 0).
fn queued_bytes(wal_dir: &Path, names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|n| fs::metadata(wal_dir.join(n)).ok())
        .map(|m| m.len())
        .sum()
}

/// The WAL segment size of a queue: the size of its first segment file (PostgreSQL's
/// segments are all one size), or 16 MiB.
fn segment_size(wal_dir: &Path, names: &[String]) -> u64 {
    names
        .iter()
        .filter(|n| lsn::is_wal_segment_name(n))
        .find_map(|n| fs::metadata(wal_dir.join(n)).ok())
        .map(|m| m.len())
        .unwrap_or(16 << 20)
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
}

/// The background pusher: pushes every ready file of `wal_dir` with up to `--jobs` at once
/// until it has been idle for [`IDLE_EXIT`] (or the directory is gone). Returns at once when
/// another pusher holds the lock.
///
/// Errors: the spool cannot be used; the repositories cannot be opened (written to
/// `global.error` for the foreground too).
pub fn push_background(s: &Settings, wal_dir: &Path) -> Result<()> {
    let stanza = s.stanza()?;
    let spool = Spool::open(s, stanza)?;
    let Some(mut lock) = spool.try_lock("push")? else {
        return Ok(());
    };
    let _ = write_lock_owner(&mut lock, &settings_fingerprint(s));
    let archiver = match Archiver::open(s) {
        Ok(a) => std::sync::Arc::new(a),
        Err(e) => {
            let _ = spool.write_ack("global", "error", &e.to_string());
            return Err(e);
        }
    };
    let _ = fs::remove_file(spool.ack("global", "error"));
    tracing::info!(
        "background pusher for {} started ({} job(s))",
        wal_dir.display(),
        s.jobs
    );
    flush_gaps(&spool, &archiver);
    let (work_tx, work_rx) = crossbeam_channel::unbounded::<String>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<(String, Result<String, String>)>();
    let mut workers = Vec::new();
    for _ in 0..s.jobs {
        let (rx, tx, a, dir) = (
            work_rx.clone(),
            done_tx.clone(),
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
            let queued = queued_bytes(wal_dir, &waiting);
            if queued > max {
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
                if !droppable.is_empty() {
                    let seg = segment_size(wal_dir, &droppable);
                    let reason = format!(
                        "archive-push-queue-max ({}) was exceeded: {} waited to be archived",
                        mib(max),
                        mib(queued)
                    );
                    let warning = drop_segments(&spool, &archiver, &droppable, seg, &reason)?;
                    tracing::warn!("{warning}");
                    for n in &droppable {
                        let identity = super::archive_push::wal_file_identity(&wal_dir.join(n))?;
                        spool.write_ack(n, "ok", &format!("{identity}\n{warning}\n"))?;
                    }
                    continue;
                }
            }
        }
        let now = Instant::now();
        let mut sent = false;
        for n in &waiting {
            if q.in_flight.len() >= s.jobs * 2 {
                break;
            }
            if q.in_flight.contains(n) || q.retry.get(n).map(|t| *t > now).unwrap_or(false) {
                continue;
            }
            q.in_flight.insert(n.clone());
            if work_tx.send(n.clone()).is_err() {
                return Err(Error::Other("the push workers stopped".into()));
            }
            sent = true;
        }
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

/// The hidden command that runs the background prefetcher (`archive-get-async
/// FIRST_REQUEST`): its argument is the request (`<segment> <pid>`, as in `.requested`) of
/// the foreground that started it, which fetches that segment itself; the prefetcher reads
/// the segment size from the stanza.
pub const GET_COMMAND: &str = "archive-get-async";

/// `in/` of the spool: segments fetched ahead, checked and decompressed, and `.requested`,
/// the last segment PostgreSQL asked for and the asking foreground's PID.
fn in_dir(spool: &Spool) -> PathBuf {
    spool.dir.join("in")
}

/// Starts the prefetcher unless one runs ([`GET_COMMAND`] `request`, same options); true
/// when it started one.
fn ensure_prefetcher(s: &Settings, spool: &Spool, request: &str) -> Result<bool> {
    ensure_running(s, spool, "get", GET_COMMAND, std::ffi::OsStr::new(request))
}

/// Starts this binary again as `<options given on the command line> command -- value`, in a
/// session of its own (the environment is inherited), its output appended to the spool's
/// `<log>.log`.
fn spawn_self(
    s: &Settings,
    spool: &Spool,
    log: &str,
    command: &str,
    value: &std::ffi::OsStr,
) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::io("locate", "pgjet", e))?;
    let log_path = spool.log(log);
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| Error::io("open", &log_path, e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io("open", &log_path, e))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(s.command_line_flags())
        .args([
            std::ffi::OsStr::new(command),
            std::ffi::OsStr::new("--"),
            value,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid() in the child before exec is async-signal-safe and touches no memory.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| Error::io("start a background process", &log_path, e))?;
    tracing::debug!(
        "started a background {log} process (log {})",
        log_path.display()
    );
    Ok(())
}

/// Moves a prefetched file to `dest`: a rename when both are on one filesystem, else a copy
/// through a temporary file and a rename. False when `src` is gone (the caller fetches the
/// file itself).
fn move_into(src: &Path, dest: &Path) -> Result<bool> {
    match fs::rename(src, dest) {
        Ok(()) => return Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(_) => {}
    }
    let data = match fs::read(src) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io("read", src, e)),
    };
    super::archive_get::write_whole(dest, &data)?;
    let _ = fs::remove_file(src);
    Ok(true)
}

/// The foreground of asynchronous `archive-get`: serves `wal_file` from the spool when the
/// prefetcher has it, else from the repositories, and keeps the prefetcher running for the
/// segments after it.
///
/// Errors: as [`super::archive_get::run`].
pub fn get_foreground(
    s: &Settings,
    wal_file: &str,
    dest: &Path,
) -> Result<super::archive_get::GetOutcome> {
    use super::archive_get::GetOutcome;
    let stanza = s.stanza()?;
    let file = WalFile::parse(wal_file)?;
    if file.kind != WalFileKind::Segment {
        return super::archive_get::fetch_direct(s, &file, dest);
    }
    let spool = Spool::open(s, stanza)?;
    let dir = in_dir(&spool);
    fs::create_dir_all(&dir).map_err(|e| Error::io("create spool directory", &dir, e))?;
    let requested = dir.join(".requested");
    // `<segment> <pid>`: each request differs, even for the same segment.
    let request = format!("{wal_file} {}", std::process::id());
    super::archive_get::write_whole(&requested, request.as_bytes())?;
    let dest = resolve_path(dest);
    let spooled = dir.join(wal_file);
    let t = Instant::now();
    let running = spool.try_lock("get")?.is_none();
    // Started (or replaced, when its settings differ) before this segment is fetched: it
    // opens its connections and fetches the next segments meanwhile (not this one, which is
    // fetched here). It learns the segment size from the stanza. It only saves time: when it
    // cannot be started, this segment is still fetched here.
    let started = ensure_prefetcher(s, &spool, &request).unwrap_or_else(|e| {
        tracing::warn!("cannot start the archive-get prefetcher: {e}");
        false
    });
    let live = running && !started;
    // A prefetcher that was running may be fetching it right now: wait a little for it (or
    // for its note that the archive lacks it) before fetching it here.
    if live {
        let t = Instant::now();
        while t.elapsed() < PREFETCH_WAIT
            && !spooled.exists()
            && !missing_marker(&dir, wal_file).exists()
        {
            std::thread::sleep(ACK_POLL);
        }
    }
    // Served from the spool only when the prefetcher that was running wrote it: its mark
    // names that process's token and the file's size. A file left by an earlier prefetcher
    // (a crash, a reboot; the lock file still names it until a new one starts) is never
    // served; the running one fetched and checked these bytes itself.
    let mark = mark_file(&dir, wal_file);
    let trusted = match (
        fs::read_to_string(&mark),
        Some(lock_owner(&spool, "get").2).filter(|t| live && !t.is_empty()),
        fs::metadata(&spooled),
    ) {
        (Ok(m), Some(token), Ok(meta)) => {
            let mut it = m.split_whitespace();
            it.next() == Some(token.as_str())
                && it.next().and_then(|n| n.parse::<u64>().ok()) == Some(meta.len())
        }
        _ => false,
    };
    if !trusted && spooled.exists() {
        tracing::warn!(
            "{wal_file} in the spool was not written by the running prefetcher: fetching it again"
        );
        let _ = fs::remove_file(&spooled);
    }
    let _ = fs::remove_file(&mark);
    if trusted && move_into(&spooled, &dest)? {
        tracing::debug!(
            "{wal_file} served from the spool in {} ms",
            t.elapsed().as_millis()
        );
        return Ok(GetOutcome::Found(0));
    }
    super::archive_get::fetch_direct(s, &file, &dest)
}

/// How long the foreground waits for a segment the running prefetcher is fetching before
/// it fetches the segment itself.
const PREFETCH_WAIT: Duration = Duration::from_secs(2);

/// `in/.<name>.mark`: `<token> <size>`, the prefetcher that wrote segment `<name>`
/// ([`write_lock_owner`]'s token) and the segment's size in bytes; written before it.
fn mark_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.mark"))
}

/// `in/<name>.missing`: the prefetcher found no `<name>` in the archive (a hint only: the
/// foreground then asks the repositories itself).
fn missing_marker(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.missing"))
}

/// Fetches one segment from the first repository that has it into `dir` (a temporary file
/// renamed into place): Ok(true) when stored, Ok(false) when no repository has it.
fn prefetch_one(
    stores: &[(u8, std::sync::Arc<dyn Storage>)],
    stanza: &str,
    dir: &Path,
    name: &str,
    token: &str,
) -> Result<bool> {
    let f = WalFile::parse(name)?;
    let mut last_err = None;
    let t = Instant::now();
    for (n, st) in stores {
        match wal::fetch(&**st, stanza, &f) {
            Ok(Some((header, data))) => {
                let fetched = t.elapsed();
                // fetch checked the bytes against both checksums. The mark the foreground
                // looks for goes first, whole: a foreground that sees the segment finds it.
                let mark = format!("{token} {}", data.len());
                super::archive_get::write_whole(&mark_file(dir, name), mark.as_bytes())?;
                super::archive_get::write_whole_with(&dir.join(name), &data, true)?;
                tracing::debug!(
                    "prefetched {name} from repo{n}: {} stored bytes in {} ms, written in {} ms",
                    header.stored_size,
                    fetched.as_millis(),
                    (t.elapsed() - fetched).as_millis()
                );
                return Ok(true);
            }
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
    }
    match last_err {
        Some(e) => Err(e),
        None => Ok(false),
    }
}

/// A prefetch worker's result: stored, missing (a marker for the foreground), or failed (the
/// foreground fetches it itself and reports the error to PostgreSQL).
fn prefetched(
    dir: &Path,
    in_flight: &mut HashSet<String>,
    fetched: &mut HashSet<String>,
    missing_since: &mut HashMap<String, Instant>,
    name: String,
    r: Result<bool>,
) {
    in_flight.remove(&name);
    match r {
        Ok(true) => {
            missing_since.remove(&name);
            fetched.insert(name);
        }
        Ok(false) => {
            let _ = fs::write(missing_marker(dir, &name), b"");
            missing_since.insert(name, Instant::now());
        }
        Err(e) => {
            tracing::warn!("prefetch of {name} failed: {e}");
            missing_since.insert(name, Instant::now());
        }
    }
}

/// The WAL segment size the stanza records, from the first repository that holds it.
///
/// Errors: no repository holds the stanza (the last repository's error).
fn stanza_segment_size(stores: &[(u8, std::sync::Arc<dyn Storage>)], stanza: &str) -> Result<u64> {
    let mut last = Error::Config("no repository is configured".into());
    for (_, st) in stores {
        match crate::repo::read_stanza(&**st, stanza) {
            Ok(info) => return Ok(info.wal_segment_size),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The prefetcher: keeps the `archive-get-queue-max` worth of segments after the last one
/// PostgreSQL asked for (`in/.requested`) in the spool, `--jobs` workers fetching at once
/// (each takes the next wanted segment as soon as it is done), and removes the ones recovery
/// has passed. A segment the archive lacks is asked for again after a second (a standby's
/// primary is still archiving). Exits after [`IDLE_EXIT`] without a new request.
///
/// Errors: the spool cannot be used; the repositories cannot be opened.
pub fn get_background(s: &Settings, first_request: &str) -> Result<()> {
    let stanza = s.stanza()?.to_string();
    let spool = Spool::open(s, &stanza)?;
    let Some(mut lock) = spool.try_lock("get")? else {
        return Ok(());
    };
    let token = write_lock_owner(&mut lock, &settings_fingerprint(s));
    let dir = in_dir(&spool);
    // Whatever an earlier prefetcher left (another restore, a crash) goes.
    if let Ok(rd) = fs::read_dir(&dir) {
        for e in rd.flatten() {
            if e.file_name() != ".requested" {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    let stores: Vec<(u8, std::sync::Arc<dyn Storage>)> = open_repos(s)?;
    let seg_size = stanza_segment_size(&stores, &stanza)?;
    let window = (s.archive.get_queue_max / seg_size.max(1)).max(1);
    tracing::info!(
        "prefetcher started: {window} segment(s) ahead, {} job(s)",
        s.jobs
    );
    let (work_tx, work_rx) = crossbeam_channel::unbounded::<String>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<(String, Result<bool>)>();
    let mut workers = Vec::new();
    for _ in 0..s.jobs {
        let (rx, tx, stores, stanza, dir, token) = (
            work_rx.clone(),
            done_tx.clone(),
            stores.clone(),
            stanza.clone(),
            dir.clone(),
            token.clone(),
        );
        workers.push(std::thread::spawn(move || {
            for name in rx {
                let r = prefetch_one(&stores, &stanza, &dir, &name, &token);
                if tx.send((name, r)).is_err() {
                    return;
                }
            }
        }));
    }
    drop(done_tx);
    let mut in_flight: HashSet<String> = HashSet::new();
    // Stored by this prefetcher: never fetched again (the foreground may have taken it).
    let mut fetched: HashSet<String> = HashSet::new();
    let mut missing_since: HashMap<String, Instant> = HashMap::new();
    // The foreground that started this prefetcher fetches the segment it asked for itself.
    let mut last_request = String::new();
    let mut last_change = Instant::now();
    while last_change.elapsed() < IDLE_EXIT {
        while let Ok((name, r)) = done_rx.try_recv() {
            prefetched(
                &dir,
                &mut in_flight,
                &mut fetched,
                &mut missing_since,
                name,
                r,
            );
        }
        let req = fs::read_to_string(dir.join(".requested")).unwrap_or_default();
        let req_segment = req.split_whitespace().next().unwrap_or("").to_string();
        let parsed = lsn::parse_wal_segment_name(&req_segment, seg_size);
        if req != last_request {
            let previous = last_request.split_whitespace().next().unwrap_or("");
            let before = lsn::parse_wal_segment_name(previous, seg_size);
            if matches!((before, parsed), (Some((t0, n0)), Some((t1, n1))) if t1 != t0 || n1 < n0) {
                // Recovery went back (a new restore, or a timeline switch that re-reads the
                // last segment): what this prefetcher stored before may have been taken.
                fetched.clear();
                missing_since.clear();
            } else if previous == req_segment && !dir.join(&req_segment).exists() {
                // The same segment asked for by a second foreground after it was served (the
                // first one failed after taking it, or recovery restarted): fetch it anew.
                fetched.remove(&req_segment);
            }
            last_request = req.clone();
            last_change = Instant::now();
        }
        let req_segment = req_segment.as_str();
        let Some((tli, segno)) = parsed else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        // Files recovery has passed go (and stale markers).
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                // <segment>, and .<segment>.mark, .tmp, .missing
                let base = n.trim_start_matches('.').get(..24).unwrap_or("");
                if let Some((_, sn)) = lsn::parse_wal_segment_name(base, seg_size) {
                    // The requested one itself stays: the foreground is taking it.
                    if sn < segno {
                        let _ = fs::remove_file(e.path());
                    }
                }
            }
        }
        fetched.retain(|n| {
            lsn::parse_wal_segment_name(n, seg_size)
                .map(|(t, sn)| t == tli && sn >= segno)
                .unwrap_or(false)
        });
        // From the requested segment on: a foreground waiting for it gets it from here too.
        for n in (segno..=segno + window).map(|n| lsn::wal_segment_name(tli, n, seg_size)) {
            if in_flight.len() >= s.jobs * 2 {
                break;
            }
            let recently_missing = missing_since
                .get(&n)
                .map(|t| t.elapsed() < Duration::from_secs(1))
                .unwrap_or(false);
            if in_flight.contains(&n)
                || fetched.contains(&n)
                || recently_missing
                || dir.join(&n).exists()
                || (req == first_request && n == req_segment)
            {
                continue;
            }
            let _ = fs::remove_file(missing_marker(&dir, &n));
            in_flight.insert(n.clone());
            if work_tx.send(n).is_err() {
                return Err(Error::Other("the prefetch workers stopped".into()));
            }
        }
        // Wake for a result at once, else look at the request again after SCAN_EVERY.
        if let Ok((name, r)) = done_rx.recv_timeout(SCAN_EVERY) {
            prefetched(
                &dir,
                &mut in_flight,
                &mut fetched,
                &mut missing_since,
                name,
                r,
            );
        }
    }
    drop(work_tx);
    for w in workers {
        let _ = w.join();
    }
    tracing::info!("prefetcher ends");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, timeout: f64) -> Settings {
        Settings::from_flags(&[
            ("stanza", "main".into()),
            ("repo-path", dir.join("repo").display().to_string()),
            ("archive-async", "y".into()),
            ("spool-path", dir.join("spool").display().to_string()),
            ("archive-timeout", timeout.to_string()),
        ])
        .unwrap()
    }

    /// Archives `data` as WAL file `name` of stanza "main" in the posix repository `<dir>/repo`.
    fn archive(dir: &Path, name: &str, data: &[u8]) {
        use crate::codec::{CompressType, Compression, Compressor};
        fs::create_dir_all(dir.join("repo")).unwrap();
        let repo = crate::storage::posix::PosixStorage::open(&dir.join("repo")).unwrap();
        let c = Compression::new(CompressType::Zstd, None).unwrap();
        let enc = wal::encode(name, data, c, &mut Compressor::new(c).unwrap(), 1).unwrap();
        wal::store(&repo, "main", &WalFile::parse(name).unwrap(), data, &enc).unwrap();
    }

    #[test]
    fn the_get_foreground_serves_only_what_the_running_prefetcher_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), 5.0);
        let name = "000000010000000000000007";
        let archived = vec![1u8; 1 << 16];
        archive(dir.path(), name, &archived);
        // A "running prefetcher": the test holds get.lock with this invocation's settings.
        let spool = Spool::open(&s, "main").unwrap();
        let mut lock = spool.try_lock("get").unwrap().expect("the lock is free");
        let token = write_lock_owner(&mut lock, &settings_fingerprint(&s));
        let inn = in_dir(&spool);
        fs::create_dir_all(&inn).unwrap();
        let spooled = vec![2u8; 1 << 16];
        let dest = dir.path().join("RECOVERYXLOG");
        for (mark, served) in [
            (format!("{token} {}", spooled.len()), &spooled),
            // another prefetcher's (a crash's leftover), or the wrong size: fetched again
            (format!("0123456789abcdef {}", spooled.len()), &archived),
            (format!("{token} 12"), &archived),
            (String::new(), &archived),
        ] {
            fs::write(inn.join(name), &spooled).unwrap();
            if !mark.is_empty() {
                fs::write(mark_file(&inn, name), &mark).unwrap();
            }
            let _ = fs::remove_file(&dest);
            let got = get_foreground(&s, name, &dest).unwrap();
            assert_eq!(
                got,
                super::super::archive_get::GetOutcome::Found(if served == &spooled {
                    0
                } else {
                    1
                }),
                "mark {mark:?}"
            );
            assert_eq!(&fs::read(&dest).unwrap(), served, "mark {mark:?}");
            assert!(!inn.join(name).exists() && !mark_file(&inn, name).exists());
        }
    }

    #[test]
    fn the_prefetcher_fetches_again_when_recovery_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), 5.0);
        let repo_dir = dir.path().join("repo");
        fs::create_dir_all(repo_dir.join("main")).unwrap();
        let info = crate::repo::StanzaInfo {
            format: crate::repo::REPO_FORMAT,
            stanza: "main".into(),
            system_identifier: 1,
            pg_version: "15".into(),
            pg_version_num: 150000,
            catalog_version: 1,
            created: "2026-11-23T00:00:00Z".into(),
            wal_segment_size: 16 << 20,
        };
        fs::write(
            repo_dir.join("main/stanza.json"),
            serde_json::to_vec(&info).unwrap(),
        )
        .unwrap();
        let seg = |n: u64| lsn::wal_segment_name(1, n, 16 << 20);
        for n in 1..=4 {
            archive(dir.path(), &seg(n), &[n as u8; 4096]);
        }
        let spool = Spool::open(&s, "main").unwrap();
        let inn = in_dir(&spool);
        fs::create_dir_all(&inn).unwrap();
        let request = |n: u64, pid: u32| {
            super::super::archive_get::write_whole(
                &inn.join(".requested"),
                format!("{} {pid}", seg(n)).as_bytes(),
            )
            .unwrap()
        };
        let appears = |n: u64| {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if inn.join(seg(n)).exists() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            false
        };
        request(1, 100);
        let s2 = s.clone();
        let prefetcher = std::thread::spawn(move || get_background(&s2, ""));
        // A recovery: each segment asked for in turn and taken by its foreground.
        for n in 2..=4 {
            request(n, 100 + n as u32);
            assert!(appears(n), "segment {n} prefetched");
            fs::remove_file(inn.join(seg(n))).unwrap();
        }
        // A new recovery from the start, while the same prefetcher runs: the segments it
        // stored before (and the last recovery took) are fetched again.
        request(1, 200);
        for n in 2..=4 {
            assert!(
                appears(n),
                "segment {n} prefetched again for the new recovery"
            );
        }
        prefetcher.join().unwrap().unwrap();
    }

    #[test]
    fn a_prefetcher_that_cannot_start_leaves_archive_get_to_fetch_directly() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), 5.0);
        let name = "000000010000000000000005";
        let archived = vec![5u8; 1 << 16];
        archive(dir.path(), name, &archived);
        // The prefetcher's log cannot be opened (a directory in its place): it cannot start.
        let spool = Spool::open(&s, "main").unwrap();
        fs::create_dir_all(spool.log("get")).unwrap();
        let dest = dir.path().join("RECOVERYXLOG");
        let got = get_foreground(&s, name, &dest).unwrap();
        assert_eq!(got, super::super::archive_get::GetOutcome::Found(1));
        assert_eq!(fs::read(&dest).unwrap(), archived);
        assert!(
            spool.try_lock("get").unwrap().is_some(),
            "no prefetcher runs"
        );
    }

    #[test]
    fn a_spooled_segment_that_vanished_before_the_move_is_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dest) = (dir.path().join("spooled"), dir.path().join("RECOVERYXLOG"));
        // Gone between the trust check and the rename (a new prefetcher cleared the spool):
        // false, and get_foreground fetches the segment from the repositories.
        assert!(!move_into(&src, &dest).unwrap());
        assert!(!dest.exists());
        fs::write(&src, b"segment").unwrap();
        assert!(move_into(&src, &dest).unwrap());
        assert_eq!(fs::read(&dest).unwrap(), b"segment");
        assert!(!src.exists());
    }

    #[test]
    fn a_prefetcher_that_cannot_read_the_stanza_exits_and_frees_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), 5.0);
        // A repository without the stanza.
        fs::create_dir_all(dir.path().join("repo")).unwrap();
        let spool = Spool::open(&s, "main").unwrap();
        let inn = in_dir(&spool);
        fs::create_dir_all(&inn).unwrap();
        let leftover = inn.join("000000010000000000000003");
        fs::write(&leftover, b"an earlier prefetcher's").unwrap();
        let e = get_background(&s, "").unwrap_err();
        assert!(
            e.to_string().contains("stanza 'main' does not exist"),
            "{e}"
        );
        // What it found was not served later: it went before the stanza was read.
        assert!(!leftover.exists());
        // The lock died with it: the next foreground can start another.
        assert!(spool.try_lock("get").unwrap().is_some());
    }

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
                &format!("{}\n", super::super::archive_push::wal_identity(b"other")),
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
                &format!(
                    "{}\n",
                    super::super::archive_push::wal_identity(&[7u8; 8192])
                ),
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
