//! Reading a backup back: every stored frame is checked (XXH3-128 of the stored bytes),
//! expanded, checked again (XXH3-128 of the logical bytes) and only then written. `verify`
//! runs the same checks without writing.
use super::sink::{punch_zero_pages, write_runs};
use super::Progress;
use crate::codec::{self, CompressType};
use crate::error::{Error, Result};
use crate::repo::{self, BackupManifest, Piece};
use crate::storage::direct::{aligned_buf, AlignedBuf, Writer, DIRECT_MIN_WRITE};
use crate::storage::Storage;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// The frames of one object: (file index, piece index) pairs, and the object's expected size.
struct ObjectWork {
    name: String,
    pieces: Vec<(usize, usize)>,
    size: u64,
}

/// Groups the pieces to read by object: all but those of file `skip`, and, with `needed`
/// (a delta restore), only the pieces it marks.
fn group_by_object(
    m: &BackupManifest,
    skip: Option<usize>,
    needed: Option<&[Vec<bool>]>,
) -> Vec<ObjectWork> {
    let mut map: BTreeMap<&str, ObjectWork> = BTreeMap::new();
    for (fi, f) in m.files.iter().enumerate() {
        for (pi, p) in f.pieces.iter().enumerate() {
            let w = map.entry(&p.object).or_insert_with(|| ObjectWork {
                name: p.object.clone(),
                pieces: vec![],
                size: 0,
            });
            w.size += p.stored_size;
            let wanted = needed
                .map(|n| n.get(fi).and_then(|f| f.get(pi)).copied().unwrap_or(true))
                .unwrap_or(true);
            if Some(fi) != skip && wanted {
                w.pieces.push((fi, pi));
            }
        }
    }
    let mut v: Vec<ObjectWork> = map.into_values().filter(|w| !w.pieces.is_empty()).collect();
    v.sort_by_key(|w| std::cmp::Reverse(w.size));
    v
}

/// Threads that read stored objects ahead of the decoders, each with one direct read in
/// flight. Reads share the disk with the writers' requests, and most objects of a zstd
/// backup are small (an 8 MiB chunk of table data stores as about 1.6 MiB), so each read
/// waits behind the queued writes: with two readers the decoders waited for objects about
/// 8 of 11 seconds, with four about 5 (docs/benchmark-notes.md, restore section).
pub const READ_AHEAD: usize = 4;
/// Objects read and waiting for a decoder (each at most about [`super::CHUNK_SIZE`]). The
/// readers are the stage that falls behind, not the decoders, so one slot is enough.
const LOADED_QUEUE: usize = 1;
/// Threads that write checked pieces into the target files, each with one direct write of
/// up to 8 MiB in flight. The disk of the benchmark machine writes faster with more
/// requests in flight (docs/benchmark-notes.md, restore section: 2 054 MiB took 5.7 s with
/// one `dd` and 4.2 to 2.6 s with four to eight at once), and a restore writes four times
/// the bytes it reads, so the writes get the depth. The ranges are allocated before the
/// writers start ([`allocate_targets`]): on ext4 direct writes that fill holes in one file
/// go one at a time. Independent of `--jobs`, which sizes the CPU stage.
pub const WRITERS: usize = 4;
/// Checked pieces waiting for a writer, beyond the ones being written: keeps the writers
/// busy while the decoders are descheduled. Each is a buffer of up to 8 MiB.
const WRITE_QUEUE: usize = 2;

/// Checks every frame of backup `m` and, when `target` (a data directory) is given, writes
/// each file's bytes into `target/<its path>` (files must already exist at their final size;
/// the paths are made when written, not kept per file). Files at index
/// `skip` are left out (restore writes pg_control last, on its own).
///
/// Returns the paths of the files with missing or damaged frames (verify: all of them;
/// restore stops at the first and returns [`Error::Corrupt`]).
pub fn read_back(
    store: &dyn Storage,
    m: &BackupManifest,
    target: Option<&Path>,
    skip: Option<usize>,
    jobs: usize,
    progress: &dyn Progress,
) -> Result<Vec<String>> {
    read_back_with(store, m, target, skip, None, jobs, progress, &mut || Ok(()))
}

/// A stored object as read, or why it could not be used.
enum Loaded {
    Object(AlignedBuf),
    /// Why, and the unused buffer (back to the pool).
    Unusable(String, AlignedBuf),
}

