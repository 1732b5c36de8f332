//! The engine's second entry: files that arrive once, in order, from a stream (the server's
//! `BASE_BACKUP` tar, decoded by `crate::remote::basebackup`), cut into the same units as
//! the first entry cuts a listing (chunks of [`CHUNK_SIZE`] for large files, bundles of small
//! ones) as their bytes come in, and stored by the same [`UnitSink`].
//!
//! The decoder's thread fills one unit at a time ([`StreamUnits`], a [`StreamSink`]); a full
//! unit goes through a bounded channel to `jobs` worker threads, which do what the first
//! entry's workers do after their read: find all-zero pages, check page checksums, hash the
//! logical bytes (XXH3-128, CRC32C) and hand the unit to the sink (compress and store). A
//! page whose checksum fails cannot be read again from a stream; the server has already
//! read it twice (basebackup.c retries a failing block once before it warns), so a failure
//! here is recorded at once. Each file goes to the [`StreamCollector`] once all its pieces
//! are stored, as [`super::FileAssembler`] does for a listing.
//!
//! Memory: the unit being filled, `2 * jobs` units queued and `jobs` in the workers, each at
//! most [`CHUNK_SIZE`] bytes, plus the sink's per-worker state and the files in progress.
use super::{scan_pages, PieceSpec, Progress, ReadOptions, ReadPiece, SourceFile, UnitSink};
use crate::error::{Error, Result};
use crate::io::parallel::Stop;
use crate::pg::exclude::{is_checksummed_file, relation_segment_number};
use crate::pg::lsn::Lsn;
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What a stream announces before its first archive.
#[derive(Debug, Clone, Default)]
pub struct StreamStart {
    /// The backup's start LSN and timeline.
    pub start_lsn: Lsn,
    pub timeline: u32,
    /// The size the server announced, bytes (the tablespaces' sizes summed).
    pub total_bytes: u64,
    /// (OID, location) of each tablespace; the main data directory is not in it.
    pub tablespaces: Vec<(u32, String)>,
}

/// Where a decoded stream's entries go, in the order the stream holds them. Paths are
/// relative to the archive's root (the data directory for the main archive, the
/// tablespace's directory for the others), `/`-separated, checked by the decoder to hold no
/// `..`, no leading `/` and no empty component.
pub trait StreamSink {
    /// An archive starts: `tablespace` is None for the main data directory, else its OID.
    fn begin_archive(&mut self, name: &str, tablespace: Option<u32>) -> Result<()>;
    /// A directory, with its permission bits.
    fn directory(&mut self, path: &str, mode: u32) -> Result<()>;
    /// A symbolic link (tablespace links are not sent when the stream carries a
    /// tablespace_map).
    fn symlink(&mut self, path: &str, target: &str) -> Result<()>;
    /// A regular file of `size` bytes starts; exactly `size` bytes follow in order through
    /// [`StreamSink::file_data`], then [`StreamSink::file_end`].
    fn file_begin(&mut self, path: &str, size: u64, mode: u32, mtime: i64) -> Result<()>;
    fn file_data(&mut self, data: &[u8]) -> Result<()>;
    fn file_end(&mut self) -> Result<()>;
    /// The stream starts (see [`StreamStart`]).
    fn started(&mut self, _start: &StreamStart) -> Result<()> {
        Ok(())
    }
    /// The server's progress report: bytes of the backup done (before compression).
    fn progress(&mut self, _done: u64) {}
}

/// Receives what [`stream_units`] stores; calls are serialized. An error stops the copy.
pub trait StreamCollector<P>: Send {
    /// The stream starts, before any directory or file.
    fn started(&mut self, start: &StreamStart) -> Result<()>;
    /// A directory (path relative to the data directory, permission bits).
    fn dir(&mut self, path: &str, mode: u32) -> Result<()>;
    /// A whole file, once every piece is stored: its pieces in logical order and the
    /// blocks whose page checksum failed, sorted.
    fn file(&mut self, f: &SourceFile, pieces: Vec<P>, page_errors: Vec<u32>) -> Result<()>;
}

