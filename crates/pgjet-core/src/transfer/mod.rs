//! The parallel transfer engine.
//!
//! Files are cut into *units* of work: a file of at least [`CHUNK_SIZE`] bytes is split into
//! chunks that separate workers copy at once; smaller files are batched into *bundles* of up
//! to [`CHUNK_SIZE`] bytes, one stored object each, so small files cost no round trip or
//! object of their own. Units are ordered largest first and handed to the worker threads
//! through a shared cursor. A thread holds one unit at a time: a read buffer of the unit's
//! size, the sink's per-thread state (for a repository, an output buffer of about the same
//! size) and, for a network source, the reply being received. So memory is bounded by about
//! `threads * 3 * CHUNK_SIZE`, whatever the cluster size or file count; the source decides
//! the number of threads ([`Source::threads`]).
//!
//! Bytes come from a [`Source`] (this host's files, or the server over libpq). Per piece a
//! worker checks PostgreSQL page checksums (re-reading a failing page once to tell a torn
//! write from corruption), finds all-zero 8 KiB pages, and hashes the logical bytes (XXH3-128
//! and CRC32C); the [`UnitSink`] then stores or writes them. That per-piece step knows
//! neither where the bytes came from nor where they go.
pub mod range_delta;

pub mod sink;
pub mod source;
pub mod stream_units;
pub mod target;

pub use crate::pg::datadir::SourceFile;
pub use source::{Source, SourceReader};
pub use target::BackupTarget;

use crate::error::{Error, Result};
use crate::io::direct::aligned_buf;
use crate::pg::checksum::{self, PageVerdict, BLCKSZ, RELSEG_SIZE};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Size of a chunk of a large file and the most logical bytes a bundle holds: 8 MiB.
/// Measured on this project's benchmark: 8 MiB keeps two workers busy on one 1 GiB segment
/// while the per-unit memory (read buffer plus frame) stays at 16 MiB per worker.
pub const CHUNK_SIZE: u64 = 8 << 20;
/// Most files in one bundle (bounds the manifest work per object).
pub const BUNDLE_MAX_FILES: usize = 4096;
/// Most parts of files (ranges of a diff's or incr's changed blocks) in one bundle
/// ([`plan_ranges_bundled`]).
pub const SCATTERED_PER_UNIT: usize = 64;

/// A range of one file inside a unit: 16 bytes, as a backup of a million files plans a
/// million of them.
#[derive(Debug, Clone, Copy)]
pub struct PieceSpec {
    /// Offset in the file, bytes.
    pub offset: u64,
    /// Index into the file list.
    pub file: u32,
    /// Length, bytes: at most [`MAX_PIECE`].
    pub len: u32,
}

/// The longest piece, bytes (1 GiB: a relation segment of the default size, far above
/// any unit size).
pub const MAX_PIECE: u64 = 1 << 30;

impl PieceSpec {
    /// The piece of file `file` at `offset`, `len` bytes. Callers cut longer ranges
    /// (see [`MAX_PIECE`]); a longer `len` or an index past `u32` is a planning bug and
    /// gives an error rather than a short copy.
    pub fn new(file: usize, offset: u64, len: u64) -> Result<PieceSpec> {
        match (u32::try_from(file), u32::try_from(len)) {
            (Ok(file), Ok(len)) if u64::from(len) <= MAX_PIECE => {
                Ok(PieceSpec { offset, file, len })
            }
            _ => Err(Error::Other(format!(
                "internal: piece of file #{file} at {offset} with {len} bytes is out of range"
            ))),
        }
    }

    /// Index into the file list.
    pub fn index(&self) -> usize {
        self.file as usize
    }

    /// Length, bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.len)
    }
}

/// A unit of work: one chunk of a large file, or a bundle of small files.
#[derive(Debug, Clone, Default)]
pub struct Unit {
    pub pieces: Vec<PieceSpec>,
    /// Sum of the piece lengths.
    pub bytes: u64,
}

/// Plans and copies `files` in one go (see [`plan_units`] and [`copy_units`]).
pub fn copy_files<S: UnitSink>(
    source: &dyn Source,
    files: &[SourceFile],
    opts: &ReadOptions,
    sink: &S,
    progress: &dyn Progress,
) -> Result<CopyOutcome> {
    copy_units(
        source,
        files,
        &plan_units(files, CHUNK_SIZE)?,
        opts,
        sink,
        progress,
    )
}

