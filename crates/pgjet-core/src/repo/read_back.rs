//! Reading a backup back: every stored frame is checked (XXH3-128 of the stored bytes),
//! expanded, checked again (XXH3-128 of the logical bytes) and only then written. `verify`
//! runs the same checks without writing.
use crate::codec::{self, CompressType};
use crate::error::{Error, Result};
use crate::io::direct::{aligned_buf, AlignedBuf};
use crate::io::parallel::Stop;
use crate::repo::frame::{decode_piece, FrameCache};
use crate::repo::restore_target::RestoreTarget;
use crate::repo::{Backup, FileEntry, Piece};
use crate::storage::Storage;
use crate::transfer::{Progress, CHUNK_SIZE};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

/// What a delta restore does with one piece of a file ([`Want::Pieces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceWant {
    /// In place already (its logical hash matched the target's bytes): neither read nor
    /// written; its CRC32C is the manifest's.
    Keep,
    /// Read, checked and written.
    Write,
    /// Read and checked, then compared with the target's bytes and written only where they
    /// differ: a piece whose logical hash the manifest lacks (a slice of an older backup's
    /// frame, whose bytes the incremental backup never read).
    Compare,
}

/// Which pieces of a file [`ReadBack::run`] reads, checks and (when restoring) writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// Every piece.
    All,
    /// Each piece as marked (a delta restore).
    Pieces(Vec<PieceWant>),
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
    /// For a file whose CRC32C the manifest lacks: (offset, length, CRC32C) of its pieces,
    /// those kept in place (from the manifest) and those read so far.
    crcs: Option<Mutex<Vec<(u64, u64, u32)>>>,
    /// Per piece: compare with the target's bytes before writing ([`PieceWant::Compare`]).
    compare: Vec<bool>,
    /// Wanted pieces not yet written in each [`WRITEBACK_WINDOW`] of the file (empty for a
    /// file its writer creates): the writer of a window's last piece starts the window's
    /// writeback.
    windows: Vec<AtomicU32>,
}

/// The span, in bytes, whose dirty pages a restore hands to the disk as soon as every
/// piece in it is written ([`RestoreTarget::written`]). A chain's file is written in runs between the blocks its
/// incrementals changed, most shorter than `DIRECT_MIN_WRITE` and so through the page
/// cache; left to the kernel, they would be written back only by the final syncfs (the
/// background threshold is a share of memory), with the disk idle until then.
pub const WRITEBACK_WINDOW: u64 = 8 << 20;

/// Per [`WRITEBACK_WINDOW`] of a file of `size` bytes, the number of `wanted` `pieces`
/// that lie in it (a piece across a boundary counts in each window it touches).
fn window_counts(size: u64, pieces: &[Piece], wanted: &[bool]) -> Vec<AtomicU32> {
    let n = size.div_ceil(WRITEBACK_WINDOW) as usize;
    let mut counts = vec![0u32; n];
    for (p, _) in pieces.iter().zip(wanted).filter(|(_, w)| **w) {
        if p.logical_size == 0 {
            continue;
        }
        let first = (p.logical_offset / WRITEBACK_WINDOW) as usize;
        let last = ((p.logical_offset + p.logical_size - 1) / WRITEBACK_WINDOW) as usize;
        for c in counts.iter_mut().take(last + 1).skip(first) {
            *c += 1;
        }
    }
    counts.into_iter().map(AtomicU32::new).collect()
}

/// The frames of one stored object that are wanted, and the object's expected size.
struct ObjectWork {
    /// The backup holding the object: None for the one read, else an older one of its chain.
    backup: Option<String>,
    name: String,
    pieces: Vec<(Arc<FileJob>, usize)>,
    /// Stored bytes of every frame seen in the object, wanted or not (each frame once).
    size: u64,
    /// (offset, stored size) of the frames counted in `size`: an empty frame (a range of
    /// zero pages only, stored uncompressed) shares its offset with the next frame.
    frames: std::collections::HashSet<(u64, u64)>,
    /// The number of the last file line that named the object.
    last_line: usize,
}