/// A checked piece on its way to a writer: its logical bytes in a buffer of the pool.
struct CheckedPiece {
    file: usize,
    offset: u64,
    zero_pages: Vec<[u32; 2]>,
    logical: AlignedBuf,
}

/// State shared by the three stages of [`read_back_with`].
struct Stages<'a> {
    abort: AtomicBool,
    /// Where the stages' threads spent their time, summed over threads (debug log): tells
    /// a restore bound by the disk from one bound by the CPU.
    clock: StageClock,
    bad: Mutex<Vec<String>>,
    first_error: Mutex<Option<Error>>,
    restoring: bool,
    m: &'a BackupManifest,
    /// Cancelled on the first error, so readers waiting on an object store stop at once.
    store: &'a dyn Storage,
}

/// Nanoseconds summed over the threads of each stage.
#[derive(Default)]
struct StageClock {
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
            "restore stages, seconds summed over threads: read {:.2} (waiting for a buffer {:.2}), \
             decode {:.2} (waiting for an object {:.2}, for a buffer {:.2}), write {:.2} \
             (waiting for a piece {:.2})",
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
        self.abort.store(true, Ordering::SeqCst);
        self.store.cancel();
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    }

    fn mark(&self, fi: usize, object: &str, why: &str) {
        let path = &self.m.files[fi].path;
        tracing::error!("{path}: {why} (object data/{object})");
        self.bad
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.clone());
        // A restore stops at the first damaged file; verify goes on to find them all.
        if self.restoring {
            self.abort.store(true, Ordering::SeqCst);
        }
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }
}