/// Splits `files` into units: chunks of the large files first (largest file first), then
/// bundles of the small ones, `chunk` bytes at most (capped at [`MAX_PIECE`]) and
/// [`BUNDLE_MAX_FILES`] files. Empty files get no unit. Errors: more than 2^32 files.
pub fn plan_units(files: &[SourceFile], chunk: u64) -> Result<Vec<Unit>> {
    plan_units_bundled(files, chunk, chunk, BUNDLE_MAX_FILES)
}

/// [`plan_units`] with bundles of at most `bundle_bytes` logical bytes (at most `chunk`)
/// and `bundle_files` files: a file smaller than `chunk` still goes into a bundle, alone
/// when it is larger than `bundle_bytes`. For the benchmarks that measure bundle sizes
/// ([`bundle_limits`]).
pub fn plan_units_bundled(
    files: &[SourceFile],
    chunk: u64,
    bundle_bytes: u64,
    bundle_files: usize,
) -> Result<Vec<Unit>> {
    plan_ranges_bundled(files, &|_| None, chunk, bundle_bytes, bundle_files)
}

/// [`plan_units_bundled`] reading only some ranges of some files: `ranges(i)` gives the
/// (offset, length) ranges of file `i` to read, in order and apart (None: the whole file).
/// A range is cut and bundled as a file of its length would be, but a bundle holds at most
/// [`SCATTERED_PER_UNIT`] parts of files: scattered blocks are read one request each, and
/// many small units keep every reader thread busy (a diff's 1317 changed blocks in 2 units
/// of 4096 took 0.44 s to read from a cold cache, in 21 units 0.18 s).
pub fn plan_ranges_bundled(
    files: &[SourceFile],
    ranges: &dyn Fn(usize) -> Option<Vec<(u64, u64)>>,
    chunk: u64,
    bundle_bytes: u64,
    bundle_files: usize,
) -> Result<Vec<Unit>> {
    let chunk = chunk.clamp(1, MAX_PIECE);
    let bundle_bytes = bundle_bytes.clamp(1, chunk);
    let bundle_files = bundle_files.max(1);
    // (file, offset, length) of every range to read.
    let mut items: Vec<(usize, u64, u64)> = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        match ranges(i) {
            None => items.push((i, 0, f.size)),
            Some(r) => items.extend(r.into_iter().map(|(o, l)| (i, o, l))),
        }
    }
    items.retain(|it| it.2 > 0);
    items.sort_by(|a, b| {
        b.2.cmp(&a.2)
            .then(files[a.0].path.cmp(&files[b.0].path))
            .then(a.1.cmp(&b.1))
    });
    let mut units = Vec::new();
    let mut bundle = Unit::default();
    // Parts of files (not whole ones) in the bundle.
    let mut parts = 0usize;
    for (i, start, size) in items {
        if size >= chunk {
            let mut off = 0;
            while off < size {
                let len = chunk.min(size - off);
                units.push(Unit {
                    pieces: vec![PieceSpec::new(i, start + off, len)?],
                    bytes: len,
                });
                off += len;
            }
        } else {
            let part = (start, size) != (0, files[i].size);
            let full = bundle.bytes + size > bundle_bytes
                || bundle.pieces.len() >= bundle_files
                || (part && parts >= SCATTERED_PER_UNIT);
            if full && !bundle.pieces.is_empty() {
                units.push(std::mem::take(&mut bundle));
                parts = 0;
            }
            bundle.pieces.push(PieceSpec::new(i, start, size)?);
            bundle.bytes += size;
            parts += usize::from(part);
        }
    }
    if !bundle.pieces.is_empty() {
        units.push(bundle);
    }
    Ok(units)
}

/// Bundle limits of a backup: logical bytes (at most [`CHUNK_SIZE`]) and files;
/// [`CHUNK_SIZE`] and [`BUNDLE_MAX_FILES`] unless the benchmarks that measure them set
/// `PGJET_BUNDLE_KIB` / `PGJET_BUNDLE_FILES` ([`crate::io::tuning`]).
pub fn bundle_limits() -> (u64, usize) {
    let t = crate::io::tuning::get();
    (
        t.bundle_bytes.unwrap_or(CHUNK_SIZE).min(CHUNK_SIZE),
        t.bundle_files.unwrap_or(BUNDLE_MAX_FILES),
    )
}

/// Receives progress; the library never draws on the terminal itself.
pub trait Progress: Sync {
    /// A phase starts with `total` bytes to move.
    fn begin(&self, phase: &str, total: u64);
    /// `bytes` more are done.
    fn advance(&self, bytes: u64);
    /// The phase is over.
    fn finish(&self);
}