/// An older backup's object stays open this many file lines after the last one that named
/// it: a diff or incr names the frames of its reference's bundles in another order than
/// the reference stored them, and an object sent at once would be read again for the next
/// line that names it (a chain restore read a third more than a full one). Bounds the file
/// lines held in memory for it.
const OLDER_OBJECT_LINES: usize = 1024;

impl ObjectWork {
    /// The object's name for messages: `data/<object>`, and the backup when it is an older
    /// one of the chain.
    fn shown(&self) -> String {
        match &self.backup {
            None => format!("data/{}", self.name),
            Some(b) => format!("data/{} of backup {b}", self.name),
        }
    }
}

/// A file's CRC32C, computed while it was restored: (path, size, mtime, CRC32C), for
/// PostgreSQL's backup_manifest.
pub type ComputedCrc = (String, u64, i64, u32);

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
/// created (`crate::pgdata::write::allocate_pieces`): on ext4 direct writes that fill holes in one file go one
/// at a time. Independent of `--jobs`, which sizes the CPU stage.
pub const WRITERS: usize = 4;
/// Checked pieces waiting for a writer, beyond the ones being written: keeps the writers
/// busy while the decoders are descheduled. Each is a buffer of up to 8 MiB.
const WRITE_QUEUE: usize = 2;
/// Writers and write queue of a restore from a store across a network
/// ([`Storage::remote`]): there the downloads bound the restore, not the disk (restoring
/// 2 GiB of large files from S3 at 20 ms, the writers waited for pieces 55 of 60
/// thread-seconds), and the buffers go to more objects in flight instead.
const REMOTE_WRITERS: usize = 2;
const REMOTE_WRITE_QUEUE: usize = 1;

/// Writer threads and queue length for a restore from `store`: [`WRITERS`] and
/// [`WRITE_QUEUE`], or [`REMOTE_WRITERS`] and [`REMOTE_WRITE_QUEUE`] for a remote store.
fn writers(store: &dyn Storage) -> (usize, usize) {
    if store.remote() {
        (REMOTE_WRITERS, REMOTE_WRITE_QUEUE)
    } else {
        (WRITERS, WRITE_QUEUE)
    }
}

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
    /// Written only where the target's bytes differ.
    compare: bool,
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
    /// CRC32Cs computed for files whose manifest line has none.
    crcs: Mutex<Vec<ComputedCrc>>,
    /// Pieces compared with the target and found equal (not written), and their bytes.
    equal: (AtomicU64, AtomicU64),
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
        tracing::error!("{path}: {why} (object {object})");
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

    /// A file's last wanted piece is written: its modification time is set, and a CRC32C
    /// computed from its pieces is kept.
    fn file_done(&self, file: &FileJob) -> Result<()> {
        if let Some(parts) = &file.crcs {
            let mut parts = std::mem::take(&mut *parts.lock().unwrap_or_else(|p| p.into_inner()));
            parts.sort_unstable();
            let crc = combine_crcs(&parts).ok_or_else(|| {
                Error::Other(format!(
                    "{}: the restored pieces do not cover the file",
                    file.entry.path
                ))
            })?;
            let e = &file.entry;
            self.crcs.lock().unwrap_or_else(|p| p.into_inner()).push((
                e.path.clone(),
                e.size,
                e.mtime,
                crc,
            ));
        }
        match self.rb.target {
            Some(target) => target.finish(&file.entry.path, file.entry.mtime),
            None => Ok(()),
        }
    }
}

/// What [`ReadBack::run`] found.
#[derive(Debug, Default)]
pub struct ReadOutcome {
    /// Files with missing or damaged frames, sorted (a restore fails instead).
    pub bad: Vec<String>,
    /// CRC32Cs of the restored files whose manifest line has none.
    pub crcs: Vec<ComputedCrc>,
    /// Delta restore: pieces compared with the target and found equal, not written, and
    /// their logical bytes.
    pub equal_pieces: u64,
    pub equal_bytes: u64,
}

