//! Reading a backup back: every stored frame is checked (XXH3-128 of the stored bytes),
//! expanded, checked again (XXH3-128 of the logical bytes) and only then written. `verify`
//! runs the same checks without writing.
use crate::codec::{self, CompressType};
use crate::error::{Error, Result};
use crate::io::direct::{self, aligned_buf, AlignedBuf, DIRECT_MIN_WRITE};
use crate::io::parallel::Stop;
use crate::repo::{Backup, FileEntry, Piece};
use crate::storage::Storage;
use crate::transfer::sink::{punch_zero_pages, write_runs};
use crate::transfer::{Progress, CHUNK_SIZE};
use crossbeam_channel::{Receiver, Sender};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

/// Checks one frame against its piece and expands it into `logical` (resized to the piece's
/// logical size, zero pages filled with zeros). Errors say what did not match.
pub fn decode_piece(
    kind: CompressType,
    frame: &[u8],
    piece: &Piece,
    logical: &mut AlignedBuf,
) -> std::result::Result<(), String> {
    if frame.len() as u64 != piece.stored_size || codec::xxh3_hex(frame) != piece.stored_xxh3 {
        return Err("stored bytes do not match their checksum".into());
    }
    let size = piece.logical_size as usize;
    let ranges = crate::repo::manifest::nonzero_ranges(size, &piece.zero_pages)
        .ok_or("the manifest's zero-page runs do not fit the piece")?;
    let payload_len: usize = ranges.iter().map(|r| r.1).sum();
    // The frame holds the non-zero runs back to back: expand it at the start of `logical`,
    // then move each run up to its offset, last run first. A run never moves down (its
    // offset is at least the length of the runs before it), so moving the last run first
    // overwrites no run still to be moved; the gaps left behind are zeroed.
    logical.clear();
    logical.resize(payload_len, 0);
    codec::decompress(kind, frame, logical).map_err(|e| format!("cannot decompress: {e}"))?;
    if payload_len != size {
        logical.resize(size, 0);
        let (mut src, mut placed) = (payload_len, size);
        for &(off, n) in ranges.iter().rev() {
            src -= n;
            logical.copy_within(src..src + n, off);
            logical[off + n..placed].fill(0);
            placed = off;
        }
        logical[..placed].fill(0);
    }
    if codec::xxh3_hex(logical) != piece.xxh3 {
        return Err("logical bytes do not match their checksum".into());
    }
    Ok(())
}

/// Which pieces of a file [`ReadBack::run`] reads, checks and (when restoring) writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// Every piece.
    All,
    /// The pieces marked true (a delta restore: the others are in place already).
    Pieces(Vec<bool>),
    /// None: the file still counts towards its objects' sizes (restore writes pg_control
    /// last, on its own).
    Nothing,
    /// Every piece of a file of one piece that does not exist yet: the writer of the piece
    /// creates it with these permission bits, writes it and sets its mtime on the open file
    /// (four system calls for a small file instead of eight).
    Create(u32),
}

/// A file of the backup on its way through the stages.
struct FileJob {
    entry: FileEntry,
    /// Permission bits when the writer creates the file ([`Want::Create`]).
    create: Option<u32>,
    /// Wanted pieces not yet written; the writer of the last one sets the file's mtime.
    remaining: AtomicUsize,
}

/// The frames of one stored object that are wanted, and the object's expected size.
struct ObjectWork {
    name: String,
    pieces: Vec<(Arc<FileJob>, usize)>,
    /// Stored bytes of every piece seen in the object, wanted or not.
    size: u64,
}

/// Readers for `store`: its [`Storage::read_ahead`], or `PGJET_READ_AHEAD` (1 to 64; for
/// the benchmarks that choose it).
fn readers(store: &dyn Storage) -> usize {
    crate::io::tuning::get()
        .read_ahead
        .unwrap_or_else(|| store.read_ahead())
}