/// Progress that goes nowhere.
pub struct NoProgress;
impl Progress for NoProgress {
    fn begin(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// Options of the read stage.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Worker threads.
    pub jobs: usize,
    /// Check page checksums of files with `checksum_segno`.
    pub verify_checksums: bool,
    /// Backup start LSN: pages with a newer LSN are not checked (WAL replay rewrites them).
    pub backup_start_lsn: u64,
}

/// A piece as read: its bytes and what the page checks found.
pub struct ReadPiece<'a> {
    pub spec: PieceSpec,
    /// The file's path (as in the manifest).
    pub path: &'a str,
    /// `spec.len` logical bytes.
    pub data: &'a [u8],
    /// Runs `[first, count]` of all-zero 8 KiB pages.
    pub zero_pages: Vec<[u32; 2]>,
    /// XXH3-128 hex of `data`.
    pub xxh3: String,
    /// CRC32C of `data`.
    pub crc32c: u32,
}

/// Where units go: a repository (compress and store) or a data directory (write in place).
pub trait UnitSink: Sync {
    /// Per-worker state (e.g. a compression context).
    type State;
    /// What the sink reports of each piece it stored (a repository: where the piece's frame
    /// is and its hashes, for the manifest; a data directory: nothing).
    type Piece: Send;
    /// Makes one worker's state.
    fn new_state(&self) -> Result<Self::State>;
    /// Stores one unit and returns what it reports of each read piece, in order. The
    /// caller holds one of the `jobs` CPU-stage tokens; `release` gives it back, for a sink
    /// whose last step only waits (an upload), so another thread's CPU work runs meanwhile.
    fn write_unit(
        &self,
        st: &mut Self::State,
        pieces: &[ReadPiece],
        release: &mut dyn FnMut(),
    ) -> Result<Vec<Self::Piece>>;
    /// The copy failed: stop waiting on slow writes (an object store's retries).
    fn abort(&self) {}
}

/// What a copy found, indexed like the file list (the pieces themselves go to a
/// [`Collector`] as units complete).
#[derive(Debug, Default)]
pub struct CopyOutcome {
    /// Blocks with a failed page checksum, per file.
    pub page_errors: Vec<Vec<u32>>,
    /// Files that disappeared during the copy (dropped relations): leave them out.
    pub vanished: Vec<bool>,
    /// Blocks with a failed page checksum, all files together.
    pub page_error_count: usize,
}

/// What one unit produced, handed to a [`Collector`] when the unit is stored: each piece with
/// its file's index, the blocks whose page checksum failed twice, the files that vanished.
pub struct UnitDone<P> {
    pub pieces: Vec<(usize, P)>,
    pub page_errors: Vec<(usize, u32)>,
    pub vanished: Vec<usize>,
}

/// Receives each unit's outcome as the unit completes; the engine serializes the calls.
/// An error stops the copy.
pub trait Collector<P>: Send {
    fn unit_done(&mut self, done: UnitDone<P>) -> Result<()>;
}

/// Keeps what the copy found and drops the pieces (a sink whose pieces carry nothing to
/// keep, such as a data directory's).
impl<P> Collector<P> for CopyOutcome {
    fn unit_done(&mut self, done: UnitDone<P>) -> Result<()> {
        self.page_error_count += done.page_errors.len();
        for (file, blk) in done.page_errors {
            self.page_errors[file].push(blk);
        }
        for file in done.vanished {
            self.vanished[file] = true;
        }
        Ok(())
    }
}

/// Puts files together from units as they complete, and hands each whole file to `emit`
/// once (pieces in logical order, page errors sorted): a backup writes its manifest while it
/// copies, and keeps only the files still in progress. Files that vanished during the copy
/// are not emitted; their indexes are in [`FileAssembler::vanished`]. With
/// [`FileAssembler::prefixes`] set, a file in progress is also handed over each time the
/// pieces stored from its start grow (its contiguous prefix: a backup's resume journal saves
/// large files in part).
///
/// Memory: 4 bytes per file, plus the pieces of the files in progress (units are claimed in
/// order and a large file's chunks are consecutive units, so few are).
pub struct FileAssembler<'a, P: PieceOffset> {
    /// Pieces not yet stored, per file.
    remaining: Vec<u32>,
    /// Files in progress: pieces so far, page errors, vanished.
    open: std::collections::HashMap<usize, (Vec<P>, Vec<u32>, bool)>,
    emit: &'a mut FileEmit<'a, P>,
    /// Hand over the growing prefixes of files in progress too.
    pub prefixes: bool,
    /// The end of the prefix last handed over, per file in progress.
    reported: std::collections::HashMap<usize, u64>,
    /// Bytes of pieces added since the prefix was last looked at, per file in progress:
    /// the prefix is looked at again after [`PREFIX_STEP`] more, so that a file of many
    /// small pieces (an incremental's changed blocks among its references) costs linear
    /// time, not a copy of its pieces per piece.
    since: std::collections::HashMap<usize, u64>,
    /// Files that vanished during the copy.
    pub vanished: Vec<usize>,
    /// Blocks with a failed page checksum, all files together.
    pub page_error_count: usize,
}