/// What [`stream_units`] stored.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamCopied {
    pub files: usize,
    /// Logical bytes of the files.
    pub bytes: u64,
    /// Blocks with a failed page checksum, all files together.
    pub page_error_count: usize,
}

/// A unit being filled or stored: pieces, the file of each, and the bytes of all.
#[derive(Default)]
struct Job {
    specs: Vec<PieceSpec>,
    files: Vec<SourceFile>,
    buf: Vec<u8>,
    /// Bytes the pieces will hold once full (a chunk's buffer fills up to it).
    planned: u64,
}

/// A file whose pieces are not all stored yet.
struct Open<P> {
    file: SourceFile,
    remaining: u32,
    pieces: Vec<(u64, P)>,
    errors: Vec<u32>,
}

struct Tracker<'c, P> {
    collector: &'c mut dyn StreamCollector<P>,
    open: HashMap<usize, Open<P>>,
    copied: StreamCopied,
}

impl<P> Tracker<'_, P> {
    fn piece_done(&mut self, file: usize, offset: u64, piece: Option<P>) -> Result<()> {
        let o = self
            .open
            .get_mut(&file)
            .ok_or_else(|| Error::Other(format!("stream copy: file #{file} stored twice")))?;
        if let Some(p) = piece {
            o.pieces.push((offset, p));
        }
        o.remaining -= 1;
        if o.remaining == 0 {
            if let Some(mut o) = self.open.remove(&file) {
                o.pieces.sort_by_key(|(off, _)| *off);
                o.errors.sort_unstable();
                self.copied.files += 1;
                self.copied.bytes += o.file.size;
                let pieces = o.pieces.into_iter().map(|(_, p)| p).collect();
                self.collector.file(&o.file, pieces, o.errors)?;
            }
        }
        Ok(())
    }
}

/// The decoder's side of [`stream_units`]: a [`StreamSink`] that cuts the stream into units.
pub struct StreamUnits<'s, 'c, P> {
    tx: Option<Sender<Job>>,
    tracker: &'s Mutex<Tracker<'c, P>>,
    stop: &'s Stop,
    /// The backup's start LSN once the stream announced it: pages newer than it are not
    /// checked (`opts.backup_start_lsn` is ignored).
    start_lsn: &'s AtomicU64,
    progress: &'s dyn Progress,
    phase: &'s str,
    opts: ReadOptions,
    chunk: u64,
    bundle_bytes: u64,
    bundle_files: usize,
    /// `pg_tblspc/<oid>/` in a tablespace's archive, else empty.
    prefix: String,
    /// The tablespace directory's own line, written with the mode of its archive's first
    /// directory.
    pending_tablespace_dir: Option<String>,
    next_index: usize,
    bundle: Job,
    chunk_job: Job,
    /// The file being received: index, size, bytes so far, whether it is chunked.
    cur: Option<(usize, u64, u64, bool)>,
}