/// Threads that check and expand frames: `jobs`, but no more than the cores the process may
/// use. The stage only computes, so a thread beyond the cores adds no speed, only its two
/// buffers (16 MiB).
fn decoders(jobs: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    jobs.clamp(1, cores.max(1))
}
/// Objects planned and waiting for a reader: each holds its pieces' manifest lines (a
/// bundle of small files, up to [`crate::transfer::BUNDLE_MAX_FILES`] lines).
const PLANNED_QUEUE: usize = 4;
/// Objects read and waiting for a decoder (each at most about [`CHUNK_SIZE`]). The
/// readers are the stage that falls behind, not the decoders, so one slot is enough.
const LOADED_QUEUE: usize = 1;
/// Threads that write checked pieces into the target files, each with one direct write of
/// up to 8 MiB in flight. The disk of the benchmark machine writes faster with more
/// requests in flight (docs/benchmark-notes.md, restore section: 2 054 MiB took 5.7 s with
/// one `dd` and 4.2 to 2.6 s with four to eight at once), and a restore writes four times
/// the bytes it reads, so the writes get the depth. The ranges are allocated when a file is
/// created ([`allocate_pieces`]): on ext4 direct writes that fill holes in one file go one
/// at a time. Independent of `--jobs`, which sizes the CPU stage.
pub const WRITERS: usize = 4;
/// Checked pieces waiting for a writer, beyond the ones being written: keeps the writers
/// busy while the decoders are descheduled. Each is a buffer of up to 8 MiB.
const WRITE_QUEUE: usize = 2;

/// A stored object as read, or why it could not be used.
enum Loaded {
    Object(AlignedBuf),
    /// Why, and the unused buffer (back to the pool).
    Unusable(String, AlignedBuf),
}

/// A checked piece on its way to a writer: its logical bytes in a buffer of the pool.
struct CheckedPiece {
    file: Arc<FileJob>,
    offset: u64,
    zero_pages: Vec<[u32; 2]>,
    logical: AlignedBuf,
}

/// State shared by the stages of [`ReadBack::run`].
struct Stages<'a> {
    /// The first error, and whether the stages should stop.
    stop: Stop,
    /// Where the stages' threads spent their time, summed over threads (debug log): tells
    /// a restore bound by the disk from one bound by the CPU.
    clock: StageClock,
    bad: Mutex<Vec<String>>,
    rb: &'a ReadBack<'a>,
}

/// Nanoseconds summed over the threads of each stage.
#[derive(Default)]
struct StageClock {
    plan: AtomicU64,
    read: AtomicU64,
    read_wait_buffer: AtomicU64,
    decode: AtomicU64,
    decode_wait_object: AtomicU64,
    decode_wait_buffer: AtomicU64,
    write: AtomicU64,
    write_wait_piece: AtomicU64,
}

/// Runs `f`, adding its duration to `acc`.
fn clocked<T>(acc: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let r = f();
    acc.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

impl StageClock {
    fn log(&self) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        tracing::debug!(
            "restore stages, seconds summed over threads: plan and prepare files {:.2}, \
             read {:.2} (waiting for a buffer {:.2}), decode {:.2} (waiting for an object \
             {:.2}, for a buffer {:.2}), write {:.2} (waiting for a piece {:.2})",
            s(&self.plan),
            s(&self.read),
            s(&self.read_wait_buffer),
            s(&self.decode),
            s(&self.decode_wait_object),
            s(&self.decode_wait_buffer),
            s(&self.write),
            s(&self.write_wait_piece)
        );
    }
}

impl Stages<'_> {
    fn fail(&self, e: Error) {
        self.stop.fail(e);
        self.rb.backup.store().cancel();
    }

    fn mark(&self, file: &FileJob, object: &str, why: &str) {
        let path = &file.entry.path;
        tracing::error!("{path}: {why} (object data/{object})");
        self.bad
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.clone());
        // A restore stops at the first damaged file; verify goes on to find them all.
        if self.rb.target.is_some() {
            self.stop.halt();
        }
    }

    fn aborted(&self) -> bool {
        self.stop.stopped()
    }

    /// A file's last wanted piece is written: its modification time is set.
    fn file_done(&self, file: &FileJob) -> Result<()> {
        match self.rb.target {
            Some(root) => crate::io::fs::set_mtime(&root.join(&file.entry.path), file.entry.mtime),
            None => Ok(()),
        }
    }
}