/// Bytes of pieces stored for a file between two looks at its prefix
/// ([`FileAssembler::prefixes`]): 8 MiB, a few chunks; a resume journal saves every 64 MiB
/// or more, so it never waits for a prefix longer than this.
pub const PREFIX_STEP: u64 = 8 << 20;

/// What a [`FileAssembler`] hands its files to: (file index, pieces in logical order, page
/// errors sorted, whole). `whole` false: the pieces are the file's stored prefix so far
/// (from offset 0, contiguous), no page errors; the file comes again, whole, later.
pub type FileEmit<'a, P> = dyn FnMut(usize, Vec<P>, Vec<u32>, bool) -> Result<()> + Send + 'a;

/// A stored piece that knows where it lies in its file, so an assembler can order a file's
/// pieces.
pub trait PieceOffset: Send {
    /// Offset of the piece in its file, bytes.
    fn logical_offset(&self) -> u64;
    /// Offset just past the piece's end in its file, bytes.
    fn logical_end(&self) -> u64;
}

impl<'a, P: PieceOffset + Clone> FileAssembler<'a, P> {
    /// An assembler for `files` copied as `units`; files no unit covers (empty ones) are
    /// emitted at once.
    pub fn new(
        files: &[SourceFile],
        units: &[Unit],
        emit: &'a mut FileEmit<'a, P>,
    ) -> Result<FileAssembler<'a, P>> {
        Self::with_seeds(files, units, Vec::new(), emit)
    }

    /// [`FileAssembler::new`] with pieces known before the copy (`seeds`: file index and
    /// piece; a differential backup's ranges that are not read): each file is emitted with
    /// its seeds and its copied pieces, in logical order.
    pub fn with_seeds(
        files: &[SourceFile],
        units: &[Unit],
        seeds: Vec<(usize, P)>,
        emit: &'a mut FileEmit<'a, P>,
    ) -> Result<FileAssembler<'a, P>> {
        let mut remaining = vec![0u32; files.len()];
        for u in units {
            for p in &u.pieces {
                remaining[p.index()] += 1;
            }
        }
        let mut open: std::collections::HashMap<usize, (Vec<P>, Vec<u32>, bool)> =
            Default::default();
        for (i, p) in seeds {
            open.entry(i).or_default().0.push(p);
        }
        for (i, n) in remaining.iter().enumerate() {
            if *n == 0 {
                let mut pieces = open.remove(&i).map(|o| o.0).unwrap_or_default();
                pieces.sort_by_key(|p| p.logical_offset());
                emit(i, pieces, Vec::new(), true)?;
            }
        }
        Ok(FileAssembler {
            remaining,
            open,
            emit,
            prefixes: false,
            reported: Default::default(),
            since: Default::default(),
            vanished: Vec::new(),
            page_error_count: 0,
        })
    }

    fn piece_done(&mut self, file: usize) -> Result<()> {
        self.remaining[file] -= 1;
        if self.remaining[file] == 0 {
            self.reported.remove(&file);
            self.since.remove(&file);
            if let Some((mut pieces, mut errs, gone)) = self.open.remove(&file) {
                if gone {
                    self.vanished.push(file);
                } else {
                    pieces.sort_by_key(|p| p.logical_offset());
                    errs.sort_unstable();
                    (self.emit)(file, pieces, errs, true)?;
                }
            }
        } else if self.prefixes && self.since.get(&file).is_some_and(|b| *b >= PREFIX_STEP) {
            self.since.insert(file, 0);
            self.prefix(file)?;
        }
        Ok(())
    }

    /// Hands over the stored prefix of `file`, in progress, when it grew.
    fn prefix(&mut self, file: usize) -> Result<()> {
        let Some((pieces, _, false)) = self.open.get_mut(&file) else {
            return Ok(());
        };
        pieces.sort_by_key(|p| p.logical_offset());
        let mut end = 0;
        let mut n = 0;
        for p in pieces.iter() {
            if p.logical_offset() != end {
                break;
            }
            end = p.logical_end();
            n += 1;
        }
        let before = self.reported.get(&file).copied().unwrap_or(0);
        if end > before {
            self.reported.insert(file, end);
            let prefix = pieces[..n].to_vec();
            (self.emit)(file, prefix, Vec::new(), false)?;
        }
        Ok(())
    }
}