/// [`read_back`] in three overlapping stages: [`READ_AHEAD`] threads read stored objects
/// (largest first), `jobs` threads check and expand their frames ([`decode_piece`]), and,
/// when restoring, [`WRITERS`] threads write the checked pieces. Only a piece whose stored
/// and logical checksums matched reaches a writer. `before_write` runs on the calling thread
/// while the first objects are read and decoded; no piece is written before it returns Ok
/// (restore creates the target files there).
///
/// Memory is bounded by two pools of buffers reused throughout, each buffer of about
/// [`super::CHUNK_SIZE`] (8 MiB): `READ_AHEAD + LOADED_QUEUE + jobs` object buffers and
/// `jobs + WRITE_QUEUE + WRITERS` logical buffers: 15 buffers, about 125 MiB resident with
/// 2 jobs, whatever the size of the backup.
///
/// With `needed` (a delta restore into files that hold other bytes), only the marked pieces
/// are read and written, and their all-zero pages are punched out of the target rather than
/// left as they were.
#[allow(clippy::too_many_arguments)]
pub fn read_back_with(
    store: &dyn Storage,
    m: &BackupManifest,
    target: Option<&Path>,
    skip: Option<usize>,
    needed: Option<&[Vec<bool>]>,
    jobs: usize,
    progress: &dyn Progress,
    before_write: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<String>> {
    let work = group_by_object(m, skip, needed);
    let overwrite = needed.is_some();
    let jobs = jobs.max(1);
    let next = AtomicUsize::new(0);
    let st = Stages {
        abort: AtomicBool::new(false),
        clock: StageClock::default(),
        bad: Mutex::new(Vec::new()),
        first_error: Mutex::new(None),
        restoring: target.is_some(),
        m,
        store,
    };
    let (loaded_tx, loaded_rx) = crossbeam_channel::bounded::<(usize, Loaded)>(LOADED_QUEUE);
    // Object buffers: one per reader, per queue slot and per decoder, reused throughout
    // (fresh memory costs a page fault per 4 KiB).
    let objects = READ_AHEAD + LOADED_QUEUE + jobs;
    let (obj_tx, obj_rx) = crossbeam_channel::bounded::<AlignedBuf>(objects);
    for _ in 0..objects {
        let _ = obj_tx.send(aligned_buf(
            super::CHUNK_SIZE as usize + super::CHUNK_SIZE as usize / 64,
        ));
    }
    let (write_tx, write_rx) = crossbeam_channel::bounded::<CheckedPiece>(WRITE_QUEUE);
    // The pool of logical buffers: a decoder takes one per piece, a writer gives it back.
    let pool_size = if target.is_some() {
        jobs + WRITE_QUEUE + WRITERS
    } else {
        jobs
    };
    let (pool_tx, pool_rx) = crossbeam_channel::bounded::<AlignedBuf>(pool_size);
    for _ in 0..pool_size {
        // The channel has room for every buffer.
        let _ = pool_tx.send(aligned_buf(super::CHUNK_SIZE as usize));
    }
    std::thread::scope(|s| {
        for _ in 0..READ_AHEAD {
            let (tx, obj_rx) = (loaded_tx.clone(), obj_rx.clone());
            let (st, work, next) = (&st, &work, &next);
            s.spawn(move || {
                while !st.aborted() {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(w) = work.get(i) else { break };
                    // Buffers come back from the decoders; the pool owns every one.
                    let Ok(buf) = clocked(&st.clock.read_wait_buffer, || obj_rx.recv()) else {
                        break;
                    };
                    match clocked(&st.clock.read, || load_object(store, m, w, buf)) {
                        Ok(l) => {
                            if tx.send((i, l)).is_err() {
                                break;
                            }
                        }
                        Err(e) => st.fail(e),
                    }
                }
            });
        }
        drop(loaded_tx);
        for _ in 0..jobs {
            let (rx, tx) = (loaded_rx.clone(), write_tx.clone());
            let (pool_tx, pool_rx) = (pool_tx.clone(), pool_rx.clone());
            let (st, work, obj_tx) = (&st, &work, obj_tx.clone());
            s.spawn(move || {
                // Drain the queue even after an abort, so no reader stays blocked on it.
                while let Ok((i, loaded)) = clocked(&st.clock.decode_wait_object, || rx.recv()) {
                    let w = &work[i];
                    let object = match loaded {
                        Loaded::Object(o) => o,
                        Loaded::Unusable(why, buf) => {
                            let _ = obj_tx.send(buf);
                            if !st.aborted() {
                                for &(fi, _) in &w.pieces {
                                    st.mark(fi, &w.name, &why);
                                }
                            }
                            continue;
                        }
                    };
                    let t = std::time::Instant::now();
                    let waited = decode_object(
                        st,
                        m,
                        w,
                        &object,
                        target.is_some(),
                        &pool_tx,
                        &pool_rx,
                        &tx,
                        progress,
                    );
                    let busy = t.elapsed().saturating_sub(waited);
                    st.clock
                        .decode
                        .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
                    st.clock
                        .decode_wait_buffer
                        .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                    let _ = obj_tx.send(object);
                }
            });
        }
        drop(write_tx);
        // Readers and decoders are running: prepare the targets meanwhile.
        if let Err(e) = before_write() {
            st.fail(e);
        }
        for _ in 0..WRITERS {
            let (rx, pool_tx, st) = (write_rx.clone(), pool_tx.clone(), &st);
            s.spawn(move || {
                while let Ok(piece) = clocked(&st.clock.write_wait_piece, || rx.recv()) {
                    if !st.aborted() {
                        if let Some(root) = target {
                            let n = piece.logical.len() as u64;
                            let path = root.join(&m.files[piece.file].path);
                            match clocked(&st.clock.write, || {
                                write_runs(&path, piece.offset, &piece.logical, &piece.zero_pages)?;
                                if overwrite && !piece.zero_pages.is_empty() {
                                    punch_zero_pages(&path, piece.offset, &piece.zero_pages)?;
                                }
                                Ok(())
                            }) {
                                Ok(()) => progress.advance(n),
                                Err(e) => st.fail(e),
                            }
                        }
                    }
                    let _ = pool_tx.send(piece.logical);
                }
            });
        }
        drop(write_rx);
    });
    st.clock.log();
    if let Some(e) = st
        .first_error
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(e);
    }
    let mut bad = st.bad.into_inner().unwrap_or_else(|p| p.into_inner());
    bad.sort();
    bad.dedup();
    if target.is_some() && !bad.is_empty() {
        return Err(Error::Corrupt {
            label: m.header.label.clone(),
            files: bad,
        });
    }
    Ok(bad)
}