/// Reading a backup back: every stored frame is read, checked and expanded, and, with a
/// `target`, written there. The files come as a stream (a [`crate::repo::ManifestReader`]
/// or a manifest in memory); objects are read as the stream reaches them, so memory does not
/// depend on the number of files.
pub struct ReadBack<'a> {
    /// The backup read.
    pub backup: &'a Backup<'a>,
    /// Compression of the backup's frames.
    pub kind: CompressType,
    /// Each object's pieces are on consecutive lines of the stream
    /// ([`crate::repo::ScannedManifest::contiguous`]): each object is then read once and
    /// its size checked exactly. Otherwise an object may be read once per run of lines,
    /// and only its frames are checked.
    pub contiguous: bool,
    /// The data directory to write into (files must exist at their final size when
    /// `prepare` returns for them); None to check only (`verify`).
    pub target: Option<&'a Path>,
    /// The target files may hold other bytes (a delta restore): the all-zero pages of the
    /// written pieces are punched out rather than left as they are.
    pub overwrite: bool,
    /// Threads checking and expanding frames.
    pub jobs: usize,
}

impl ReadBack<'_> {
    /// Reads back the files of `files`, in four overlapping stages: this thread plans,
    /// calling `prepare` on each file in stream order (restore creates the file there and
    /// says which pieces it wants; no piece of a file is written before `prepare` returns
    /// for it) and grouping the wanted pieces of consecutive files by object;
    /// [`Storage::read_ahead`] threads read the objects; `jobs` threads (at most one per
    /// core) check and expand their
    /// frames ([`decode_piece`]); when restoring, [`WRITERS`] threads write the checked
    /// pieces, and the writer of a file's last piece sets its mtime (a file with no piece
    /// to write gets it when planned, unless [`Want::Nothing`]). Only a piece whose stored
    /// and logical checksums matched reaches a writer.
    ///
    /// Memory is bounded by two pools of buffers reused throughout, each of about
    /// [`CHUNK_SIZE`] (8 MiB): `readers + LOADED_QUEUE + jobs` object buffers and
    /// `jobs + WRITE_QUEUE + WRITERS` logical buffers (15 buffers, about 125 MiB resident
    /// with 2 jobs), plus the lines of the objects in flight, whatever the size of the
    /// backup.
    ///
    /// Returns the paths of the files with missing or damaged frames (verify: all of them;
    /// a restore stops at the first and returns [`Error::Corrupt`]). Errors: the first
    /// error of `files`, `prepare`, the store or a write.
    pub fn run<I>(
        &self,
        files: I,
        prepare: &mut (dyn FnMut(&FileEntry) -> Result<Want> + Send),
        progress: &dyn Progress,
    ) -> Result<Vec<String>>
    where
        I: Iterator<Item = Result<FileEntry>> + Send,
    {
        let jobs = decoders(self.jobs);
        let readers = readers(self.backup.store());
        let writing = self.target.is_some();
        let st = Stages {
            stop: Stop::default(),
            clock: StageClock::default(),
            bad: Mutex::new(Vec::new()),
            rb: self,
        };
        let (plan_tx, plan_rx) = crossbeam_channel::bounded::<ObjectWork>(PLANNED_QUEUE);
        let (loaded_tx, loaded_rx) =
            crossbeam_channel::bounded::<(ObjectWork, Loaded)>(LOADED_QUEUE);
        // Object buffers: one per reader, per queue slot and per decoder, reused throughout
        // (fresh memory costs a page fault per 4 KiB).
        let objects = readers + LOADED_QUEUE + jobs;
        let (obj_tx, obj_rx) = crossbeam_channel::bounded::<AlignedBuf>(objects);
        for _ in 0..objects {
            let _ = obj_tx.send(aligned_buf(CHUNK_SIZE as usize + CHUNK_SIZE as usize / 64));
        }
        let (write_tx, write_rx) = crossbeam_channel::bounded::<CheckedPiece>(WRITE_QUEUE);
        // The pool of logical buffers: a decoder takes one per piece, a writer gives it back.
        let pool_size = if writing {
            jobs + WRITE_QUEUE + WRITERS
        } else {
            jobs
        };
        let (pool_tx, pool_rx) = crossbeam_channel::bounded::<AlignedBuf>(pool_size);
        for _ in 0..pool_size {
            // The channel has room for every buffer.
            let _ = pool_tx.send(aligned_buf(CHUNK_SIZE as usize));
        }
        std::thread::scope(|s| {
            let st = &st;
            for _ in 0..readers {
                let (rx, tx, obj_rx) = (plan_rx.clone(), loaded_tx.clone(), obj_rx.clone());
                s.spawn(move || self.read_objects(st, rx, tx, obj_rx));
            }
            drop((plan_rx, loaded_tx));
            for _ in 0..jobs {
                let (rx, tx) = (loaded_rx.clone(), write_tx.clone());
                let (pool_tx, pool_rx) = (pool_tx.clone(), pool_rx.clone());
                let obj_tx = obj_tx.clone();
                let pool = (pool_tx, pool_rx);
                s.spawn(move || decode_objects(st, rx, obj_tx, pool, tx, writing, progress));
            }
            drop((loaded_rx, write_tx));
            for _ in 0..WRITERS {
                let (rx, pool_tx) = (write_rx.clone(), pool_tx.clone());
                s.spawn(move || self.write_pieces(st, rx, pool_tx, progress));
            }
            drop(write_rx);
            // This thread plans: it feeds the readers until the stream ends or a stage fails.
            let planned = clocked(&st.clock.plan, || self.plan(st, files, prepare, &plan_tx));
            if let Err(e) = planned {
                st.fail(e);
            }
            drop(plan_tx);
        });
        st.clock.log();
        st.stop.into_result()?;
        let mut bad = st.bad.into_inner().unwrap_or_else(|p| p.into_inner());
        bad.sort();
        bad.dedup();
        if writing && !bad.is_empty() {
            return Err(Error::Corrupt {
                label: format!("backup {}", self.backup.label()),
                files: bad,
            });
        }
        Ok(bad)
    }

    /// A reader of [`ReadBack::run`]: reads each planned object whole into a buffer of the
    /// pool and hands it to the decoders, until the planner is done or a stage fails.
    fn read_objects(
        &self,
        st: &Stages,
        rx: Receiver<ObjectWork>,
        tx: Sender<(ObjectWork, Loaded)>,
        buffers: Receiver<AlignedBuf>,
    ) {
        while let Ok(w) = rx.recv() {
            if st.aborted() {
                continue; // drain, so the planner is not left blocked
            }
            // Buffers come back from the decoders; the pool owns every one.
            let Ok(buf) = clocked(&st.clock.read_wait_buffer, || buffers.recv()) else {
                break;
            };
            match clocked(&st.clock.read, || self.load_object(&w, buf)) {
                Ok(l) => {
                    if tx.send((w, l)).is_err() {
                        break;
                    }
                }
                Err(e) => st.fail(e),
            }
        }
    }

    /// A writer of [`ReadBack::run`]: writes each checked piece into its file (when
    /// restoring) and gives its buffer back to the pool.
    fn write_pieces(
        &self,
        st: &Stages,
        rx: Receiver<CheckedPiece>,
        pool: Sender<AlignedBuf>,
        progress: &dyn Progress,
    ) {
        while let Ok(piece) = clocked(&st.clock.write_wait_piece, || rx.recv()) {
            if !st.aborted() {
                if let Some(root) = self.target {
                    let n = piece.logical.len() as u64;
                    match clocked(&st.clock.write, || self.write_piece(st, root, &piece)) {
                        Ok(()) => progress.advance(n),
                        Err(e) => st.fail(e),
                    }
                }
            }
            let _ = pool.send(piece.logical);
        }
    }

    /// The planning stage of [`ReadBack::run`]: objects are sent to the readers once the
    /// stream has passed their last piece (the first file line with pieces that has none in
    /// them).
    fn plan<I>(
        &self,
        st: &Stages,
        files: I,
        prepare: &mut (dyn FnMut(&FileEntry) -> Result<Want> + Send),
        tx: &crossbeam_channel::Sender<ObjectWork>,
    ) -> Result<()>
    where
        I: Iterator<Item = Result<FileEntry>>,
    {
        let mut open: Vec<ObjectWork> = Vec::new();
        let send = |w: ObjectWork| -> bool { w.pieces.is_empty() || tx.send(w).is_ok() };
        for f in files {
            if st.aborted() {
                return Ok(());
            }
            let f = f?;
            let want = prepare(&f)?;
            let n = f.pieces.len();
            let wanted: Vec<bool> = match &want {
                Want::All => vec![true; n],
                Want::Create(_) if n != 1 => {
                    return Err(Error::Other(format!(
                        "{}: only a file of one piece can be created by its writer",
                        f.path
                    )))
                }
                Want::Create(_) => vec![true],
                Want::Pieces(v) => (0..n).map(|i| v.get(i).copied().unwrap_or(true)).collect(),
                Want::Nothing => vec![false; n],
            };
            let count = wanted.iter().filter(|w| **w).count();
            if n > 0 {
                // Objects this file has no piece in are complete: off to the readers.
                let (done, still): (Vec<_>, Vec<_>) = std::mem::take(&mut open)
                    .into_iter()
                    .partition(|w| !f.pieces.iter().any(|p| p.object == w.name));
                open = still;
                for w in done {
                    if !send(w) {
                        return Ok(());
                    }
                }
            }
            let job = Arc::new(FileJob {
                create: match want {
                    Want::Create(mode) => Some(mode),
                    _ => None,
                },
                entry: f,
                remaining: AtomicUsize::new(count),
            });
            if count == 0 && want != Want::Nothing {
                st.file_done(&job)?;
            }
            for (pi, p) in job.entry.pieces.iter().enumerate() {
                let at = match open.iter().position(|w| w.name == p.object) {
                    Some(i) => i,
                    None => {
                        open.push(ObjectWork {
                            name: p.object.clone(),
                            pieces: Vec::new(),
                            size: 0,
                        });
                        open.len() - 1
                    }
                };
                open[at].size += p.stored_size;
                if wanted[pi] {
                    open[at].pieces.push((job.clone(), pi));
                }
            }
        }
        for w in open {
            if !send(w) {
                break;
            }
        }
        Ok(())
    }

    /// Writes one checked piece; the file's last sets its mtime.
    fn write_piece(&self, st: &Stages, root: &Path, piece: &CheckedPiece) -> Result<()> {
        let path = root.join(&piece.file.entry.path);
        if let Some(mode) = piece.file.create {
            let f = &piece.file.entry;
            return create_with(
                &path,
                mode,
                f.size,
                f.mtime,
                &piece.logical,
                &piece.zero_pages,
            );
        }
        write_runs(&path, piece.offset, &piece.logical, &piece.zero_pages)?;
        if self.overwrite && !piece.zero_pages.is_empty() {
            punch_zero_pages(&path, piece.offset, &piece.zero_pages)?;
        }
        if piece.file.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            st.file_done(&piece.file)?;
        }
        Ok(())
    }

    /// Reads one stored object whole and checks its size: exactly the manifest's when the
    /// stream is contiguous, else only that each frame fits (checked per piece). One
    /// request (an object store pays a round trip per request): a missing object shows as
    /// not found.
    fn load_object(&self, w: &ObjectWork, mut buf: AlignedBuf) -> Result<Loaded> {
        let name = self.backup.object_name(&w.name);
        let size = self.contiguous.then_some(w.size);
        let read = self.backup.store().get_into(&name, size, &mut buf);
        match read {
            Ok(()) if !self.contiguous || buf.len() as u64 == w.size => Ok(Loaded::Object(buf)),
            Ok(()) => Ok(Loaded::Unusable(
                format!("stored object has {} bytes, expected {}", buf.len(), w.size),
                buf,
            )),
            Err(e) if e.is_not_found() => Ok(Loaded::Unusable(
                "stored object is missing".to_string(),
                buf,
            )),
            Err(e) => Err(e),
        }
    }
}