impl<P: PieceOffset + Clone> Collector<P> for FileAssembler<'_, P> {
    fn unit_done(&mut self, done: UnitDone<P>) -> Result<()> {
        self.page_error_count += done.page_errors.len();
        for (file, blk) in done.page_errors {
            self.open.entry(file).or_default().1.push(blk);
        }
        for file in done.vanished {
            self.open.entry(file).or_default().2 = true;
            self.piece_done(file)?;
        }
        for (file, piece) in done.pieces {
            if self.prefixes {
                *self.since.entry(file).or_default() +=
                    piece.logical_end() - piece.logical_offset();
            }
            self.open.entry(file).or_default().0.push(piece);
            self.piece_done(file)?;
        }
        Ok(())
    }
}

struct Shared {
    next: AtomicUsize,
    /// The first error, and whether the workers should stop.
    stop: crate::io::parallel::Stop,
    /// Tokens for the CPU stage: `jobs` of them.
    permits: (
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<()>,
    ),
}

/// A CPU-stage token, given back when dropped.
struct Permit<'a>(&'a crossbeam_channel::Sender<()>);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        // The channel has room for every token: it was made with capacity `jobs`.
        let _ = self.0.send(());
    }
}

impl Shared {
    fn new(jobs: usize) -> Shared {
        let permits = crossbeam_channel::bounded(jobs);
        for _ in 0..jobs {
            let _ = permits.0.send(());
        }
        Shared {
            next: AtomicUsize::new(0),
            stop: Default::default(),
            permits,
        }
    }

    /// Waits for a CPU-stage token.
    fn permit(&self) -> Permit<'_> {
        // Both ends live in `self`, so the channel cannot be disconnected.
        let _ = self.permits.1.recv();
        Permit(&self.permits.0)
    }
}

/// Runs the source's threads for `opts.jobs` workers over `units`, reading `files` from
/// `source` into `sink`; at most `opts.jobs` threads are in the CPU stage at once. Keeps
/// what the copy found and drops the sink's pieces (see [`copy_units_into`] to receive them).
///
/// Errors: the first read or sink error stops all workers and is returned. A file that
/// vanishes is marked in [`CopyOutcome::vanished`] instead.
pub fn copy_units<S: UnitSink>(
    source: &dyn Source,
    files: &[SourceFile],
    units: &[Unit],
    opts: &ReadOptions,
    sink: &S,
    progress: &dyn Progress,
) -> Result<CopyOutcome> {
    let mut out = CopyOutcome {
        page_errors: vec![Vec::new(); files.len()],
        vanished: vec![false; files.len()],
        page_error_count: 0,
    };
    copy_units_into(source, files, units, opts, sink, &mut out, progress)?;
    for e in &mut out.page_errors {
        e.sort_unstable();
    }
    Ok(out)
}

/// [`copy_units`], handing each unit's outcome to `collector` as the unit completes.
pub fn copy_units_into<S: UnitSink>(
    source: &dyn Source,
    files: &[SourceFile],
    units: &[Unit],
    opts: &ReadOptions,
    sink: &S,
    collector: &mut dyn Collector<S::Piece>,
    progress: &dyn Progress,
) -> Result<()> {
    let jobs = opts.jobs.max(1);
    let shared = Shared::new(jobs);
    let collector = Mutex::new(collector);
    std::thread::scope(|s| {
        for _ in 0..source.threads(jobs).max(1) {
            s.spawn(|| {
                if let Err(e) = worker(
                    source, files, units, opts, sink, progress, &shared, &collector,
                ) {
                    shared.stop.fail(e);
                    sink.abort();
                }
            });
        }
    });
    shared.stop.into_result()
}