/// The CRC32C of a file from its pieces' (offset, length, CRC32C), sorted by offset; None
/// when they do not cover it from 0 without gaps.
fn combine_crcs(parts: &[(u64, u64, u32)]) -> Option<u32> {
    let mut at = 0u64;
    let mut crc = None;
    for &(off, len, c) in parts {
        if off != at {
            return None;
        }
        crc = Some(match crc {
            None => c,
            Some(acc) => crate::pg::pg_manifest::crc32c_combine(acc, c, len),
        });
        at += len;
    }
    Some(crc.unwrap_or(0))
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
    /// The older backups its pieces name, and the compression of their frames (checked
    /// complete and of the same cluster by [`super::chain::open_chain`]).
    pub chain: &'a [(String, CompressType)],
    /// Each object's pieces are on consecutive lines of the stream
    /// ([`crate::repo::ScannedManifest::contiguous`]): each object is then read once and
    /// its size checked (at least its named frames). Otherwise an object may be read once per run of lines,
    /// and only its frames are checked.
    pub contiguous: bool,
    /// Where the checked pieces are written (files must exist at their final size when
    /// `prepare` returns for them, but those it asks its writer to create); None to check
    /// only (`verify`).
    pub target: Option<&'a dyn RestoreTarget>,
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
    /// frames ([`decode_piece`]); when restoring, [`WRITERS`] threads ([`REMOTE_WRITERS`] from
    /// a remote store) write the checked
    /// pieces, and the writer of a file's last piece sets its mtime (a file with no piece
    /// to write gets it when planned, unless [`Want::Nothing`]). Only a piece whose stored
    /// and logical checksums matched reaches a writer.
    ///
    /// Memory is bounded by two pools of buffers reused throughout, each of about
    /// [`CHUNK_SIZE`] (8 MiB): `readers + LOADED_QUEUE + jobs` object buffers and
    /// `jobs + WRITE_QUEUE + WRITERS` logical buffers (posix: 15 buffers, about 125 MiB
    /// resident with 2 jobs; a remote store trades writer buffers for readers), plus the
    /// lines of the objects in flight, whatever the size of the backup.
    ///
    /// Returns the paths of the files with missing or damaged frames (verify: all of them;
    /// a restore stops at the first and returns [`Error::Corrupt`]). Errors: the first
    /// error of `files`, `prepare`, the store or a write.
    pub fn run<I>(
        &self,
        files: I,
        prepare: &mut (dyn FnMut(&FileEntry) -> Result<Want> + Send),
        progress: &dyn Progress,
    ) -> Result<ReadOutcome>
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
            crcs: Mutex::new(Vec::new()),
            equal: Default::default(),
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
        let (writers, write_queue) = writers(self.backup.store());
        let (write_tx, write_rx) = crossbeam_channel::bounded::<CheckedPiece>(write_queue);
        // The pool of logical buffers: a decoder takes one per piece, a writer gives it back.
        let pool_size = if writing {
            jobs + write_queue + writers
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
            for _ in 0..writers {
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
        let crcs = st.crcs.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(ReadOutcome {
            bad,
            crcs,
            equal_pieces: st.equal.0.into_inner(),
            equal_bytes: st.equal.1.into_inner(),
        })
    }

    /// The compression of the frames of `backup` (None: the backup read).
    fn kind_of(&self, backup: Option<&str>) -> Option<CompressType> {
        match backup {
            None => Some(self.kind),
            Some(b) => self.chain.iter().find(|(l, _)| l == b).map(|(_, k)| *k),
        }
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
                if let Some(target) = self.target {
                    let n = piece.logical.len() as u64;
                    match clocked(&st.clock.write, || write_piece(st, target, &piece)) {
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
        // Where each (backup, object) of `open` is.
        let mut index: std::collections::HashMap<(Option<String>, String), usize> =
            Default::default();
        let send = |w: ObjectWork| -> bool { w.pieces.is_empty() || tx.send(w).is_ok() };
        for (line, f) in files.enumerate() {
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
                Want::Pieces(v) => (0..n).map(|i| v.get(i) != Some(&PieceWant::Keep)).collect(),
                Want::Nothing => vec![false; n],
            };
            let compare: Vec<bool> = match &want {
                Want::Pieces(v) => (0..n)
                    .map(|i| v.get(i) == Some(&PieceWant::Compare))
                    .collect(),
                _ => vec![false; n],
            };
            let count = wanted.iter().filter(|w| **w).count();
            if n > 0 {
                // Objects this file has no piece in are complete: off to the readers. (A
                // chain's large file names hundreds of objects in thousands of pieces: sets,
                // not nested scans.)
                let here: std::collections::HashSet<(Option<&str>, &str)> = f
                    .pieces
                    .iter()
                    .map(|p| (p.backup.as_deref(), p.object.as_str()))
                    .collect();
                let (done, still): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut open).into_iter().partition(|w| {
                        !here.contains(&(w.backup.as_deref(), w.name.as_str()))
                            && (w.backup.is_none() || line - w.last_line > OLDER_OBJECT_LINES)
                    });
                open = still;
                index = open
                    .iter()
                    .enumerate()
                    .map(|(i, w)| ((w.backup.clone(), w.name.clone()), i))
                    .collect();
                for w in done {
                    if !send(w) {
                        return Ok(());
                    }
                }
            }
            // A CRC32C the manifest lacks is computed from the pieces: those read, and those
            // kept in place with the manifest's CRC32C of each.
            let crcs: Option<Mutex<Vec<(u64, u64, u32)>>> = if self.target.is_some()
                && f.crc32c.is_none()
            {
                let mut kept = Vec::new();
                for (p, _) in f.pieces.iter().zip(&wanted).filter(|(_, w)| !**w) {
                    let crc = p.crc32c.ok_or_else(|| {
                            Error::Other(format!(
                                "{}: a piece kept in place has no CRC32C in the manifest, so the file's cannot be computed",
                                f.path
                            ))
                        })?;
                    kept.push((p.logical_offset, p.logical_size, crc));
                }
                Some(Mutex::new(kept))
            } else {
                None
            };
            let job = Arc::new(FileJob {
                create: match want {
                    Want::Create(mode) => Some(mode),
                    _ => None,
                },
                windows: match (&want, self.target) {
                    (Want::Create(_), _) | (_, None) => Vec::new(),
                    _ => window_counts(f.size, &f.pieces, &wanted),
                },
                entry: f,
                remaining: AtomicUsize::new(count),
                crcs,
                compare,
            });
            if count == 0 && want != Want::Nothing {
                st.file_done(&job)?;
            }
            for (pi, p) in job.entry.pieces.iter().enumerate() {
                let key = (p.backup.clone(), p.object.clone());
                let at = match index.get(&key) {
                    Some(&i) => i,
                    None => {
                        index.insert(key, open.len());
                        open.push(ObjectWork {
                            backup: p.backup.clone(),
                            name: p.object.clone(),
                            pieces: Vec::new(),
                            size: 0,
                            frames: Default::default(),
                            last_line: line,
                        });
                        open.len() - 1
                    }
                };
                open[at].last_line = line;
                if open[at].frames.insert((p.offset, p.stored_size)) {
                    open[at].size += p.stored_size;
                }
                if wanted[pi] {
                    open[at].pieces.push((job.clone(), pi));
                }
            }
        }
        tracing::debug!(
            "restore: every file line planned; {} objects of older backups still to read",
            open.iter().filter(|w| w.backup.is_some()).count()
        );
        for w in open {
            if !send(w) {
                break;
            }
        }
        Ok(())
    }

    /// Reads one stored object whole and checks its size: at least the frames the manifest
    /// names when the stream is contiguous, else only that each frame fits (checked per
    /// piece). One
    /// request (an object store pays a round trip per request): a missing object shows as
    /// not found.
    fn load_object(&self, w: &ObjectWork, mut buf: AlignedBuf) -> Result<Loaded> {
        // An older backup's object is read whole; only the frames this one names are known.
        let exact = self.contiguous && w.backup.is_none();
        let name = match &w.backup {
            None => self.backup.object_name(&w.name),
            Some(b) => self.backup.stanza().backup(b).object_name(&w.name),
        };
        let size = exact.then_some(w.size);
        let read = self.backup.store().get_into(&name, size, &mut buf);
        match read {
            // At least the frames named: a resumed backup's object may also hold frames
            // of an earlier attempt that no line names any more (each named frame is still
            // checked by its hash).
            Ok(()) if !exact || buf.len() as u64 >= w.size => Ok(Loaded::Object(buf)),
            Ok(()) => Ok(Loaded::Unusable(
                format!(
                    "stored object has {} bytes, expected at least {}",
                    buf.len(),
                    w.size
                ),
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
    // Slices of one frame follow each other in an object's work: expanded once.
    let mut cache = FrameCache::new();
    while let Ok((w, loaded)) = clocked(&st.clock.decode_wait_object, || rx.recv()) {
        let object = match loaded {
            Loaded::Object(o) => o,
            Loaded::Unusable(why, buf) => {
                let _ = objects.send(buf);
                if !st.aborted() {
                    for (f, _) in &w.pieces {
                        st.mark(f, &w.shown(), &why);
                    }
                }
                continue;
            }
        };
        let t = std::time::Instant::now();
        let waited = decode_object(
            st, &w, &object, writing, &pool.0, &pool.1, &tx, progress, &mut cache,
        );
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
    cache: &mut FrameCache,
) -> std::time::Duration {
    let mut waited = std::time::Duration::ZERO;
    let Some(kind) = st.rb.kind_of(w.backup.as_deref()) else {
        for (file, _) in &w.pieces {
            st.mark(
                file,
                &w.shown(),
                "the manifest names a backup outside its chain",
            );
        }
        return waited;
    };
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
                &w.shown(),
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
        if let Err(why) = decode_piece(kind, frame, p, &mut logical, cache) {
            st.mark(file, &w.shown(), &why);
            let _ = pool_tx.send(logical);
            continue;
        }
        if let Some(parts) = &file.crcs {
            let crc = codec::crc32c(&logical);
            parts.lock().unwrap_or_else(|p| p.into_inner()).push((
                p.logical_offset,
                p.logical_size,
                crc,
            ));
        }
        if writing {
            let piece = CheckedPiece {
                file: file.clone(),
                offset: p.logical_offset,
                zero_pages: p.range_zero_pages().into_owned(),
                logical,
                compare: file.compare.get(*pi).copied().unwrap_or(false),
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

/// Writes one checked piece into `target`; the file's last sets its mtime.
fn write_piece(st: &Stages, target: &dyn RestoreTarget, piece: &CheckedPiece) -> Result<()> {
    let f = &piece.file.entry;
    if let Some(mode) = piece.file.create {
        target.create(
            &f.path,
            mode,
            f.size,
            f.mtime,
            &piece.logical,
            &piece.zero_pages,
        )?;
        if piece.file.crcs.is_some() {
            st.file_done(&piece.file)?;
        }
        return Ok(());
    }
    let len = piece.logical.len() as u64;
    if piece.compare && target.holds(&f.path, piece.offset, &piece.logical)? {
        st.equal.0.fetch_add(1, Ordering::Relaxed);
        st.equal.1.fetch_add(len, Ordering::Relaxed);
    } else {
        target.write(&f.path, piece.offset, &piece.logical, &piece.zero_pages)?;
    }
    if len > 0 && !piece.file.windows.is_empty() {
        let first = piece.offset / WRITEBACK_WINDOW;
        let last = (piece.offset + len - 1) / WRITEBACK_WINDOW;
        for w in first..=last {
            let left = piece.file.windows.get(w as usize);
            if left.is_some_and(|c| c.fetch_sub(1, Ordering::AcqRel) == 1) {
                target.written(&f.path, w * WRITEBACK_WINDOW, WRITEBACK_WINDOW);
            }
        }
    }
    if piece.file.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        st.file_done(&piece.file)?;
    }
    Ok(())
}

/// Reads, checks and writes one file on its own (restore uses it for pg_control, last):
/// `f` of `backup`, frames compressed with `kind`, into its existing file of `target`.
///
/// Errors: [`Error::Corrupt`] naming `f` when a frame does not match its checksums; the
/// store's; a failed write.
pub fn restore_one(
    backup: &Backup,
    kind: CompressType,
    f: &FileEntry,
    target: &dyn RestoreTarget,
) -> Result<()> {
    let mut logical = aligned_buf(CHUNK_SIZE as usize);
    let mut cache = FrameCache::new();
    for p in &f.pieces {
        if p.backup.is_some() {
            return Err(Error::Corrupt {
                label: format!("backup {}", backup.label()),
                files: vec![format!("{} (stored in another backup)", f.path)],
            });
        }
        let frame =
            backup
                .store()
                .get_range(&backup.object_name(&p.object), p.offset, p.stored_size)?;
        decode_piece(kind, &frame, p, &mut logical, &mut cache).map_err(|why| {
            tracing::error!("{}: {why}", f.path);
            Error::Corrupt {
                label: format!("backup {}", backup.label()),
                files: vec![f.path.clone()],
            }
        })?;
        target.write(&f.path, p.logical_offset, &logical, &p.range_zero_pages())?;
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
                        backup: None,
                        frame: None,
                        object: "000001".into(),
                        offset: 0,
                        stored_size: frame.len() as u64,
                        stored_xxh3: codec::xxh3_hex(&frame),
                        logical_offset: 0,
                        logical_size: len as u64,
                        zero_pages: zero_pages.to_vec(),
                        xxh3: Some(codec::xxh3_hex(&data)),
                        crc32c: Some(codec::crc32c(&data)),
                    };
                    let mut cache = FrameCache::new();
                    // A reused buffer full of other bytes, as the pool hands them out.
                    let mut logical = aligned_buf(len);
                    logical.resize(len, 0xAA);
                    decode_piece(kind, &frame, &piece, &mut logical, &mut cache).unwrap();
                    assert_eq!(&logical[..], &data[..], "{kind} {zero_pages:?} tail {tail}");
                    let mut bad = frame.to_vec();
                    if let Some(b) = bad.last_mut() {
                        *b ^= 1;
                        assert!(decode_piece(kind, &bad, &piece, &mut logical, &mut cache).is_err());
                    }
                }
            }
        }
    }

    /// Each window counts the wanted pieces that touch it; one across a boundary counts in
    /// both, an unwanted or empty one in none.
    #[test]
    fn window_counts_count_wanted_pieces_per_window() {
        let w = WRITEBACK_WINDOW;
        let piece = |at: u64, len: u64| Piece {
            backup: None,
            frame: None,
            object: "000001".into(),
            offset: 0,
            stored_size: 0,
            stored_xxh3: String::new(),
            logical_offset: at,
            logical_size: len,
            zero_pages: Vec::new(),
            xxh3: None,
            crc32c: None,
        };
        let pieces = [
            piece(0, 8192),
            piece(8192, w - 8192),
            piece(w, w),
            piece(2 * w - 8192, 16384),
            piece(2 * w + 8192, 0),
            piece(3 * w, 8192),
        ];
        let counts = |wanted: &[bool]| -> Vec<u32> {
            window_counts(3 * w + 8192, &pieces, wanted)
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect()
        };
        assert_eq!(counts(&[true; 6]), vec![2, 2, 1, 1]);
        assert_eq!(
            counts(&[false, true, true, false, true, false]),
            vec![1, 1, 0, 0]
        );
        assert!(window_counts(0, &[], &[]).is_empty());
    }
}

#[cfg(test)]
mod fault_tests {
    use super::*;
    use crate::codec::Compression;
    use crate::error::StorageFault;
    use crate::repo::handle::Stanza;
    use crate::repo::restore_target::MemoryTarget;
    use crate::repo::sink::tests::{memory, sample_files, store_all, TestFile, LABEL, MTIME};
    use crate::repo::sink::RepoSink;
    use crate::storage::fault::{Fault, FaultyStorage, Op};
    use crate::transfer::NoProgress;

    /// `files` stored through a sink with `kind` into stanza `s` of `store`: their lines.
    fn backed_up(stanza: &Stanza, kind: CompressType, files: &[TestFile]) -> Vec<FileEntry> {
        let backup = stanza.backup(LABEL);
        let sink = RepoSink::new(&backup, Compression::new(kind, None).unwrap());
        let (_, units) = sample_files();
        store_all(&sink, files, &units).unwrap()
    }

    /// What a restore's planner does with a line: a file of one piece is created by its
    /// writer, any other made here at its size.
    fn prepare_into(target: &MemoryTarget) -> impl FnMut(&FileEntry) -> Result<Want> + Send + '_ {
        move |f: &FileEntry| {
            if f.pieces.len() == 1 {
                return Ok(Want::Create(f.mode));
            }
            target.make(&f.path, f.size);
            Ok(Want::All)
        }
    }

    fn read_back<'a>(
        backup: &'a Backup<'a>,
        kind: CompressType,
        target: Option<&'a dyn RestoreTarget>,
    ) -> ReadBack<'a> {
        ReadBack {
            backup,
            kind,
            chain: &[],
            contiguous: true,
            target,
            jobs: 2,
        }
    }

    /// Restores `entries` of `backup` into `target` through the restore's stages.
    fn restore_into(
        backup: &Backup,
        kind: CompressType,
        entries: &[FileEntry],
        target: &MemoryTarget,
    ) -> Result<ReadOutcome> {
        let mut prepare = prepare_into(target);
        read_back(backup, kind, Some(target)).run(
            entries.iter().cloned().map(Ok),
            &mut prepare,
            &NoProgress,
        )
    }

    /// Files written through the sink read back byte for byte, with their modification
    /// time: through the restore's stages into a data directory, through `restore_one`
    /// file by file, and through verify (nothing bad).
    #[test]
    fn stored_files_restore_byte_for_byte() {
        for kind in [CompressType::Zstd, CompressType::None, CompressType::Gzip] {
            let stanza = Stanza::new(1, memory(), "s");
            let (files, _) = sample_files();
            let entries = backed_up(&stanza, kind, &files);
            let backup = stanza.backup(LABEL);

            let dir = MemoryTarget::default();
            let out = restore_into(&backup, kind, &entries, &dir).unwrap();
            assert!(out.bad.is_empty(), "{kind}: {:?}", out.bad);
            for (path, data) in &files {
                assert_eq!(
                    dir.file(path),
                    Some((data.clone(), Some(MTIME))),
                    "{kind} {path}"
                );
            }

            let one = MemoryTarget::default();
            for (e, (_, data)) in entries.iter().zip(&files) {
                one.make(&e.path, e.size);
                restore_one(&backup, kind, e, &one).unwrap();
                assert_eq!(one.file(&e.path).unwrap().0, *data, "{kind} {}", e.path);
            }

            let mut nothing = |_: &FileEntry| Ok(Want::All);
            let out = read_back(&backup, kind, None)
                .run(entries.into_iter().map(Ok), &mut nothing, &NoProgress)
                .unwrap();
            assert!(out.bad.is_empty(), "{kind}: {:?}", out.bad);
        }
    }

    /// A stored object read back with one byte flipped inside one file's frame: verify
    /// names that file and no other of the object; a restore fails with `Error::Corrupt`
    /// naming it, writes none of the damaged bytes and does not create a damaged small file
    /// at all; `restore_one` fails the same way and leaves its target as it was.
    #[test]
    fn a_damaged_frame_fails_the_read_back_naming_its_file() {
        let kind = CompressType::Zstd;
        let faulty = Arc::new(FaultyStorage::new(memory()));
        let stanza = Stanza::new(1, faulty.clone(), "s");
        let (files, _) = sample_files();
        let entries = backed_up(&stanza, kind, &files);
        let backup = stanza.backup(LABEL);
        let (rel, map) = (&entries[1], &entries[2]);
        assert_eq!(rel.path, "base/1/16384");
        assert_eq!(map.path, "global/pg_filenode.map");
        // Both frames in the first object, with the small PG_VERSION's.
        assert!(
            rel.pieces[0].object == map.pieces[0].object
                && entries[0].pieces[0].object == map.pieces[0].object
        );
        let object = format!("/data/{}", rel.pieces[0].object);
        let inside = |p: &Piece| p.offset as usize + p.stored_size as usize / 2;

        // Verify: every file of the object is checked, only the damaged one is bad.
        faulty.inject(
            Op::Get,
            &object,
            1,
            u32::MAX,
            Fault::Corrupt(inside(&rel.pieces[0])),
        );
        let mut all = |_: &FileEntry| Ok(Want::All);
        let out = read_back(&backup, kind, None)
            .run(entries.clone().into_iter().map(Ok), &mut all, &NoProgress)
            .unwrap();
        assert_eq!(out.bad, vec![rel.path.clone()]);

        // Restore: fails naming the file; the damaged range holds none of the frame's bytes.
        let dir = MemoryTarget::default();
        let e = restore_into(&backup, kind, &entries, &dir).unwrap_err();
        match e.kind() {
            Error::Corrupt { label, files } => {
                assert_eq!(files, &vec![rel.path.clone()]);
                assert!(label.contains(LABEL), "{label}");
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains(&rel.path), "{e}");
        let first = rel.pieces[0].logical_size as usize;
        let (written, mtime) = dir.file(&rel.path).unwrap();
        assert!(
            written[..first].iter().all(|b| *b == 0),
            "unchecked bytes were written"
        );
        assert_eq!(mtime, None, "a damaged file looks restored");

        // A damaged small file (created by its writer) is never created.
        faulty.heal();
        faulty.inject(
            Op::Get,
            &object,
            1,
            u32::MAX,
            Fault::Corrupt(inside(&map.pieces[0])),
        );
        let dir = MemoryTarget::default();
        let e = restore_into(&backup, kind, &entries, &dir).unwrap_err();
        assert!(
            matches!(e.kind(), Error::Corrupt { files, .. } if files == &vec![map.path.clone()]),
            "{e:?}"
        );
        assert_eq!(dir.file(&map.path), None);

        // restore_one reads the frame alone (a ranged read): damaged, nothing is written.
        faulty.heal();
        faulty.inject(Op::Get, &object, 1, 1, Fault::Corrupt(3));
        let one = MemoryTarget::default();
        one.make(&rel.path, rel.size);
        let e = restore_one(&backup, kind, rel, &one).unwrap_err();
        assert!(
            matches!(e.kind(), Error::Corrupt { files, .. } if files == &vec![rel.path.clone()]),
            "{e:?}"
        );
        assert!(one.file(&rel.path).unwrap().0.iter().all(|b| *b == 0));
        // Healed (the rule was for one read), the same call restores the file.
        restore_one(&backup, kind, rel, &one).unwrap();
        assert_eq!(one.file(&rel.path).unwrap().0, files[1].1);

        // A read that fails outright is the store's error, not a damaged file.
        faulty.inject(Op::Get, &object, 1, 1, Fault::Fail(StorageFault::Transient));
        let e = restore_one(&backup, kind, rel, &one).unwrap_err();
        crate::storage::fault::assert_transient(&e, None);
    }
}