/// A decoder of [`ReadBack::run`]: checks and expands the frames of each loaded object
/// ([`decode_object`]), marks the files of an object that could not be used, and gives the
/// object's buffer back. Drains its queue even after an abort, so no reader stays blocked.
fn decode_objects(
    st: &Stages,
    rx: Receiver<(ObjectWork, Loaded)>,
    objects: Sender<AlignedBuf>,
    pool: (Sender<AlignedBuf>, Receiver<AlignedBuf>),
    tx: Sender<CheckedPiece>,
    writing: bool,
    progress: &dyn Progress,
) {
    while let Ok((w, loaded)) = clocked(&st.clock.decode_wait_object, || rx.recv()) {
        let object = match loaded {
            Loaded::Object(o) => o,
            Loaded::Unusable(why, buf) => {
                let _ = objects.send(buf);
                if !st.aborted() {
                    for (f, _) in &w.pieces {
                        st.mark(f, &w.name, &why);
                    }
                }
                continue;
            }
        };
        let t = std::time::Instant::now();
        let waited = decode_object(st, &w, &object, writing, &pool.0, &pool.1, &tx, progress);
        let busy = t.elapsed().saturating_sub(waited);
        st.clock
            .decode
            .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
        st.clock
            .decode_wait_buffer
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        let _ = objects.send(object);
    }
}

