//! The two sinks of the read pipeline: a repository (compress, hash, store one object per
//! unit) and a data directory (write each piece in place, zero pages left as holes).
use super::{nonzero_runs, ReadPiece, UnitSink};
use crate::codec::{CompressType, Compression, Compressor};
use crate::error::{Error, Result};
use crate::repo::{self, Piece};
use crate::storage::direct::{aligned_buf, AlignedBuf, Writer, DIRECT_MIN_WRITE};
use crate::storage::Storage;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stores each unit as one object `data/<unit number>` of a backup.
pub struct RepoSink<'a> {
    pub store: &'a dyn Storage,
    pub stanza: &'a str,
    pub label: &'a str,
    pub compression: Compression,
    /// Total stored bytes so far.
    pub stored: AtomicU64,
    /// Number of the next object (objects are numbered across all phases of a backup).
    pub next_object: AtomicUsize,
}

impl<'a> RepoSink<'a> {
    /// A sink writing objects of backup `label`.
    pub fn new(
        store: &'a dyn Storage,
        stanza: &'a str,
        label: &'a str,
        compression: Compression,
    ) -> Self {
        RepoSink {
            store,
            stanza,
            label,
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
    /// The object being built; None after a store kept it ([`Storage::put_owned`]).
    object: Option<AlignedBuf>,
}

/// A buffer for one stored object: a unit's bytes compressed, with room for a frame that
/// does not shrink.
fn object_buf() -> AlignedBuf {
    aligned_buf(super::CHUNK_SIZE as usize + super::CHUNK_SIZE as usize / 64)
}

/// Object name of the `n`th object of a backup.
pub fn object_id(n: usize) -> String {
    format!("{n:06}")
}

impl UnitSink for RepoSink<'_> {
    type State = RepoState;

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
            .store
            .put_owned(&repo::object_name(self.stanza, self.label, &id), object)?;
        self.stored.fetch_add(len, Ordering::Relaxed);
        Ok(out)
    }

    fn abort(&self) {
        self.store.cancel();
    }
}

/// Writes pieces straight into files that already exist at their final size (sparse).
pub struct DirSink<'a> {
    /// Target path of each file of the list, by index.
    pub targets: &'a [PathBuf],
    /// The files held other bytes before (a delta): all-zero pages are punched out as holes
    /// instead of being skipped, so no old byte survives where the source has zeros.
    pub overwrite: bool,
}

impl UnitSink for DirSink<'_> {
    type State = ();

    fn new_state(&self) -> Result<()> {
        Ok(())
    }

    fn write_unit(
        &self,
        _: &mut (),
        pieces: &[ReadPiece],
        _release: &mut dyn FnMut(),
    ) -> Result<Vec<Piece>> {
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            let path = &self.targets[p.spec.index()];
            write_runs(path, p.spec.offset, p.data, &p.zero_pages)?;
            if self.overwrite && !p.zero_pages.is_empty() {
                punch_zero_pages(path, p.spec.offset, &p.zero_pages)?;
            }
            out.push(Piece {
                object: String::new(),
                offset: 0,
                stored_size: 0,
                stored_xxh3: String::new(),
                logical_offset: p.spec.offset,
                logical_size: p.spec.bytes(),
                zero_pages: p.zero_pages.clone(),
                xxh3: p.xxh3.clone(),
                crc32c: p.crc32c,
            });
        }
        Ok(out)
    }
}

/// Writes the non-zero pages of `data` into the existing file `path` at `offset`: direct
/// I/O for the aligned part (see [`crate::storage::direct`]) when they are at least
/// [`DIRECT_MIN_WRITE`] bytes, the page cache otherwise. The caller syncs at the end.
pub fn write_runs(path: &PathBuf, offset: u64, data: &[u8], zero_pages: &[[u32; 2]]) -> Result<()> {
    let runs = nonzero_runs(data, zero_pages);
    if runs.is_empty() {
        return Ok(());
    }
    let total: usize = runs.iter().map(|(_, b)| b.len()).sum();
    let w = if total < DIRECT_MIN_WRITE {
        Writer::open_buffered(path)
    } else {
        Writer::open(path)
    }
    .map_err(|e| Error::io("open", path, e))?;
    for (off, bytes) in runs {
        w.write_at(bytes, offset + off as u64)
            .map_err(|e| Error::io("write", path, e))?;
    }
    Ok(())
}

/// Makes the all-zero pages `zero_pages` of a piece at `offset` read as zeros in the
/// existing file `path`: punched out as holes (fallocate PUNCH_HOLE, keeping the size), or
/// written as zeros where the filesystem cannot punch.
pub fn punch_zero_pages(path: &PathBuf, offset: u64, zero_pages: &[[u32; 2]]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    let page = crate::pg::checksum::BLCKSZ as u64;
    for [first, count] in zero_pages {
        let at = offset + *first as u64 * page;
        let len = *count as u64 * page;
        // SAFETY: fallocate on an open descriptor with valid offsets; errors are returned.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            let zeros = vec![0u8; len as usize];
            f.write_all_at(&zeros, at)
                .map_err(|e| Error::io("write", path, e))?;
        }
    }
    Ok(())
}
