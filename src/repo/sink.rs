//! The repository's sink of the read pipeline: each unit of a backup becomes one stored
//! object `data/<number>` of frames (compressed pieces, zero pages left out), and each piece
//! a manifest [`Piece`] naming its frame and its hashes.
use super::incremental::{self, Plan, Reference};
use super::{Backup, Piece};
use crate::codec::{CompressType, Compression, Compressor};
use crate::error::{Error, Result};
use crate::io::direct::{aligned_buf, AlignedBuf};
use crate::pg::checksum::BLCKSZ;
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
    /// For a differential or incremental backup: what the reference holds (ranges that did
    /// not change are stored as references to it, changed blocks alone).
    pub reference: Option<&'a Reference>,
    /// How the backup's resume journal starts ([`super::resume`]); None: no journal.
    pub journal: Option<super::resume::JournalStart>,
}

impl<'a> RepoSink<'a> {
    /// A sink writing objects of backup `label`.
    pub fn new(backup: &'a Backup<'a>, compression: Compression) -> Self {
        RepoSink {
            backup,
            compression,
            stored: AtomicU64::new(0),
            next_object: AtomicUsize::new(1),
            reference: None,
            journal: None,
        }
    }

    /// Starts the backup's manifest, with the header the copy's start completed, and its
    /// resume journal when one is asked for.
    ///
    /// Errors: the store's.
    pub fn begin_manifest(
        &self,
        header: super::ManifestHeader,
    ) -> Result<super::manifest_io::ManifestWriter> {
        let journal = match &self.journal {
            Some(start) => Some(super::resume::Journal::start(
                self.backup,
                &header,
                start.clone(),
            )?),
            None => None,
        };
        let w = self.backup.begin(header)?;
        Ok(match journal {
            Some(j) => w.with_journal(j),
            None => w,
        })
    }
}

/// Per-worker state of [`RepoSink`].
pub struct RepoState {
    compressor: Compressor,
    /// Scratch for a frame's non-zero pages.
    payload: Vec<u8>,
    /// Scratch for the changed blocks of a range (block-level backups).
    changed: Vec<u8>,
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

impl RepoSink<'_> {
    /// Stores `logical` (the bytes of a range, or its changed blocks back to back), all-zero
    /// pages `zero_pages` left out, compressed as one frame at the end of `object`: a
    /// whole-frame piece of `logical.len()` bytes at `offset` whose logical bytes hash to
    /// `hashes` (XXH3-128 hex, CRC32C).
    ///
    /// Errors: the compressor's.
    #[allow(clippy::too_many_arguments)]
    fn frame(
        &self,
        st: &mut RepoState,
        object: &mut AlignedBuf,
        id: &str,
        logical: &[u8],
        offset: u64,
        zero_pages: Vec<[u32; 2]>,
        hashes: (String, u32),
    ) -> Result<Piece> {
        let plain = zero_pages.is_empty();
        let mut payload = std::mem::take(&mut st.payload);
        if !plain {
            payload.clear();
            for (_, run) in nonzero_runs(logical, &zero_pages) {
                payload.extend_from_slice(run);
            }
        }
        let start = object.len();
        let compressed = st
            .compressor
            .compress(if plain { logical } else { &payload }, object);
        st.payload = payload;
        compressed.map_err(|e| {
            Error::Other(format!(
                "{} compression failed at offset {offset}: {e}",
                self.compression.kind
            ))
        })?;
        let frame = &object[start..];
        Ok(Piece {
            backup: None,
            object: id.to_string(),
            offset: start as u64,
            stored_size: frame.len() as u64,
            // Uncompressed and without holes, the frame is the logical bytes: hash once.
            stored_xxh3: if self.compression.kind == CompressType::None && plain {
                hashes.0.clone()
            } else {
                crate::codec::xxh3_hex(frame)
            },
            logical_offset: offset,
            logical_size: logical.len() as u64,
            zero_pages,
            xxh3: Some(hashes.0),
            crc32c: Some(hashes.1),
            frame: None,
        })
    }

    /// Stores one read range as a frame of `object` (or, against a reference, as what
    /// [`Reference::plan`] says): its pieces, in file order.
    fn store_range(
        &self,
        st: &mut RepoState,
        object: &mut AlignedBuf,
        id: &str,
        p: &ReadPiece,
    ) -> Result<Vec<Piece>> {
        let plan = match self.reference {
            Some(r) => r.plan(p.path, p.spec.offset, p.data, &p.zero_pages, &p.xxh3),
            None => Plan::Whole,
        };
        match plan {
            Plan::Same(pieces) => Ok(pieces),
            Plan::Whole => {
                let piece = self.frame(
                    st,
                    object,
                    id,
                    p.data,
                    p.spec.offset,
                    p.zero_pages.clone(),
                    (p.xxh3.clone(), p.crc32c),
                )?;
                Ok(vec![piece])
            }
            Plan::Blocks(changed) => {
                // The changed blocks back to back: the new frame's logical bytes.
                let mut logical = std::mem::take(&mut st.changed);
                logical.clear();
                for (i, block) in p.data.chunks(BLCKSZ).enumerate() {
                    if changed[i] {
                        logical.extend_from_slice(block);
                    }
                }
                let hashes = (
                    crate::codec::xxh3_hex(&logical),
                    crate::codec::crc32c(&logical),
                );
                let zero_pages = crate::transfer::zero_page_runs(&logical);
                let new = self.frame(st, object, id, &logical, p.spec.offset, zero_pages, hashes);
                st.changed = logical;
                let refs = self.reference.map_or(&[][..], |r| r.pieces(p.path));
                incremental::block_pieces(p.path, refs, p.spec.offset, p.data, &changed, &new?)
            }
        }
    }
}

impl UnitSink for RepoSink<'_> {
    type State = RepoState;
    type Piece = Vec<Piece>;

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
            changed: Vec::new(),
            object: Some(object_buf()),
        })
    }

    fn write_unit(
        &self,
        st: &mut RepoState,
        pieces: &[ReadPiece],
        release: &mut dyn FnMut(),
    ) -> Result<Vec<Vec<Piece>>> {
        let id = object_id(self.next_object.fetch_add(1, Ordering::Relaxed));
        // None when the last object went to a store that kept its buffer: a new one.
        let mut object = st.object.take().unwrap_or_else(object_buf);
        object.clear();
        let mut out = Vec::with_capacity(pieces.len());
        let mut own = false;
        for p in pieces {
            let stored = self.store_range(st, &mut object, &id, p)?;
            own |= stored.iter().any(|s| s.backup.is_none());
            out.push(stored);
        }
        let len = object.len() as u64;
        // The upload only waits: other threads may compress meanwhile. An object store
        // uploads the buffer itself and keeps it until done (no copy); posix gives it back.
        release();
        if !own {
            // Every range is in the reference: no object (its number stays unused).
            st.object = Some(object);
            return Ok(out);
        }
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
