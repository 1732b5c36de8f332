//! The repository's sink of the read pipeline: each unit of a backup becomes one stored
//! object `data/<number>` of frames (compressed pieces, zero pages left out), and each piece
//! a manifest [`Piece`] naming its frame and its hashes.
use super::{Backup, Piece};
use crate::codec::{CompressType, Compression, Compressor};
use crate::error::{Error, Result};
use crate::io::direct::{aligned_buf, AlignedBuf};
use crate::transfer::{nonzero_runs, ReadPiece, UnitSink, CHUNK_SIZE};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stores each unit as one object `data/<unit number>` of a backup.
pub struct RepoSink<'a> {
    /// The backup being written.
    pub backup: &'a Backup<'a>,
    pub compression: Compression,
    /// Total stored bytes so far.
    pub stored: AtomicU64,
    /// Number of the next object (objects are numbered across all phases of a backup).
    pub next_object: AtomicUsize,
}

impl<'a> RepoSink<'a> {
    /// A sink writing objects of backup `label`.
    pub fn new(backup: &'a Backup<'a>, compression: Compression) -> Self {
        RepoSink {
            backup,
            compression,
            stored: AtomicU64::new(0),
            next_object: AtomicUsize::new(1),
        }
    }
}

/// Per-worker state of [`RepoSink`].
pub struct RepoState {
    compressor: Compressor,
    payload: Vec<u8>,
    /// The object being built; None after a store kept it ([`crate::storage::Storage::put_owned`]).
    object: Option<AlignedBuf>,
}

/// A buffer for one stored object: a unit's bytes compressed, with room for a frame that
/// does not shrink.
fn object_buf() -> AlignedBuf {
    aligned_buf(CHUNK_SIZE as usize + CHUNK_SIZE as usize / 64)
}

/// Object name of the `n`th object of a backup.
pub fn object_id(n: usize) -> String {
    format!("{n:06}")
}

impl UnitSink for RepoSink<'_> {
    type State = RepoState;
    type Piece = Piece;

    fn new_state(&self) -> Result<RepoState> {
        let compressor = Compressor::new(self.compression).map_err(|e| {
            Error::Other(format!(
                "cannot set up {} compression: {e}",
                self.compression.kind
            ))
        })?;
        Ok(RepoState {
            compressor,
            payload: Vec::new(),
            object: Some(object_buf()),
        })
    }

    fn write_unit(
        &self,
        st: &mut RepoState,
        pieces: &[ReadPiece],
        release: &mut dyn FnMut(),
    ) -> Result<Vec<Piece>> {
        let id = object_id(self.next_object.fetch_add(1, Ordering::Relaxed));
        // None when the last object went to a store that kept its buffer: a new one.
        let mut object = st.object.take().unwrap_or_else(object_buf);
        object.clear();
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            let payload: &[u8] = if p.zero_pages.is_empty() {
                p.data
            } else {
                st.payload.clear();
                for (_, run) in nonzero_runs(p.data, &p.zero_pages) {
                    st.payload.extend_from_slice(run);
                }
                &st.payload
            };
            let start = object.len();
            st.compressor.compress(payload, &mut object).map_err(|e| {
                Error::Other(format!(
                    "{} compression failed at offset {}: {e}",
                    self.compression.kind, p.spec.offset
                ))
            })?;
            let frame = &object[start..];
            out.push(Piece {
                object: id.clone(),
                offset: start as u64,
                stored_size: frame.len() as u64,
                // Uncompressed and without holes, the frame is the logical bytes: hash once.
                stored_xxh3: if self.compression.kind == CompressType::None
                    && p.zero_pages.is_empty()
                {
                    p.xxh3.clone()
                } else {
                    crate::codec::xxh3_hex(frame)
                },
                logical_offset: p.spec.offset,
                logical_size: p.spec.bytes(),
                zero_pages: p.zero_pages.clone(),
                xxh3: p.xxh3.clone(),
                crc32c: p.crc32c,
            });
        }
        let len = object.len() as u64;
        // The upload only waits: other threads may compress meanwhile. An object store
        // uploads the buffer itself and keeps it until done (no copy); posix gives it back.
        release();
        st.object = self
            .backup
            .store()
            .put_owned(&self.backup.object_name(&id), object)?;
        self.stored.fetch_add(len, Ordering::Relaxed);
        Ok(out)
    }

    fn abort(&self) {
        self.backup.store().cancel();
    }
}