/// Runs `body` with a [`StreamSink`] that stores every file it is given into `sink` with
/// `opts.jobs` worker threads, handing each stored file to `collector`; `progress` gets the
/// phase `phase` (begun with the stream's announced size) and the bytes of each stored unit.
/// `bundle`: (logical bytes, files) at most per bundle (see [`super::bundle_limits`]). Page
/// checks take the start LSN from the stream's [`StreamStart`], not from `opts`.
///
/// Errors: `body`'s (the workers stop and the sink is aborted), the first worker's or
/// collector's error, a file whose bytes did not all arrive.
pub fn stream_units<S: UnitSink, R>(
    sink: &S,
    opts: &ReadOptions,
    bundle: (u64, usize),
    collector: &mut dyn StreamCollector<S::Piece>,
    progress: &dyn Progress,
    phase: &str,
    body: impl FnOnce(&mut dyn StreamSink) -> Result<R>,
) -> Result<(R, StreamCopied)> {
    let jobs = opts.jobs.max(1);
    let stop = Stop::default();
    let tracker = Mutex::new(Tracker {
        collector,
        open: HashMap::new(),
        copied: StreamCopied::default(),
    });
    let (tx, rx) = bounded::<Job>(2 * jobs);
    let start_lsn = AtomicU64::new(u64::MAX);
    let chunk = super::CHUNK_SIZE;
    let r = std::thread::scope(|s| {
        for _ in 0..jobs {
            let rx = rx.clone();
            let (stop, tracker, start_lsn) = (&stop, &tracker, &start_lsn);
            s.spawn(move || {
                let w = stream_worker(sink, opts, start_lsn, rx, tracker, stop, progress);
                if let Err(e) = w {
                    stop.fail(e);
                    sink.abort();
                }
            });
        }
        drop(rx);
        let mut units = StreamUnits {
            tx: Some(tx),
            tracker: &tracker,
            stop: &stop,
            start_lsn: &start_lsn,
            progress,
            phase,
            opts: *opts,
            chunk,
            bundle_bytes: bundle.0.clamp(1, chunk),
            bundle_files: bundle.1.max(1),
            prefix: String::new(),
            pending_tablespace_dir: None,
            next_index: 0,
            bundle: Job::default(),
            chunk_job: Job::default(),
            cur: None,
        };
        let r = body(&mut units).and_then(|r| units.flush().map(|()| r));
        // Closing the channel ends the workers once the queue is drained.
        drop(units.tx.take());
        if r.is_err() {
            stop.halt();
            sink.abort();
        }
        r
    });
    // A worker's error first: the stream's is then only its consequence.
    stop.into_result()?;
    let r = r?;
    let t = tracker.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(o) = t.open.values().next() {
        return Err(Error::Other(format!(
            "stream copy: {} ({} of them) not stored whole",
            o.file.path,
            t.open.len()
        )));
    }
    Ok((r, t.copied))
}

fn stream_worker<S: UnitSink>(
    sink: &S,
    opts: &ReadOptions,
    start_lsn: &AtomicU64,
    rx: Receiver<Job>,
    tracker: &Mutex<Tracker<'_, S::Piece>>,
    stop: &Stop,
    progress: &dyn Progress,
) -> Result<()> {
    let mut state = sink.new_state()?;
    for mut job in rx {
        if stop.stopped() {
            continue; // drain, so the decoder never blocks on a full queue
        }
        let opts = ReadOptions {
            backup_start_lsn: start_lsn.load(Ordering::SeqCst),
            ..*opts
        };
        let mut errors = Vec::new();
        let mut ranges = Vec::with_capacity(job.specs.len());
        let mut pos = 0usize;
        for (spec, f) in job.specs.iter().zip(&job.files) {
            let range = pos..pos + spec.len as usize;
            pos = range.end;
            // A stream cannot be read again: a failing page is recorded at once.
            let zero_pages = scan_pages(
                f,
                spec,
                &mut job.buf[range.clone()],
                &opts,
                &mut |_, _| Ok(false),
                &mut errors,
            )?;
            ranges.push((range, zero_pages));
        }
        let pieces: Vec<ReadPiece> = job
            .specs
            .iter()
            .zip(&job.files)
            .zip(ranges)
            .map(|((spec, f), (range, zero_pages))| {
                let data = &job.buf[range];
                ReadPiece {
                    spec: *spec,
                    path: &f.path,
                    data,
                    zero_pages,
                    xxh3: crate::codec::xxh3_hex(data),
                    crc32c: crate::codec::crc32c(data),
                }
            })
            .collect();
        let stored = sink.write_unit(&mut state, &pieces, &mut || {})?;
        if stored.len() != pieces.len() {
            return Err(Error::Other(format!(
                "stream copy: the sink stored {} of {} pieces",
                stored.len(),
                pieces.len()
            )));
        }
        let mut t = tracker.lock().unwrap_or_else(|e| e.into_inner());
        t.copied.page_error_count += errors.len();
        for (file, blk) in errors {
            if let Some(o) = t.open.get_mut(&file) {
                o.errors.push(blk);
            }
        }
        for (spec, piece) in job.specs.iter().zip(stored) {
            t.piece_done(spec.index(), spec.offset, Some(piece))?;
        }
        drop(t);
        progress.advance(pos as u64);
    }
    Ok(())
}

