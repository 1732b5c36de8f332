//! The storer of `archive-stream` ([`super`]): the work the receiver hands over, stored into
//! every repository in stream order, and the durable position it moves on.
use super::super::push::Archiver;
use crate::codec::{CompressType, Compression};
use crate::error::Result;
use crate::pg::lsn::Lsn;
use crate::repo::wal::WalFile;
use crate::repo::wal_tail;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Complete segments and chunks the receiver may hold for the storer beyond the one being
/// stored (each up to a segment, 16 MiB by default): past that it stops reading the socket
/// (the server waits) but keeps answering.
pub(super) const QUEUE: usize = 4;

/// Longest wait between two attempts to connect.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Longest wait between two attempts to store after a failure: a repository that comes
/// back is written to within this much (a failed attempt costs one request).
const MAX_STORE_BACKOFF: Duration = Duration::from_secs(5);

/// Work for the storer, in stream order.
pub(super) enum Work {
    /// Bytes [`start`, start + bytes.len()) of a segment's tail.
    Chunk {
        segment: String,
        start: u64,
        bytes: Vec<u8>,
        end: Lsn,
    },
    /// A complete segment.
    Segment {
        segment: String,
        bytes: Vec<u8>,
        end: Lsn,
        /// Part of it was stored as a tail before (its chunks are removed once it is).
        had_tail: bool,
    },
    /// A timeline history file (its name and text).
    History { name: String, text: Vec<u8> },
}

/// What the receiver and the storer share.
pub(super) struct Shared {
    /// The position up to which WAL is durable in every repository.
    pub(super) durable: AtomicU64,
    /// Work handed over and not yet stored.
    pub(super) in_flight: AtomicUsize,
    /// Buffers of stored segments, for the next ones (at most [`QUEUE`]): the stream is read
    /// into memory already mapped, not into fresh pages each segment.
    pub(super) buffers: Mutex<Vec<Vec<u8>>>,
    /// Tail chunks written into every repository, and the time their writes took in
    /// microseconds (the successful attempt of each; [`super::status::StreamStatus`]).
    pub(super) tail_writes: AtomicU64,
    pub(super) tail_write_micros: AtomicU64,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            durable: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            buffers: Mutex::new(Vec::new()),
            tail_writes: AtomicU64::new(0),
            tail_write_micros: AtomicU64::new(0),
        }
    }

    /// A buffer of `len` bytes for the next segment: a stored segment's, else a new one.
    /// Its bytes are whatever they were (each is received before it is read).
    pub(super) fn buffer(&self, len: usize) -> Vec<u8> {
        let reused = self.buffers.lock().ok().and_then(|mut b| b.pop());
        match reused {
            Some(b) if b.len() == len => b,
            _ => vec![0u8; len],
        }
    }

    /// Gives the buffer of a stored segment back for [`Self::buffer`].
    fn recycle(&self, work: Work) {
        if let Work::Segment { bytes, .. } = work {
            if let Ok(mut b) = self.buffers.lock() {
                if b.len() < QUEUE {
                    b.push(bytes);
                }
            }
        }
    }
}

/// One storing thread's codecs and buffer, and the failure it last logged (once, not at
/// every retry).
struct Storing<'a> {
    a: &'a Archiver,
    shared: &'a Shared,
    compressor: crate::codec::Compressor,
    chunk_compression: Compression,
    chunk_compressor: crate::codec::Compressor,
    out: Vec<u8>,
    failing: Option<String>,
}

