//! Asynchronous archive-get: one background prefetcher per stanza keeps the segments after
//! the one PostgreSQL asked for in the spool, fetched, checked and decompressed; the
//! foreground serves a segment from there when the running prefetcher wrote it, else fetches
//! it itself.
use super::get::{fetch_direct, GetOutcome};
use super::push::resolve_path;
use super::spool::{
    ensure_running, lock_owner, move_into, settings_fingerprint, write_lock_owner, Spool, ACK_POLL,
    IDLE_EXIT, SCAN_EVERY,
};
use crate::error::{Error, Result};
use crate::options::ArchiveConfig;
use crate::pg::lsn;
use crate::repo::wal::{self, WalFile, WalFileKind};
use crate::repo::Stanza;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
fn ensure_prefetcher(s: &ArchiveConfig, spool: &Spool, request: &str) -> Result<bool> {
    ensure_running(s, spool, "get", GET_COMMAND, std::ffi::OsStr::new(request))
}

/// The foreground of asynchronous `archive-get`: serves `wal_file` from the spool when the
/// prefetcher has it, else from the repositories, and keeps the prefetcher running for the
/// segments after it.
///
/// Errors: as [`fetch_direct`].
pub fn get_foreground(s: &ArchiveConfig, wal_file: &str, dest: &Path) -> Result<GetOutcome> {
    let stanza = s.stanza()?;
    let file = WalFile::parse(wal_file)?;
    if file.kind != WalFileKind::Segment {
        return fetch_direct(s, &file, dest);
    }
    let spool = Spool::open(s, stanza)?;
    let dir = in_dir(&spool);
    crate::io::fs::create_dir_all(&dir, crate::io::fs::DIR_MODE)?;
    let requested = dir.join(".requested");
    // `<segment> <pid>`: each request differs, even for the same segment.
    let request = format!("{wal_file} {}", std::process::id());
    crate::io::fs::write_whole(&requested, request.as_bytes(), crate::io::fs::FILE_MODE)?;
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
        return Ok(GetOutcome::FromSpool);
    }
    fetch_direct(s, &file, &dest)
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
fn prefetch_one(stanzas: &[Stanza], dir: &Path, name: &str, token: &str) -> Result<bool> {
    let f = WalFile::parse(name)?;
    let mut last_err = None;
    let t = Instant::now();
    for st in stanzas {
        let n = st.repo();
        match wal::fetch(st, &f) {
            Ok(Some((header, data))) => {
                let fetched = t.elapsed();
                // fetch checked the bytes against both checksums. The mark the foreground
                // looks for goes first, whole: a foreground that sees the segment finds it.
                let mark = format!("{token} {}", data.len());
                // The segment becomes archive-get's %p by a rename: FILE_MODE less
                // PostgreSQL's umask, as write_whole gives %p.
                let mode = crate::io::fs::FILE_MODE;
                crate::io::fs::write_whole(&mark_file(dir, name), mark.as_bytes(), mode)?;
                crate::io::fs::write_whole_with(&dir.join(name), &data, mode, true)?;
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

/// A prefetch worker's result: the segment name, and whether it was stored.
type PrefetchResult = (String, Result<bool>);

/// What the prefetcher knows of the segments it handed to its workers.
#[derive(Default)]
struct Segments {
    /// Handed to a worker, no result yet.
    in_flight: HashSet<String>,
    /// Stored by this prefetcher: never fetched again (the foreground may have taken it).
    fetched: HashSet<String>,
    /// Not in the archive, or failed: asked for again only a second later.
    missing_since: HashMap<String, Instant>,
}

impl Segments {
    /// A prefetch worker's result: stored, missing (a marker for the foreground), or failed
    /// (the foreground fetches it itself and reports the error to PostgreSQL).
    fn finished(&mut self, dir: &Path, name: String, r: Result<bool>) {
        self.in_flight.remove(&name);
        match r {
            Ok(true) => {
                self.missing_since.remove(&name);
                self.fetched.insert(name);
            }
            Ok(false) => {
                let _ = crate::io::fs::write_whole(
                    &missing_marker(dir, &name),
                    b"",
                    crate::io::fs::FILE_MODE,
                );
                self.missing_since.insert(name, Instant::now());
            }
            Err(e) => {
                tracing::warn!("prefetch of {name} failed: {e}");
                self.missing_since.insert(name, Instant::now());
            }
        }
    }

    /// A new request for `segment` (parsed: `parsed`) after one for `previous`: when
    /// recovery went back, everything stored before is forgotten; when the same segment is
    /// asked for again and is no longer in `dir`, it is fetched anew.
    fn new_request(
        &mut self,
        dir: &Path,
        previous: &str,
        segment: &str,
        parsed: Option<(u32, u64)>,
        seg_size: u64,
    ) {
        let before = lsn::parse_wal_segment_name(previous, seg_size);
        if matches!((before, parsed), (Some((t0, n0)), Some((t1, n1))) if t1 != t0 || n1 < n0) {
            // Recovery went back (a new restore, or a timeline switch that re-reads the
            // last segment): what this prefetcher stored before may have been taken.
            self.fetched.clear();
            self.missing_since.clear();
        } else if previous == segment && !dir.join(segment).exists() {
            // The same segment asked for by a second foreground after it was served (the
            // first one failed after taking it, or recovery restarted): fetch it anew.
            self.fetched.remove(segment);
        }
    }

    /// Hands the segments of `wanted` that are not in flight, stored, recently missing,
    /// already in `dir`, or `skip` to the workers, until `limit` are in flight.
    ///
    /// Errors: the workers have stopped.
    fn hand_out(
        &mut self,
        dir: &Path,
        wanted: impl Iterator<Item = String>,
        limit: usize,
        skip: Option<&str>,
        work_tx: &crossbeam_channel::Sender<String>,
    ) -> Result<()> {
        for n in wanted {
            if self.in_flight.len() >= limit {
                break;
            }
            let recently_missing = self
                .missing_since
                .get(&n)
                .map(|t| t.elapsed() < Duration::from_secs(1))
                .unwrap_or(false);
            if self.in_flight.contains(&n)
                || self.fetched.contains(&n)
                || recently_missing
                || dir.join(&n).exists()
                || skip == Some(n.as_str())
            {
                continue;
            }
            let _ = fs::remove_file(missing_marker(dir, &n));
            self.in_flight.insert(n.clone());
            if work_tx.send(n).is_err() {
                return Err(Error::Other("the prefetch workers stopped".into()));
            }
        }
        Ok(())
    }
}

/// The WAL segment size the stanza records, from the first repository that holds it.
///
/// Errors: no repository holds the stanza (the last repository's error).
fn stanza_segment_size(stanzas: &[Stanza]) -> Result<u64> {
    let mut last = Error::Config("no repository is configured".into());
    for st in stanzas {
        match st.info() {
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
pub fn get_background(s: &ArchiveConfig, first_request: &str) -> Result<()> {
    let stanza = s.stanza()?.to_string();
    let spool = Spool::open(s, &stanza)?;
    let Some(mut lock) = spool.try_lock("get")? else {
        return Ok(());
    };
    let token = write_lock_owner(&mut lock, &settings_fingerprint(s));
    let dir = in_dir(&spool);
    remove_leftovers(&dir);
    let stanzas = crate::repo::open::open_stanzas(&s.repo_set)?;
    let seg_size = stanza_segment_size(&stanzas)?;
    let window = (s.archive.get_queue_max / seg_size.max(1)).max(1);
    tracing::info!(
        "prefetcher started: {window} segment(s) ahead, {} job(s)",
        s.jobs
    );
    let (work_tx, work_rx) = crossbeam_channel::unbounded::<String>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<PrefetchResult>();
    let workers = spawn_workers(s.jobs, &stanzas, &dir, &token, &work_rx, &done_tx);
    drop(done_tx);
    let mut segs = Segments::default();
    // The foreground that started this prefetcher fetches the segment it asked for itself.
    let mut last_request = String::new();
    let mut last_change = Instant::now();
    while last_change.elapsed() < IDLE_EXIT {
        while let Ok((name, r)) = done_rx.try_recv() {
            segs.finished(&dir, name, r);
        }
        let req = fs::read_to_string(dir.join(".requested")).unwrap_or_default();
        let req_segment = req.split_whitespace().next().unwrap_or("").to_string();
        let parsed = lsn::parse_wal_segment_name(&req_segment, seg_size);
        if req != last_request {
            let previous = last_request.split_whitespace().next().unwrap_or("");
            segs.new_request(&dir, previous, &req_segment, parsed, seg_size);
            last_request = req.clone();
            last_change = Instant::now();
        }
        let req_segment = req_segment.as_str();
        let Some((tli, segno)) = parsed else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        remove_passed(&dir, seg_size, segno);
        segs.fetched.retain(|n| {
            lsn::parse_wal_segment_name(n, seg_size)
                .map(|(t, sn)| t == tli && sn >= segno)
                .unwrap_or(false)
        });
        // From the requested segment on: a foreground waiting for it gets it from here too.
        segs.hand_out(
            &dir,
            (segno..=segno + window).map(|n| lsn::wal_segment_name(tli, n, seg_size)),
            s.jobs * 2,
            (req == first_request).then_some(req_segment),
            &work_tx,
        )?;
        // Wake for a result at once, else look at the request again after SCAN_EVERY.
        if let Ok((name, r)) = done_rx.recv_timeout(SCAN_EVERY) {
            segs.finished(&dir, name, r);
        }
    }
    drop(work_tx);
    for w in workers {
        let _ = w.join();
    }
    tracing::info!("prefetcher ends");
    Ok(())
}

/// Removes whatever an earlier prefetcher left in `dir` (another restore, a crash), all but
/// `.requested` and a foreground's `.requested` being written (its temporary file: removed
/// under it, the foreground's rename would fail).
fn remove_leftovers(dir: &Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().starts_with(".requested") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// Removes the files of `dir` that recovery has passed: segments before `segno` and their
/// stale markers (`.<segment>.mark`, `.tmp`, `.missing`). The requested segment itself stays:
/// the foreground is taking it.
fn remove_passed(dir: &Path, seg_size: u64, segno: u64) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            // <segment>, and .<segment>.mark, .tmp, .missing
            let base = n.trim_start_matches('.').get(..24).unwrap_or("");
            if let Some((_, sn)) = lsn::parse_wal_segment_name(base, seg_size) {
                if sn < segno {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}

/// Starts `jobs` prefetch workers: each takes segment names from `work`, fetches the
/// segment into `dir` ([`prefetch_one`]) and sends the result to `done`; a worker ends when
/// `work` closes or `done` has no receiver.
fn spawn_workers(
    jobs: usize,
    stanzas: &[Stanza],
    dir: &Path,
    token: &str,
    work: &crossbeam_channel::Receiver<String>,
    done: &crossbeam_channel::Sender<PrefetchResult>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut workers = Vec::new();
    for _ in 0..jobs {
        let (rx, tx, stanzas, dir, token) = (
            work.clone(),
            done.clone(),
            stanzas.to_vec(),
            dir.to_path_buf(),
            token.to_string(),
        );
        workers.push(std::thread::spawn(move || {
            for name in rx {
                let r = prefetch_one(&stanzas, &dir, &name, &token);
                if tx.send((name, r)).is_err() {
                    return;
                }
            }
        }));
    }
    workers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::spool::test_settings as settings;

    /// Archives `data` as WAL file `name` of stanza "main" in the posix repository `<dir>/repo`.
    fn archive(dir: &Path, name: &str, data: &[u8]) {
        use crate::codec::{CompressType, Compression, Compressor};
        fs::create_dir_all(dir.join("repo")).unwrap();
        let repo = crate::storage::posix::PosixStorage::open(&dir.join("repo")).unwrap();
        let c = Compression::new(CompressType::Zstd, None).unwrap();
        let mut enc = wal::encode(name, data, c, &mut Compressor::new(c).unwrap(), 1).unwrap();
        let st = Stanza::new(1, std::sync::Arc::new(repo), "main");
        wal::store(&st, &WalFile::parse(name).unwrap(), data, &mut enc, true).unwrap();
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
            let want = if served == &spooled {
                GetOutcome::FromSpool
            } else {
                GetOutcome::Found(1)
            };
            assert_eq!(got, want, "mark {mark:?}");
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
            crate::io::fs::write_whole(
                &inn.join(".requested"),
                format!("{} {pid}", seg(n)).as_bytes(),
                crate::io::fs::FILE_MODE,
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
        assert_eq!(got, GetOutcome::Found(1));
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
}