#[allow(clippy::too_many_arguments)]
fn worker<S: UnitSink>(
    source: &dyn Source,
    files: &[SourceFile],
    units: &[Unit],
    opts: &ReadOptions,
    sink: &S,
    progress: &dyn Progress,
    shared: &Shared,
    collector: &Mutex<&mut dyn Collector<S::Piece>>,
) -> Result<()> {
    let mut state = sink.new_state()?;
    let mut reader = source.reader()?;
    let mut buf = aligned_buf(CHUNK_SIZE as usize);
    let claim = || units.get(shared.next.fetch_add(1, Ordering::SeqCst));
    // A source that queues reads gets each thread's next unit announced before the thread
    // waits for its current one, so a request is always queued while a unit arrives and is
    // processed; other sources claim a unit only when a thread is free for it.
    let ahead = source.queues_reads();
    let mut next = if ahead { claim() } else { None };
    if let Some(u) = next {
        reader.prefetch(files, &u.pieces);
    }
    loop {
        if shared.stop.stopped() {
            return Ok(());
        }
        crate::io::cancel::check()?;
        let Some(unit) = (if ahead { next } else { claim() }) else {
            return Ok(());
        };
        if ahead {
            next = claim();
            if let Some(u) = next {
                reader.prefetch(files, &u.pieces);
            }
        }
        buf.clear();
        buf.resize(unit.bytes as usize, 0);
        // I/O stage: read every piece of the unit (no CPU permit held).
        let found = reader.read(files, &unit.pieces, &mut buf)?;
        let mut read = Vec::with_capacity(unit.pieces.len());
        let mut vanished = Vec::new();
        let mut pos = 0usize;
        for (spec, here) in unit.pieces.iter().zip(found) {
            let range = pos..pos + spec.len as usize;
            pos += spec.len as usize;
            if here {
                read.push((*spec, range));
            } else {
                vanished.push(spec.index());
            }
        }
        // CPU stage (page checks, hashes, compression) and the write: at most `jobs` at once
        // (a sink may give the token back before it waits on an upload).
        let mut permit = Some(shared.permit());
        let mut errors = Vec::new();
        let mut scanned = Vec::with_capacity(read.len());
        for (spec, range) in read {
            let mut reread = |page: PieceSpec, into: &mut [u8]| -> Result<bool> {
                Ok(reader.read(files, &[page], into)?.first() == Some(&true))
            };
            let zero_pages = scan_pages(
                &files[spec.index()],
                &spec,
                &mut buf[range.clone()],
                opts,
                &mut reread,
                &mut errors,
            )?;
            scanned.push((spec, range, zero_pages));
        }
        let pieces: Vec<ReadPiece> = scanned
            .into_iter()
            .map(|(spec, range, zero_pages)| {
                let data = &buf[range];
                ReadPiece {
                    spec,
                    path: &files[spec.index()].path,
                    data,
                    zero_pages,
                    xxh3: crate::codec::xxh3_hex(data),
                    crc32c: crate::codec::crc32c(data),
                }
            })
            .collect();
        let stored = sink.write_unit(&mut state, &pieces, &mut || drop(permit.take()))?;
        let done = UnitDone {
            pieces: pieces
                .iter()
                .map(|rp| rp.spec.index())
                .zip(stored)
                .collect(),
            page_errors: errors,
            vanished,
        };
        collector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unit_done(done)?;
        progress.advance(unit.bytes);
    }
}

/// Finds all-zero pages and checks page checksums of one piece of file `f`; returns the
/// zero-page runs. A page whose checksum fails is read again once through `reread` (the
/// page's spec and an 8 KiB buffer; false: the file is gone or cannot be read again): a
/// page that was being written (torn read) then passes or carries an LSN past the backup
/// start; one that fails again is recorded in `errors` as (file, block number).
pub(crate) fn scan_pages(
    f: &SourceFile,
    spec: &PieceSpec,
    data: &mut [u8],
    opts: &ReadOptions,
    reread: &mut dyn FnMut(PieceSpec, &mut [u8]) -> Result<bool>,
    errors: &mut Vec<(usize, u32)>,
) -> Result<Vec<[u32; 2]>> {
    let mut runs: Vec<[u32; 2]> = Vec::new();
    if !spec.offset.is_multiple_of(BLCKSZ as u64) {
        return Ok(runs);
    }
    let check = opts.verify_checksums && f.checksum_segno.is_some();
    let first_block = (spec.offset / BLCKSZ as u64) as u32;
    for (i, page) in data.chunks_exact_mut(BLCKSZ).enumerate() {
        let i = i as u32;
        if checksum::page_is_zero(page) {
            match runs.last_mut() {
                Some(r) if r[0] + r[1] == i => r[1] += 1,
                _ => runs.push([i, 1]),
            }
            continue;
        }
        if !check {
            continue;
        }
        let blkno = f
            .checksum_segno
            .unwrap_or(0)
            .wrapping_mul(RELSEG_SIZE)
            .wrapping_add(first_block + i);
        if let PageVerdict::Mismatch { stored, computed } =
            checksum::verify_page(page, blkno, opts.backup_start_lsn)
        {
            let mut again = vec![0u8; BLCKSZ];
            let page_spec = PieceSpec {
                file: spec.file,
                offset: spec.offset + i as u64 * BLCKSZ as u64,
                len: BLCKSZ as u32,
            };
            let ok = reread(page_spec, &mut again)?
                && !matches!(
                    checksum::verify_page(&again, blkno, opts.backup_start_lsn),
                    PageVerdict::Mismatch { .. }
                );
            if ok {
                page.copy_from_slice(&again);
            } else {
                tracing::warn!(
                    "page checksum mismatch in {} block {blkno}: stored {stored:#06x}, computed {computed:#06x}",
                    f.path
                );
                errors.push((spec.index(), blkno));
            }
        }
    }
    Ok(runs)
}

