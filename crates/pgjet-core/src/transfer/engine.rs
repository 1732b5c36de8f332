//! The workers: units handed out through a shared cursor, each read, checked (page
//! checksums, zero pages), hashed and handed to the sink, with CPU tokens bounding the
//! threads that compress at once.
use super::*;
use crate::error::Result;
use crate::io::direct::aligned_buf;
use crate::pg::checksum::{self, PageVerdict, BLCKSZ, RELSEG_SIZE};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