impl<'a> Storing<'a> {
    fn new(a: &'a Archiver, shared: &'a Shared) -> Result<Storing<'a>> {
        let chunk_compression = chunk_compression(a.compression());
        Ok(Storing {
            a,
            shared,
            compressor: a.compressor()?,
            chunk_compression,
            chunk_compressor: crate::codec::Compressor::new(chunk_compression).map_err(|e| {
                crate::error::Error::Other("cannot create a compressor".into()).because(e)
            })?,
            out: Vec::new(),
            failing: None,
        })
    }

    /// Stores `work` into every repository, retrying a failure (after 1 s, doubling up to
    /// [`MAX_STORE_BACKOFF`]) until it succeeds. Returns the position it makes durable.
    ///
    /// Errors: the last failure, once the process is cancelled.
    fn store(&mut self, work: &Work) -> Result<Option<Lsn>> {
        let mut wait = Duration::from_secs(1);
        loop {
            let chunk = (self.chunk_compression, &mut self.chunk_compressor);
            let attempt = std::time::Instant::now();
            match store_one(self.a, work, &mut self.compressor, chunk, &mut self.out) {
                Ok(()) => {
                    if let Work::Chunk { bytes, .. } = work {
                        let micros = attempt.elapsed().as_micros() as u64;
                        tracing::debug!(
                            "stored a tail chunk of {} bytes in {:.3} ms",
                            bytes.len(),
                            micros as f64 / 1000.0
                        );
                        self.shared.tail_writes.fetch_add(1, Ordering::Relaxed);
                        self.shared
                            .tail_write_micros
                            .fetch_add(micros, Ordering::Relaxed);
                    }
                    break;
                }
                Err(e) if crate::io::cancel::cancelled().is_some() => return Err(e),
                Err(e) => {
                    let text = e.to_string();
                    if self.failing.as_deref() != Some(&text) {
                        tracing::error!("cannot store the stream's WAL, retrying: {text}");
                        self.failing = Some(text);
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(MAX_STORE_BACKOFF);
                }
            }
        }
        if let Some(was) = self.failing.take() {
            tracing::info!("storing the stream's WAL works again (it failed with: {was})");
        }
        Ok(match work {
            Work::Chunk { end, .. } | Work::Segment { end, .. } => Some(*end),
            Work::History { .. } => None,
        })
    }
}

/// The durable position moved on in stream order: work finishes out of order when segments
/// are stored side by side, and a position counts only once everything before it is stored.
struct InOrder<'a> {
    shared: &'a Shared,
    wake: UnixStream,
    next: u64,
    done: std::collections::BTreeMap<u64, Option<Lsn>>,
}

impl InOrder<'_> {
    /// Work number `seq` is stored (making `end` durable): the durable position moves over
    /// every piece stored without a gap before it, and the receiver is woken.
    fn finished(&mut self, seq: u64, end: Option<Lsn>) {
        self.done.insert(seq, end);
        while let Some(end) = self.done.remove(&self.next) {
            if let Some(end) = end {
                self.shared.durable.fetch_max(end.0, Ordering::AcqRel);
            }
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.next += 1;
            let _ = self.wake.write(&[1]);
        }
    }
}