impl<'s, 'c, P> StreamUnits<'s, 'c, P> {
    fn tracker(&self) -> std::sync::MutexGuard<'s, Tracker<'c, P>> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&mut self, job: Job) -> Result<()> {
        if job.specs.is_empty() {
            return Ok(());
        }
        // A worker's error is the one reported (see stream_units); this only stops the stream.
        let stopped = || Error::Other("stream copy: a worker failed".into());
        if self.stop.stopped() {
            return Err(stopped());
        }
        self.tx
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())
    }

    /// Sends the bundle being filled, if any.
    fn send_bundle(&mut self) -> Result<()> {
        let b = std::mem::take(&mut self.bundle);
        self.send(b)
    }

    fn flush(&mut self) -> Result<()> {
        if self.cur.is_some() {
            return Err(Error::Other(
                "stream copy: the stream ended inside a file".into(),
            ));
        }
        self.write_pending_tablespace_dir(0o700)?;
        self.send_bundle()
    }

    fn write_pending_tablespace_dir(&mut self, mode: u32) -> Result<()> {
        if let Some(d) = self.pending_tablespace_dir.take() {
            self.tracker().collector.dir(&d, mode)?;
        }
        Ok(())
    }

    /// Starts the chunk of the current (large) file at `offset`.
    fn start_chunk(&mut self, index: usize, file: &SourceFile, offset: u64) -> Result<()> {
        let len = self.chunk.min(file.size - offset);
        self.chunk_job = Job {
            specs: vec![PieceSpec::new(index, offset, len)?],
            files: vec![file.clone()],
            buf: Vec::with_capacity(len as usize),
            planned: len,
        };
        Ok(())
    }
}

impl<P> StreamSink for StreamUnits<'_, '_, P> {
    fn begin_archive(&mut self, _name: &str, tablespace: Option<u32>) -> Result<()> {
        self.write_pending_tablespace_dir(0o700)?;
        match tablespace {
            None => self.prefix.clear(),
            Some(oid) => {
                self.prefix = format!("pg_tblspc/{oid}/");
                self.pending_tablespace_dir = Some(format!("pg_tblspc/{oid}"));
            }
        }
        Ok(())
    }

    fn directory(&mut self, path: &str, mode: u32) -> Result<()> {
        self.write_pending_tablespace_dir(mode)?;
        let p = format!("{}{path}", self.prefix);
        self.tracker().collector.dir(&p, mode)
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        tracing::warn!("skipping symbolic link {}{path} -> {target}", self.prefix);
        Ok(())
    }

    fn file_begin(&mut self, path: &str, size: u64, mode: u32, mtime: i64) -> Result<()> {
        if self.cur.is_some() {
            return Err(Error::Other(
                "stream copy: a file began inside another".into(),
            ));
        }
        self.write_pending_tablespace_dir(0o700)?;
        let path = format!("{}{path}", self.prefix);
        let checksum_segno = if self.opts.verify_checksums && is_checksummed_file(&path) {
            relation_segment_number(path.rsplit('/').next().unwrap_or_default())
        } else {
            None
        };
        let file = SourceFile {
            path: path.into_boxed_str(),
            size,
            mtime,
            mode,
            checksum_segno,
        };
        let index = self.next_index;
        self.next_index += 1;
        let chunked = size >= self.chunk;
        let pieces = match size {
            0 => 0,
            _ if chunked => size.div_ceil(self.chunk) as u32,
            _ => 1,
        };
        {
            let mut t = self.tracker();
            if pieces == 0 {
                t.copied.files += 1;
                t.collector.file(&file, Vec::new(), Vec::new())?;
            } else {
                t.open.insert(
                    index,
                    Open {
                        file: file.clone(),
                        remaining: pieces,
                        pieces: Vec::new(),
                        errors: Vec::new(),
                    },
                );
            }
        }
        if chunked {
            self.start_chunk(index, &file, 0)?;
        } else if size > 0 {
            let full = self.bundle.planned + size > self.bundle_bytes
                || self.bundle.specs.len() >= self.bundle_files;
            if full {
                self.send_bundle()?;
            }
            self.bundle.specs.push(PieceSpec::new(index, 0, size)?);
            self.bundle.files.push(file);
            self.bundle.planned += size;
        }
        self.cur = Some((index, size, 0, chunked));
        Ok(())
    }

