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
}

/// The storer: stores each piece of work into every repository, in order, retrying a
/// failure (after 1 s, doubling up to [`MAX_STORE_BACKOFF`]) until it succeeds or the process is
/// cancelled; then moves the durable position on and wakes the receiver.
pub(super) fn store_loop(
    a: &Archiver,
    rx: Receiver<Work>,
    shared: &Shared,
    mut wake: UnixStream,
) -> Result<()> {
    let mut compressor = a.compressor()?;
    let chunk_compression = chunk_compression(a.compression());
    let mut chunk_compressor = crate::codec::Compressor::new(chunk_compression)
        .map_err(|e| crate::error::Error::Other("cannot create a compressor".into()).because(e))?;
    let mut out = Vec::new();
    // The failure since the last success, logged once rather than at every retry.
    let mut failing: Option<String> = None;
    for work in rx {
        let mut wait = Duration::from_secs(1);
        loop {
            let chunk = (chunk_compression, &mut chunk_compressor);
            match store_one(a, &work, &mut compressor, chunk, &mut out) {
                Ok(()) => break,
                Err(e) if crate::io::cancel::cancelled().is_some() => return Err(e),
                Err(e) => {
                    let text = e.to_string();
                    if failing.as_deref() != Some(&text) {
                        tracing::error!("cannot store the stream's WAL, retrying: {text}");
                        failing = Some(text);
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(MAX_STORE_BACKOFF);
                }
            }
        }
        if let Some(was) = failing.take() {
            tracing::info!("storing the stream's WAL works again (it failed with: {was})");
        }
        match &work {
            Work::Chunk { end, .. } | Work::Segment { end, .. } => {
                shared.durable.fetch_max(end.0, Ordering::AcqRel);
            }
            Work::History { .. } => {}
        }
        shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = wake.write(&[1]);
    }
    Ok(())
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