/// Checks and expands every wanted piece of one object; when restoring, hands each checked
/// piece to the writers, else counts it as done. Returns the time spent waiting for buffers
/// and for room in the writers' queue.
#[allow(clippy::too_many_arguments)]
fn decode_object(
    st: &Stages,
    w: &ObjectWork,
    object: &[u8],
    writing: bool,
    pool_tx: &crossbeam_channel::Sender<AlignedBuf>,
    pool_rx: &crossbeam_channel::Receiver<AlignedBuf>,
    tx: &crossbeam_channel::Sender<CheckedPiece>,
    progress: &dyn Progress,
) -> std::time::Duration {
    let mut waited = std::time::Duration::ZERO;
    for (file, pi) in &w.pieces {
        if st.aborted() {
            break;
        }
        let p = &file.entry.pieces[*pi];
        let Some(frame) = usize::try_from(p.offset)
            .ok()
            .zip(usize::try_from(p.offset.saturating_add(p.stored_size)).ok())
            .and_then(|(a, b)| object.get(a..b))
        else {
            st.mark(
                file,
                &w.name,
                "the manifest points past the end of the stored object",
            );
            continue;
        };
        // Buffers come back from the writers (or from this thread when verifying). The pool
        // keeps a sender of its own until all stages end, so recv cannot fail.
        let t = std::time::Instant::now();
        let got = pool_rx.recv();
        waited += t.elapsed();
        let Ok(mut logical) = got else {
            break;
        };
        if let Err(why) = decode_piece(st.rb.kind, frame, p, &mut logical) {
            st.mark(file, &w.name, &why);
            let _ = pool_tx.send(logical);
            continue;
        }
        if writing {
            let piece = CheckedPiece {
                file: file.clone(),
                offset: p.logical_offset,
                zero_pages: p.zero_pages.clone(),
                logical,
            };
            let t = std::time::Instant::now();
            let sent = tx.send(piece);
            waited += t.elapsed();
            if sent.is_err() {
                break;
            }
        } else {
            progress.advance(p.logical_size);
            let _ = pool_tx.send(logical);
        }
    }
    waited
}