/// The runs `[first, count]` of all-zero 8 KiB pages of `data` (a trailing partial page is
/// never one).
pub fn zero_page_runs(data: &[u8]) -> Vec<[u32; 2]> {
    let mut runs: Vec<[u32; 2]> = Vec::new();
    for (i, page) in data.chunks_exact(BLCKSZ).enumerate() {
        let i = i as u32;
        if checksum::page_is_zero(page) {
            match runs.last_mut() {
                Some(r) if r[0] + r[1] == i => r[1] += 1,
                _ => runs.push([i, 1]),
            }
        }
    }
    runs
}

/// The (offset, length) ranges of a piece of `len` bytes that are not in `zero_pages`, in
/// order. None when the runs are out of order or reach past `len` (a damaged manifest).
pub fn nonzero_ranges(len: usize, zero_pages: &[[u32; 2]]) -> Option<Vec<(usize, usize)>> {
    let mut out = Vec::with_capacity(zero_pages.len() + 1);
    let mut pos = 0usize;
    for r in zero_pages {
        let start = (r[0] as usize).checked_mul(BLCKSZ)?;
        let end = (r[0] as usize)
            .checked_add(r[1] as usize)?
            .checked_mul(BLCKSZ)?;
        if start < pos || end > len {
            return None;
        }
        if start > pos {
            out.push((pos, start - pos));
        }
        pos = end;
    }
    if pos < len {
        out.push((pos, len - pos));
    }
    Some(out)
}

/// Splits `data` of a piece into (offset, bytes) runs of pages that are not all-zero.
/// `zero_pages` must come from [`scan_pages`] or a checked manifest.
pub fn nonzero_runs<'a>(data: &'a [u8], zero_pages: &[[u32; 2]]) -> Vec<(usize, &'a [u8])> {
    nonzero_ranges(data.len(), zero_pages)
        .unwrap_or_default()
        .into_iter()
        .map(|(o, n)| (o, &data[o..o + n]))
        .collect()
}