/// Checks and expands every piece of one object; when restoring, hands each checked piece to
/// the writers, else counts it as done. Returns the time spent waiting for buffers and for
/// room in the writers' queue.
#[allow(clippy::too_many_arguments)]
fn decode_object(
    st: &Stages,
    m: &BackupManifest,
    w: &ObjectWork,
    object: &[u8],
    writing: bool,
    pool_tx: &crossbeam_channel::Sender<AlignedBuf>,
    pool_rx: &crossbeam_channel::Receiver<AlignedBuf>,
    tx: &crossbeam_channel::Sender<CheckedPiece>,
    progress: &dyn Progress,
) -> std::time::Duration {
    let mut waited = std::time::Duration::ZERO;
    for &(fi, pi) in &w.pieces {
        if st.aborted() {
            break;
        }
        let p = &m.files[fi].pieces[pi];
        let Some(frame) = usize::try_from(p.offset)
            .ok()
            .zip(usize::try_from(p.offset.saturating_add(p.stored_size)).ok())
            .and_then(|(a, b)| object.get(a..b))
        else {
            st.mark(
                fi,
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
        if let Err(why) = decode_piece(m.header.compression.kind, frame, p, &mut logical) {
            st.mark(fi, &w.name, &why);
            let _ = pool_tx.send(logical);
            continue;
        }
        if writing {
            let piece = CheckedPiece {
                file: fi,
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

/// Allocates, in each target file, the ranges the backup's pieces will write: everything
/// but the zero pages, which stay holes ([`Writer::allocate`]). Run before the writers
/// start, so their direct writes overwrite allocated blocks and several run in one file at
/// once. Files at index `skip` are left out. Errors (ENOSPC first of all) name the file.
pub fn allocate_targets(m: &BackupManifest, target: &Path, skip: Option<usize>) -> Result<()> {
    for (fi, f) in m.files.iter().enumerate() {
        if Some(fi) == skip || f.pieces.is_empty() {
            continue;
        }
        // Non-zero ranges of the file, adjacent ones merged (across pieces too).
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for p in &f.pieces {
            let runs =
                crate::repo::manifest::nonzero_ranges(p.logical_size as usize, &p.zero_pages)
                    .unwrap_or_default();
            for (off, n) in runs {
                let (start, len) = (p.logical_offset + off as u64, n as u64);
                match ranges.last_mut() {
                    Some(r) if r.0 + r.1 == start => r.1 += len,
                    _ => ranges.push((start, len)),
                }
            }
        }
        // Small files are written through the page cache (write_runs): nothing to gain.
        let bytes: u64 = ranges.iter().map(|r| r.1).sum();
        if ranges.is_empty() || bytes < DIRECT_MIN_WRITE as u64 {
            continue;
        }
        let path = &target.join(&f.path);
        let w = Writer::open_buffered(path).map_err(|e| Error::io("open", path, e))?;
        for (start, len) in ranges {
            if !w
                .allocate(start, len)
                .map_err(|e| Error::io("allocate", path, e))?
            {
                return Ok(()); // the filesystem cannot: the writes fill holes instead
            }
        }
    }
    Ok(())
}

/// Reads one stored object whole and checks it has the size the manifest expects. One
/// request (an object store pays a round trip per request): a missing object shows as
/// not found.
fn load_object(
    store: &dyn Storage,
    m: &BackupManifest,
    w: &ObjectWork,
    mut buf: AlignedBuf,
) -> Result<Loaded> {
    let name = repo::object_name(&m.header.stanza, &m.header.label, &w.name);
    match store.get_aligned_into(&name, &mut buf) {
        Ok(()) if buf.len() as u64 == w.size => Ok(Loaded::Object(buf)),
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

/// Reads, checks and writes one file on its own (restore uses it for pg_control, last).
pub fn restore_one(
    store: &dyn Storage,
    m: &BackupManifest,
    file: usize,
    target: &PathBuf,
) -> Result<()> {
    let f = &m.files[file];
    let mut logical = aligned_buf(super::CHUNK_SIZE as usize);
    for p in &f.pieces {
        let frame = store.get_range(
            &repo::object_name(&m.header.stanza, &m.header.label, &p.object),
            p.offset,
            p.stored_size,
        )?;
        decode_piece(m.header.compression.kind, &frame, p, &mut logical).map_err(|why| {
            tracing::error!("{}: {why}", f.path);
            Error::Corrupt {
                label: m.header.label.clone(),
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