/// Creates the file `path` (it must not exist; a missing parent directory is made) with
/// permission bits `mode` (0: 0600), writes `data` at its start but for the all-zero pages
/// `zero_pages` (left as holes), sets its size to `size` bytes and its mtime to `mtime`
/// (Unix seconds) on the open file. Through the page cache: for small files.
pub fn create_with(
    path: &Path,
    mode: u32,
    size: u64,
    mtime: i64,
    data: &[u8],
    zero_pages: &[[u32; 2]],
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let file = crate::io::fs::create_new_file(path, mode)?;
    let mut end = 0u64;
    for (off, run) in crate::transfer::nonzero_runs(data, zero_pages) {
        file.write_all_at(run, off as u64)
            .map_err(|e| Error::io("write", path, e))?;
        end = off as u64 + run.len() as u64;
    }
    if end != size {
        file.set_len(size).map_err(|e| Error::io("size", path, e))?;
    }
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.max(0) as u64);
    file.set_modified(when)
        .map_err(|e| Error::io("set mtime", path, e))
}

/// Allocates, in the open target file `file` at `path`, the ranges `f`'s pieces will
/// write: everything but the zero pages, which stay holes ([`direct::allocate`]), so the
/// writers' direct writes overwrite allocated blocks and several run in one file at once.
/// Small files are left alone (they are written through the page cache). Returns false
/// when the filesystem cannot allocate ahead (the caller may stop trying). Errors (ENOSPC
/// first of all) name the file.
pub fn allocate_pieces(file: &std::fs::File, path: &Path, f: &FileEntry) -> Result<bool> {
    // Non-zero ranges of the file, adjacent ones merged (across pieces too).
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for p in &f.pieces {
        let runs = crate::repo::manifest::nonzero_ranges(p.logical_size as usize, &p.zero_pages)
            .unwrap_or_default();
        for (off, n) in runs {
            let (start, len) = (p.logical_offset + off as u64, n as u64);
            match ranges.last_mut() {
                Some(r) if r.0 + r.1 == start => r.1 += len,
                _ => ranges.push((start, len)),
            }
        }
    }
    let bytes: u64 = ranges.iter().map(|r| r.1).sum();
    if ranges.is_empty() || bytes < DIRECT_MIN_WRITE as u64 {
        return Ok(true);
    }
    for (start, len) in ranges {
        if !direct::allocate(file, start, len).map_err(|e| Error::io("allocate", path, e))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Reads, checks and writes one file on its own (restore uses it for pg_control, last):
/// `f` of `backup`, frames compressed with `kind`, into the existing `target`.
///
/// Errors: [`Error::Corrupt`] naming `f` when a frame does not match its checksums; the
/// store's; a failed write.
pub fn restore_one(
    backup: &Backup,
    kind: CompressType,
    f: &FileEntry,
    target: &Path,
) -> Result<()> {
    let mut logical = aligned_buf(CHUNK_SIZE as usize);
    for p in &f.pieces {
        let frame =
            backup
                .store()
                .get_range(&backup.object_name(&p.object), p.offset, p.stored_size)?;
        decode_piece(kind, &frame, p, &mut logical).map_err(|why| {
            tracing::error!("{}: {why}", f.path);
            Error::Corrupt {
                label: format!("backup {}", backup.label()),
                files: vec![f.path.clone()],
            }
        })?;
        write_runs(target, p.logical_offset, &logical, &p.zero_pages)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Compression, Compressor};
    use crate::pg::checksum::BLCKSZ;

    /// Frames as the backup stores them (zero pages left out), expanded back in place.
    #[test]
    fn decode_expands_zero_pages_in_place() {
        let pages = 9usize;
        let layouts: [&[[u32; 2]]; 6] = [
            &[],
            &[[0, 1]],
            &[[0, 3], [5, 2]],
            &[[1, 1], [3, 1], [8, 1]],
            &[[2, 7]],
            &[[0, 9]],
        ];
        for kind in [CompressType::None, CompressType::Zstd, CompressType::Lz4] {
            for zero_pages in layouts {
                for tail in [0usize, 100] {
                    let len = pages * BLCKSZ + tail;
                    let mut data: Vec<u8> = (0..len).map(|i| (i % 251 + 1) as u8).collect();
                    for r in zero_pages {
                        let (a, b) = (r[0] as usize * BLCKSZ, (r[0] + r[1]) as usize * BLCKSZ);
                        data[a..b].fill(0);
                    }
                    let mut payload = Vec::new();
                    for (off, n) in crate::repo::manifest::nonzero_ranges(len, zero_pages).unwrap()
                    {
                        payload.extend_from_slice(&data[off..off + n]);
                    }
                    let mut c = Compressor::new(Compression::new(kind, None).unwrap()).unwrap();
                    let mut frame = aligned_buf(0);
                    c.compress(&payload, &mut frame).unwrap();
                    let piece = Piece {
                        object: "000001".into(),
                        offset: 0,
                        stored_size: frame.len() as u64,
                        stored_xxh3: codec::xxh3_hex(&frame),
                        logical_offset: 0,
                        logical_size: len as u64,
                        zero_pages: zero_pages.to_vec(),
                        xxh3: codec::xxh3_hex(&data),
                        crc32c: codec::crc32c(&data),
                    };
                    // A reused buffer full of other bytes, as the pool hands them out.
                    let mut logical = aligned_buf(len);
                    logical.resize(len, 0xAA);
                    decode_piece(kind, &frame, &piece, &mut logical).unwrap();
                    assert_eq!(&logical[..], &data[..], "{kind} {zero_pages:?} tail {tail}");
                    let mut bad = frame.to_vec();
                    if let Some(b) = bad.last_mut() {
                        *b ^= 1;
                        assert!(decode_piece(kind, &bad, &piece, &mut logical).is_err());
                    }
                }
            }
        }
    }
}