/// The storer: stores each piece of work into every repository ([`Storing::store`]); moves
/// the durable position on in stream order and wakes the receiver. Complete segments are
/// stored by `jobs` threads at once (a flood compresses and writes several side by side),
/// handed out by this one; a tail chunk or a history file waits until everything before it
/// is stored, then this thread stores it (a
/// segment's tail is removed once the segment is stored, so its chunks must be there first).
///
/// Errors: a failure once the process is cancelled; a codec that cannot be made.
pub(super) fn store_loop(
    a: &Archiver,
    rx: Receiver<Work>,
    shared: &Shared,
    wake: UnixStream,
    jobs: usize,
) -> Result<()> {
    let mut mine = Storing::new(a, shared)?;
    let mut order = InOrder {
        shared,
        wake,
        next: 0,
        done: Default::default(),
    };
    // With jobs > 1, `jobs` threads store the segments and this one hands them out (it
    // stores only chunks and history files, after everything before them).
    let helpers = if jobs > 1 { jobs } else { 0 };
    std::thread::scope(|scope| {
        // No capacity: a segment is handed over only to a thread that waits for work.
        let (seg_tx, seg_rx) = crossbeam_channel::bounded::<(u64, Work)>(0);
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<(u64, Result<Option<Lsn>>)>();
        for _ in 0..helpers {
            let (seg_rx, done_tx) = (seg_rx.clone(), done_tx.clone());
            scope.spawn(move || {
                let mut helper = match Storing::new(a, shared) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::warn!("a storing thread could not start: {e}");
                        return;
                    }
                };
                for (seq, work) in seg_rx {
                    let r = helper.store(&work);
                    shared.recycle(work);
                    if done_tx.send((seq, r)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(seg_rx);
        drop(done_tx);
        let mut seq = 0u64;
        let mut with_helpers = 0usize;
        let mut result = Ok(());
        let mut finished = |r: (u64, Result<Option<Lsn>>), result: &mut Result<()>| match r.1 {
            Ok(end) => order.finished(r.0, end),
            Err(e) => *result = Err(e),
        };
        loop {
            crossbeam_channel::select! {
                recv(rx) -> work => {
                    let Ok(work) = work else { break };
                    match work {
                        // To the next free storing thread (waiting for one to finish when
                        // all are busy).
                        Work::Segment { .. } if helpers > 0 => {
                            if with_helpers == helpers {
                                if let Ok(r) = done_rx.recv() {
                                    with_helpers -= 1;
                                    finished(r, &mut result);
                                }
                            }
                            match seg_tx.send((seq, work)) {
                                Ok(()) => with_helpers += 1,
                                Err(_) => {
                                    result = Err(crate::error::Error::Other(
                                        "the threads storing the stream's segments stopped".into(),
                                    ))
                                }
                            }
                        }
                        work => {
                            while with_helpers > 0 {
                                let Ok(r) = done_rx.recv() else { break };
                                with_helpers -= 1;
                                finished(r, &mut result);
                            }
                            let end = mine.store(&work);
                            shared.recycle(work);
                            finished((seq, end), &mut result);
                        }
                    }
                    seq += 1;
                }
                recv(done_rx) -> r => {
                    if let Ok(r) = r {
                        with_helpers -= 1;
                        finished(r, &mut result);
                    }
                }
            }
            if result.is_err() {
                break;
            }
        }
        drop(seg_tx);
        for r in done_rx.iter().take(with_helpers) {
            finished(r, &mut result);
        }
        result
    })
}

/// How tail chunks are compressed: LZ4 when the archive is compressed at all, else not.
/// A chunk lives only until its segment is stored, and the merged levels
/// ([`wal_tail::merged_start`]) write each byte several times: a fast codec keeps that cheap
/// (the segment itself is stored with the archive's own compression).
fn chunk_compression(archive: Compression) -> Compression {
    if archive.kind == CompressType::None {
        archive
    } else {
        Compression::new(CompressType::Lz4, None).unwrap_or(archive)
    }
}

/// Stores one piece of work into every repository (`chunk`: the compression of tail chunks
/// and its compressor).
fn store_one(
    a: &Archiver,
    work: &Work,
    compressor: &mut crate::codec::Compressor,
    chunk: (Compression, &mut crate::codec::Compressor),
    out: &mut Vec<u8>,
) -> Result<()> {
    match work {
        Work::Segment {
            segment,
            bytes,
            had_tail,
            ..
        } => {
            let file = WalFile::parse(segment)?;
            a.push_bytes(&file, bytes, compressor, out, &|| Ok(()))?;
            // A segment that never had a tail costs no request here.
            for st in a.repos().filter(|_| *had_tail) {
                if let Err(e) = wal_tail::remove_tail(st, segment) {
                    tracing::warn!(
                        "repo{}: the tail of {segment} stays (its segment is archived): {e}",
                        st.repo()
                    );
                }
            }
            tracing::debug!("stored segment {segment}");
            Ok(())
        }
        Work::Chunk {
            segment,
            start,
            bytes,
            ..
        } => {
            for st in a.repos() {
                wal_tail::store_chunk(
                    st,
                    segment,
                    *start,
                    bytes,
                    chunk.0,
                    chunk.1,
                    a.system_identifier(),
                )?;
            }
            Ok(())
        }
        Work::History { name, text } => {
            let file = WalFile::parse(name)?;
            a.push_bytes(&file, text, compressor, out, &|| Ok(()))
                .map(|_| ())
        }
    }
}

/// Hands `work` to the storer; false when the queue is full (the caller keeps it).
pub(super) fn hand_over(
    tx: &Sender<Work>,
    shared: &Shared,
    work: Work,
) -> std::result::Result<(), Work> {
    shared.in_flight.fetch_add(1, Ordering::AcqRel);
    match tx.try_send(work) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(w)) | Err(TrySendError::Disconnected(w)) => {
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            Err(w)
        }
    }
}