    fn file_data(&mut self, mut data: &[u8]) -> Result<()> {
        let (index, size, got, chunked) = self
            .cur
            .ok_or_else(|| Error::Other("stream copy: data outside a file".into()))?;
        if got + data.len() as u64 > size {
            return Err(Error::Other(format!(
                "stream copy: more than the {size} bytes announced for a file"
            )));
        }
        self.cur = Some((index, size, got + data.len() as u64, chunked));
        if !chunked {
            self.bundle.buf.extend_from_slice(data);
            return Ok(());
        }
        while !data.is_empty() {
            let room = (self.chunk_job.planned as usize).saturating_sub(self.chunk_job.buf.len());
            let n = room.min(data.len());
            self.chunk_job.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.chunk_job.buf.len() as u64 == self.chunk_job.planned {
                let job = std::mem::take(&mut self.chunk_job);
                let next = job.specs[0].offset + job.planned;
                let file = job.files[0].clone();
                self.send(job)?;
                if next < size {
                    self.start_chunk(index, &file, next)?;
                }
            }
        }
        Ok(())
    }

    fn file_end(&mut self) -> Result<()> {
        let (_, size, got, _) = self
            .cur
            .take()
            .ok_or_else(|| Error::Other("stream copy: a file ended that did not begin".into()))?;
        if got != size {
            return Err(Error::Other(format!(
                "stream copy: a file of {size} bytes ended after {got}"
            )));
        }
        Ok(())
    }

