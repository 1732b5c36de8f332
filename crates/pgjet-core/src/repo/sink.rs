//! The repository's sink of the read pipeline: each unit of a backup becomes one stored
//! object `data/<number>` of frames (compressed pieces, zero pages left out), and each piece
//! a manifest [`Piece`] naming its frame and its hashes.
use super::frame::encode_frame;
use super::incremental::{self, Plan, Reference};
use super::{Backup, Piece};
use crate::codec::{CompressType, Compression, Compressor};
use crate::error::{Error, Result};
use crate::io::direct::{aligned_buf, AlignedBuf};
use crate::pg::checksum::BLCKSZ;
use crate::transfer::{ReadPiece, UnitSink, CHUNK_SIZE};
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
        let start = object.len();
        encode_frame(
            &mut st.compressor,
            logical,
            &zero_pages,
            &mut st.payload,
            object,
        )
        .map_err(|e| {
            Error::Other(format!(
                "{} compression failed at offset {offset}",
                self.compression.kind
            ))
            .because(e)
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
                "cannot set up {} compression",
                self.compression.kind
            ))
            .because(e)
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::CompressType;
    use crate::pg::datadir::SourceFile;
    use crate::repo::handle::Stanza;
    use crate::repo::manifest::{file_entry, FileEntry};
    use crate::storage::object::ObjectStorage;
    use crate::storage::Storage;
    use crate::transfer::PieceSpec;
    use std::sync::Arc;

    /// The label of the test backups.
    pub(crate) const LABEL: &str = "20260101-000000F";
    /// The modification time of the test files (Unix seconds).
    pub(crate) const MTIME: i64 = 1_700_000_000;

    /// An empty in-memory repository.
    pub(crate) fn memory() -> Arc<dyn Storage> {
        Arc::new(ObjectStorage::in_memory("sink-test").unwrap())
    }

    /// `pages` 8 KiB pages and `tail` more bytes of a pattern seeded by `seed`, the pages
    /// listed in `zero` all-zero.
    pub(crate) fn file_bytes(seed: u8, pages: usize, tail: usize, zero: &[usize]) -> Vec<u8> {
        let mut data: Vec<u8> = (0..pages * BLCKSZ + tail)
            .map(|i| ((i * 7 + seed as usize) % 251 + 1) as u8)
            .collect();
        for &z in zero {
            data[z * BLCKSZ..(z + 1) * BLCKSZ].fill(0);
        }
        data
    }

    /// A file of a test backup: its path and bytes.
    pub(crate) type TestFile = (&'static str, Vec<u8>);

    /// A unit: ranges (file number, offset, length) stored as one object.
    pub(crate) type TestUnit = Vec<(usize, u64, u64)>;

    /// The range `len` bytes at `offset` of file number `file` as the read stage hands it
    /// to a sink: its all-zero pages found, its hashes computed.
    pub(crate) fn read_piece(
        files: &[TestFile],
        file: usize,
        offset: u64,
        len: u64,
    ) -> ReadPiece<'_> {
        let (path, data) = &files[file];
        let data = &data[offset as usize..(offset + len) as usize];
        ReadPiece {
            spec: PieceSpec::new(file, offset, len).unwrap(),
            path,
            data,
            zero_pages: crate::transfer::zero_page_runs(data),
            xxh3: crate::codec::xxh3_hex(data),
            crc32c: crate::codec::crc32c(data),
        }
    }

    /// The manifest line of `file` from the pieces its ranges were stored as, in file order.
    pub(crate) fn entry(file: &TestFile, pieces: Vec<Vec<Piece>>) -> FileEntry {
        let f = SourceFile {
            mtime: MTIME,
            ..SourceFile::plain(file.0, file.1.len() as u64)
        };
        file_entry(&f, pieces, Vec::new())
    }

    /// Stores one unit through `sink`; returns each range's pieces with its file number.
    pub(crate) fn store_unit(
        sink: &RepoSink,
        st: &mut RepoState,
        files: &[TestFile],
        unit: &TestUnit,
    ) -> Result<Vec<(usize, Vec<Piece>)>> {
        let read: Vec<ReadPiece> = unit
            .iter()
            .map(|&(f, off, len)| read_piece(files, f, off, len))
            .collect();
        let stored = sink.write_unit(st, &read, &mut || {})?;
        assert_eq!(stored.len(), unit.len(), "one result per range");
        Ok(unit.iter().map(|u| u.0).zip(stored).collect())
    }

    /// Stores every unit through `sink` on one worker state, then returns the manifest
    /// lines of `files` (every range of each file must be in some unit).
    pub(crate) fn store_all(
        sink: &RepoSink,
        files: &[TestFile],
        units: &[TestUnit],
    ) -> Result<Vec<FileEntry>> {
        let mut st = sink.new_state()?;
        let mut per_file: Vec<Vec<Vec<Piece>>> = vec![Vec::new(); files.len()];
        for unit in units {
            for (f, pieces) in store_unit(sink, &mut st, files, unit)? {
                per_file[f].push(pieces);
            }
        }
        Ok(files
            .iter()
            .zip(per_file)
            .map(|(f, mut p)| {
                p.sort_by_key(|v| v.first().map_or(0, |x| x.logical_offset));
                entry(f, p)
            })
            .collect())
    }

    /// Three files over two units: two small files bundled in one object, and a relation
    /// file with zero pages whose ranges go one to each object.
    pub(crate) fn sample_files() -> (Vec<TestFile>, Vec<TestUnit>) {
        let files: Vec<TestFile> = vec![
            ("PG_VERSION", b"15\n".to_vec()),
            ("base/1/16384", file_bytes(3, 6, 0, &[1, 2, 5])),
            ("global/pg_filenode.map", file_bytes(9, 0, 512, &[])),
        ];
        let page = BLCKSZ as u64;
        let units = vec![
            vec![(0, 0, 3), (1, 0, 4 * page), (2, 0, 512)],
            vec![(1, 4 * page, 2 * page)],
        ];
        (files, units)
    }

    /// Each unit becomes one numbered object of the backup; each range a frame of it whose
    /// stored bytes hash to the piece's `stored_xxh3`, all-zero pages left out, and which
    /// decodes back to the range's bytes. Without compression a frame is the range's
    /// non-zero pages as they are.
    #[test]
    fn units_become_numbered_objects_of_checked_frames() {
        for kind in [CompressType::Zstd, CompressType::None, CompressType::Lz4] {
            let stanza = Stanza::new(1, memory(), "s");
            let backup = stanza.backup(LABEL);
            let sink = RepoSink::new(&backup, Compression::new(kind, None).unwrap());
            let (files, units) = sample_files();
            let entries = store_all(&sink, &files, &units).unwrap();

            let names =
                crate::storage::list_sorted(stanza.store(), &format!("s/backup/{LABEL}/data"))
                    .unwrap();
            assert_eq!(names, vec![object_id(1), object_id(2)], "{kind}");
            assert_eq!(sink.next_object.load(Ordering::Relaxed), 3);
            let objects: Vec<Vec<u8>> = names
                .iter()
                .map(|n| stanza.store().get(&backup.object_name(n)).unwrap())
                .collect();
            let total: u64 = objects.iter().map(|o| o.len() as u64).sum();
            assert_eq!(sink.stored.load(Ordering::Relaxed), total, "{kind}");

            let mut cache = crate::repo::frame::FrameCache::new();
            let mut logical = aligned_buf(0);
            for (e, (path, data)) in entries.iter().zip(&files) {
                assert_eq!(e.path, *path);
                assert_eq!(e.size, data.len() as u64);
                assert_eq!(e.crc32c, Some(crate::codec::crc32c(data)), "{path}");
                let mut covered = 0;
                for p in &e.pieces {
                    assert_eq!(p.logical_offset, covered, "{path}: pieces in file order");
                    covered += p.logical_size;
                    let n: usize = p.object.parse().unwrap();
                    let frame =
                        &objects[n - 1][p.offset as usize..(p.offset + p.stored_size) as usize];
                    assert_eq!(
                        crate::codec::xxh3_hex(frame),
                        p.stored_xxh3,
                        "{kind} {path}"
                    );
                    let want = &data[p.logical_offset as usize..covered as usize];
                    assert_eq!(p.zero_pages, crate::transfer::zero_page_runs(want));
                    if kind == CompressType::None {
                        let nonzero: Vec<u8> = crate::transfer::nonzero_runs(want, &p.zero_pages)
                            .into_iter()
                            .flat_map(|(_, run)| run.iter().copied())
                            .collect();
                        assert_eq!(frame, &nonzero[..], "{path}: stored as is, holes left out");
                    }
                    crate::repo::frame::decode_piece(kind, frame, p, &mut logical, &mut cache)
                        .unwrap();
                    assert_eq!(&logical[..], want, "{kind} {path}");
                }
                assert_eq!(covered, e.size, "{path}: pieces cover the file");
            }
            // The relation file's zero pages are not stored: page 1-2 in the first range,
            // page 5 (the second of the second range) in the other.
            let rel = &entries[1].pieces;
            assert_eq!(rel[0].zero_pages, vec![[1, 2]]);
            assert_eq!(rel[1].zero_pages, vec![[1, 1]]);
            if kind == CompressType::None {
                assert_eq!(rel[0].stored_size, 2 * BLCKSZ as u64);
            }
        }
    }

    /// A store that fails the upload of a unit: the sink returns the store's error
    /// (transient, so retryable), the object is not there, the objects before it are, and
    /// the sink's stored bytes count only what was stored.
    #[test]
    fn a_failed_upload_is_the_units_error_and_stores_nothing() {
        use crate::error::StorageFault;
        use crate::storage::fault::{Fault, FaultyStorage, Op};
        let faulty = Arc::new(FaultyStorage::new(memory()));
        let stanza = Stanza::new(1, faulty.clone(), "s");
        let backup = stanza.backup(LABEL);
        let sink = RepoSink::new(&backup, Compression::new(CompressType::Zstd, None).unwrap());
        faulty.inject(
            Op::Put,
            "/data/",
            2,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let (files, units) = sample_files();
        let mut st = sink.new_state().unwrap();
        store_unit(&sink, &mut st, &files, &units[0]).unwrap();
        let after_first = sink.stored.load(Ordering::Relaxed);
        let e = store_unit(&sink, &mut st, &files, &units[1]).unwrap_err();
        crate::storage::fault::assert_transient(&e, Some("write"));
        assert!(
            e.to_string().contains(&object_id(2)),
            "names the object: {e}"
        );
        assert_eq!(faulty.calls(Op::Put, "/data/"), 2);
        assert!(stanza
            .store()
            .exists(&backup.object_name(&object_id(1)))
            .unwrap());
        assert!(!stanza
            .store()
            .exists(&backup.object_name(&object_id(2)))
            .unwrap());
        assert_eq!(sink.stored.load(Ordering::Relaxed), after_first);
        // The worker state survives a failed upload (its buffer went to the store): the
        // next unit, past the fault, is stored under the next number.
        store_unit(&sink, &mut st, &files, &units[1]).unwrap();
        assert!(stanza
            .store()
            .exists(&backup.object_name(&object_id(3)))
            .unwrap());
    }
}