/// The units as (file, offset, length) lists, for tests of the planners.
#[cfg(test)]
pub(crate) fn unit_shape(units: &[Unit]) -> Vec<Vec<(usize, u64, u64)>> {
    units
        .iter()
        .map(|u| {
            u.pieces
                .iter()
                .map(|p| (p.index(), p.offset, p.bytes()))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str, size: u64) -> SourceFile {
        SourceFile::plain(path, size)
    }

    /// A piece as (offset, length), for the assembler's tests.
    #[derive(Clone, Debug, PartialEq)]
    struct Span(u64, u64);

    impl PieceOffset for Span {
        fn logical_offset(&self) -> u64 {
            self.0
        }
        fn logical_end(&self) -> u64 {
            self.0 + self.1
        }
    }

    #[test]
    fn prefixes_come_every_step_and_the_whole_file_once() {
        // One file of 4096 pieces of 8 KiB (32 MiB), stored in order, one unit each.
        let blk = 8192u64;
        let n = 4096u64;
        let files = vec![f("rel", n * blk)];
        let units: Vec<Unit> = (0..n)
            .map(|k| Unit {
                pieces: vec![PieceSpec::new(0, k * blk, blk).unwrap()],
                bytes: blk,
            })
            .collect();
        let mut got: Vec<(u64, usize, bool)> = Vec::new();
        let mut emit = |_i: usize, pieces: Vec<Span>, _e: Vec<u32>, whole: bool| {
            got.push((
                pieces.last().map_or(0, |p| p.logical_end()),
                pieces.len(),
                whole,
            ));
            Ok(())
        };
        let mut asm = FileAssembler::new(&files, &units, &mut emit).unwrap();
        asm.prefixes = true;
        for k in 0..n {
            asm.unit_done(UnitDone {
                pieces: vec![(0, Span(k * blk, blk))],
                page_errors: Vec::new(),
                vanished: Vec::new(),
            })
            .unwrap();
        }
        drop(asm);
        // A prefix after every PREFIX_STEP bytes (3 of them: 8, 16, 24 MiB), then the whole.
        let step = (PREFIX_STEP / blk) as usize;
        assert_eq!(
            got,
            vec![
                (PREFIX_STEP, step, false),
                (2 * PREFIX_STEP, 2 * step, false),
                (3 * PREFIX_STEP, 3 * step, false),
                (n * blk, n as usize, true),
            ]
        );
    }

    #[test]
    fn large_files_chunked_small_bundled_largest_first() {
        let files = vec![f("a", 3), f("big", 20), f("b", 4), f("empty", 0), f("c", 9)];
        let units = plan_units(&files, 8).unwrap();
        assert_eq!(
            unit_shape(&units),
            vec![
                vec![(1, 0, 8)],
                vec![(1, 8, 8)],
                vec![(1, 16, 4)],
                vec![(4, 0, 8)],
                vec![(4, 8, 1)],
                vec![(2, 0, 4), (0, 0, 3)],
            ]
        );
        assert!(units
            .iter()
            .all(|u| u.bytes == u.pieces.iter().map(|p| p.bytes()).sum::<u64>()));
    }

    #[test]
    fn bundles_obey_their_own_limits() {
        let files = vec![f("a", 3), f("b", 3), f("c", 3), f("mid", 6), f("big", 20)];
        // chunks of 8, bundles of at most 5 bytes and 2 files: "mid" (6 bytes, under a
        // chunk) is a bundle of its own, and a, b, c (3 bytes each) go one per bundle.
        let units = plan_units_bundled(&files, 8, 5, 2).unwrap();
        assert_eq!(
            unit_shape(&units),
            vec![
                vec![(4, 0, 8)],
                vec![(4, 8, 8)],
                vec![(4, 16, 4)],
                vec![(3, 0, 6)],
                vec![(0, 0, 3)],
                vec![(1, 0, 3)],
                vec![(2, 0, 3)],
            ]
        );
        let units = plan_units_bundled(&files, 8, 8, 2).unwrap();
        assert_eq!(
            unit_shape(&units)[3..],
            [vec![(3, 0, 6)], vec![(0, 0, 3), (1, 0, 3)], vec![(2, 0, 3)]]
        );
    }

    #[test]
    fn ranges_are_cut_and_bundled_like_files() {
        let files = vec![f("a", 30), f("b", 5)];
        // Of a: 2 bytes at 4 and 12 bytes at 16; b whole.
        let ranges = |i: usize| (i == 0).then(|| vec![(4, 2), (16, 12)]);
        let units = plan_ranges_bundled(&files, &ranges, 8, 8, 4).unwrap();
        assert_eq!(
            unit_shape(&units),
            vec![
                vec![(0, 16, 8)],
                vec![(0, 24, 4)],
                vec![(1, 0, 5), (0, 4, 2)]
            ]
        );
    }

    #[test]
    fn nonzero_runs_skip_zero_pages() {
        let data = vec![1u8; BLCKSZ * 5 + 10];
        let runs = nonzero_runs(&data, &[[1, 2], [4, 1]]);
        let shape: Vec<(usize, usize)> = runs.iter().map(|(o, d)| (*o, d.len())).collect();
        assert_eq!(
            shape,
            vec![(0, BLCKSZ), (3 * BLCKSZ, BLCKSZ), (5 * BLCKSZ, 10)]
        );
    }

    #[test]
    fn zero_page_ranges() {
        assert_eq!(
            nonzero_ranges(5 * BLCKSZ + 10, &[[1, 2], [4, 1]]).unwrap(),
            vec![(0, BLCKSZ), (3 * BLCKSZ, BLCKSZ), (5 * BLCKSZ, 10)]
        );
        assert!(nonzero_ranges(BLCKSZ, &[[0, 2]]).is_none());
        assert!(nonzero_ranges(4 * BLCKSZ, &[[2, 1], [1, 1]]).is_none());
        assert!(nonzero_ranges(4 * BLCKSZ, &[[u32::MAX, u32::MAX]]).is_none());
    }
}