    fn started(&mut self, start: &StreamStart) -> Result<()> {
        self.start_lsn.store(start.start_lsn.0, Ordering::SeqCst);
        self.progress.begin(self.phase, start.total_bytes);
        self.tracker().collector.started(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::NoProgress;

    /// Stores nothing: each piece reports (file, offset, len, crc32c, zero-page runs).
    struct Recording;
    type Rec = (usize, u64, u32, u32, Vec<[u32; 2]>);
    impl UnitSink for Recording {
        type State = ();
        type Piece = Rec;
        fn new_state(&self) -> Result<()> {
            Ok(())
        }
        fn write_unit(
            &self,
            _: &mut (),
            pieces: &[ReadPiece],
            _: &mut dyn FnMut(),
        ) -> Result<Vec<Rec>> {
            Ok(pieces
                .iter()
                .map(|p| {
                    (
                        p.spec.index(),
                        p.spec.offset,
                        p.spec.len,
                        p.crc32c,
                        p.zero_pages.clone(),
                    )
                })
                .collect())
        }
    }

    #[derive(Default)]
    struct Got {
        dirs: Vec<(String, u32)>,
        files: Vec<(String, u64, Vec<Rec>)>,
        started: bool,
    }
    impl StreamCollector<Rec> for Got {
        fn started(&mut self, _: &StreamStart) -> Result<()> {
            self.started = true;
            Ok(())
        }
        fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
            self.dirs.push((path.into(), mode));
            Ok(())
        }
        fn file(&mut self, f: &SourceFile, pieces: Vec<Rec>, _: Vec<u32>) -> Result<()> {
            self.files.push((f.path.to_string(), f.size, pieces));
            Ok(())
        }
    }

    fn opts(jobs: usize) -> ReadOptions {
        ReadOptions {
            jobs,
            verify_checksums: false,
            backup_start_lsn: 0,
        }
    }

    #[test]
    fn chunks_bundles_and_tablespaces() {
        let chunk = crate::transfer::CHUNK_SIZE as usize;
        let mut big = vec![0u8; 2 * chunk + 8192 * 3];
        big[2 * chunk + 8192] = 7;
        let mut got = Got::default();
        let ((), copied) = stream_units(
            &Recording,
            &opts(3),
            (20_000, 2),
            &mut got,
            &NoProgress,
            "backup",
            |s| {
                s.started(&StreamStart::default())?;
                s.begin_archive("16400.tar", Some(16400))?;
                s.directory("PG_15_1", 0o750)?;
                s.file_begin("PG_15_1/a", 5, 0o600, 1)?;
                s.file_data(b"hello")?;
                s.file_end()?;
                s.begin_archive("base.tar", None)?;
                s.directory("base", 0o700)?;
                for (i, n) in [12_000usize, 9_000, 1, 0, 3].iter().enumerate() {
                    s.file_begin(&format!("base/f{i}"), *n as u64, 0o600, 0)?;
                    for c in vec![i as u8 + 1; *n].chunks(1000) {
                        s.file_data(c)?;
                    }
                    s.file_end()?;
                }
                s.file_begin("base/big", big.len() as u64, 0o600, 0)?;
                for c in big.chunks(777_777) {
                    s.file_data(c)?;
                }
                s.file_end()
            },
        )
        .unwrap();
        assert!(got.started);
        assert_eq!(
            got.dirs,
            vec![
                ("pg_tblspc/16400".to_string(), 0o750),
                ("pg_tblspc/16400/PG_15_1".to_string(), 0o750),
                ("base".to_string(), 0o700)
            ]
        );
        assert_eq!(copied.files, 7);
        assert_eq!(copied.bytes, 5 + 12_000 + 9_000 + 1 + 3 + big.len() as u64);
        let by: HashMap<&str, &(String, u64, Vec<Rec>)> =
            got.files.iter().map(|f| (f.0.as_str(), f)).collect();
        assert_eq!(
            by["pg_tblspc/16400/PG_15_1/a"].2[0].3,
            crate::codec::crc32c(b"hello")
        );
        assert!(by["base/f3"].2.is_empty());
        let big_pieces = &by["base/big"].2;
        assert_eq!(big_pieces.len(), 3);
        assert_eq!(
            big_pieces.iter().map(|p| p.1).collect::<Vec<_>>(),
            vec![0, chunk as u64, 2 * chunk as u64]
        );
        // The first chunk is all zeros; the last has its second page set.
        assert_eq!(big_pieces[0].4, vec![[0, (chunk / 8192) as u32]]);
        assert_eq!(big_pieces[2].4, vec![[0, 1], [2, 1]]);
        for (f, _, pieces) in &got.files {
            for p in pieces {
                assert!(p.2 > 0, "{f}");
            }
        }
    }

    #[test]
    fn a_stream_that_stops_inside_a_file_is_an_error() {
        let mut got = Got::default();
        let r = stream_units(
            &Recording,
            &opts(2),
            (1 << 20, 100),
            &mut got,
            &NoProgress,
            "backup",
            |s| {
                s.begin_archive("base.tar", None)?;
                s.file_begin("base/x", 10, 0o600, 0)?;
                s.file_data(b"12345")
            },
        );
        assert!(r.is_err());
        let r = stream_units(
            &Recording,
            &opts(2),
            (1 << 20, 100),
            &mut Got::default(),
            &NoProgress,
            "backup",
            |s| {
                s.begin_archive("base.tar", None)?;
                s.file_begin("base/x", 2, 0o600, 0)?;
                s.file_data(b"123")
            },
        );
        assert!(r.is_err());
    }
}
