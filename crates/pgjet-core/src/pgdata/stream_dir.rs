//! A data directory written from the `BASE_BACKUP` stream ([`StreamDir`], a
//! [`crate::transfer::stream_units::StreamSink`]): the decoder hands over tar entries in order on
//! its one thread; each file is created sparse at its size with its recorded mode and its
//! bytes are written in place by a pool of writer threads (pieces of up to [`PIECE`] bytes,
//! all-zero 8 KiB blocks left as holes), so decompression and writing overlap and the
//! writing spreads over the destination's cores. All of a file's pieces go to one writer
//! (the one with the shortest queue when the file begins): two threads writing into one
//! file contend for its inode. Files of at least [`DIRECT_MIN_WRITE`] bytes are written
//! with direct I/O, as the ranges write them ([`crate::io::direct`]): the page cache's copy
//! is what costs the destination most CPU here. Smaller files go through the page cache in
//! writes of at most [`WRITE`] bytes (larger ones fill it with large folios, which cost more
//! here). Measured on this machine, 2 GiB into two files through the page cache: 5.3-8.8 s of
//! CPU from two threads writing 1 MiB pieces of both files, 2.2-3.3 s from one thread per
//! file writing 128 KiB at a time (docs/basebackup-transport.md). A file's modification
//! time is stamped once its last piece is written, so nothing per file is kept once it is
//! done.
//!
//! The held-back files (backup_label, tablespace_map, pg_control) never come here: the
//! caller's one finish ([`super::finish`]) writes them, pg_control last.
//!
//! As a delta ([`StreamDir::delta`], a kept copy of the same cluster re-synced in place),
//! each file is opened where it is and set to its size, each 8 KiB block read back and
//! written only where it differs (zeros included: no holes), through the page cache; the
//! directories and files received are recorded, so that what the server did not send can be
//! removed afterwards ([`super::delta_target::remove_unlisted`]). As an incremental delta
//! ([`StreamDir::incremental`]), each `INCREMENTAL.<name>` file of the stream is applied to
//! `<name>` on the decoder's thread as it arrives ([`super::incremental::IncrementalFile`]:
//! it holds only the changed blocks, few by design).
use super::create_file;
use super::incremental::{plain_name, IncrementalFile};
use crate::error::{Error, Result};
use crate::io::direct::{aligned_buf, AlignedBuf, Writer, DIRECT_MIN_WRITE};
use crate::transfer::stream_units::{StreamSink, StreamStart};
use crate::transfer::Progress;
use crossbeam_channel::{bounded, Receiver, Sender};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Most bytes handed to a writer thread at once: 1 MiB.
pub const PIECE: usize = 1 << 20;

/// Most bytes of one write(2) through the page cache: 128 KiB (see the module's
/// documentation).
pub const WRITE: usize = 128 << 10;

/// Block size below which zeros are not worth a hole; PostgreSQL's page (BLCKSZ).
const BLOCK: usize = 8192;

/// A file being written: shared by its pieces; once the last is written (the last holder
/// drops it), its modification time is stamped, and a failure to do so recorded.
struct Target {
    file: Writer,
    path: PathBuf,
    /// Unix seconds.
    mtime: i64,
    failed: Arc<Mutex<Option<Error>>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(self.mtime.max(0) as u64);
        if let Err(e) = self.file.file().set_modified(t) {
            let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
            f.get_or_insert(Error::io("set the modification time of", &self.path, e));
        }
    }
}

struct Piece {
    target: Arc<Target>,
    offset: u64,
    data: AlignedBuf,
    /// Compare with what the file holds and write only the blocks that differ.
    delta: Option<Arc<DeltaCount>>,
}

/// A delta's bytes: found equal in place, and written.
#[derive(Debug, Default)]
pub struct DeltaCount {
    pub same: std::sync::atomic::AtomicU64,
    pub written: std::sync::atomic::AtomicU64,
}

impl super::incremental::Counted for DeltaCount {
    fn add_same(&self, n: u64) {
        self.same.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    fn add_written(&self, n: u64) {
        self.written
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What a delta received: directories and files, as paths relative to the data directory
/// (a tablespace's under `pg_tblspc/<oid>/`).
#[derive(Debug, Default)]
pub struct DeltaReceived {
    pub dirs: std::collections::HashSet<String>,
    pub files: std::collections::HashSet<String>,
    pub count: Arc<DeltaCount>,
}

/// The sink (see the module's documentation).
pub struct StreamDir<'a> {
    pg_path: PathBuf,
    /// (OID, chosen location) of each tablespace.
    locations: Vec<(u32, PathBuf)>,
    /// The root of the archive being decoded.
    root: PathBuf,
    tablespace: Option<u32>,
    dir_mode: u32,
    /// One queue per writer thread.
    txs: Vec<Sender<Piece>>,
    /// Buffers the writers are done with, for the next pieces.
    spare: Receiver<AlignedBuf>,
    workers: Vec<JoinHandle<()>>,
    failed: Arc<Mutex<Option<Error>>>,
    /// The file being received: its target, the offset of the next piece, its writer.
    cur: Option<(Arc<Target>, u64, usize)>,
    /// The writer the next file's search starts at (round robin among equal queues).
    next_writer: usize,
    /// The piece being filled (aligned, for direct I/O).
    buf: AlignedBuf,
    /// Bytes of file content received.
    pub bytes: u64,
    progress: Option<&'a dyn Progress>,
    /// Progress reported so far, bytes.
    reported: u64,
    /// As a delta: what was received, and the bytes found equal or written.
    delta: Option<DeltaReceived>,
    /// The stream is an incremental `BASE_BACKUP` over the kept copy: its `INCREMENTAL.`
    /// files are applied in place ([`super::incremental`]).
    incremental: bool,
    /// The `INCREMENTAL.` file being applied.
    incr: Option<IncrementalFile>,
    /// Tablespaces are learned from the stream's header (no SQL session listed them before):
    /// the `--tablespace-map` entries, by OID or original location.
    from_header: Option<Vec<(String, PathBuf)>>,
}

impl<'a> StreamDir<'a> {
    /// A sink writing into `pg_path` (already prepared: [`super::prepare_target`]) and the
    /// tablespace directories `locations`, with `jobs` writer threads (at least 1). New
    /// directories get their recorded mode, or `dir_mode` when none was recorded.
    /// `progress` gets the server's progress reports (bytes done, phase "replica-create").
    pub fn new(
        pg_path: &Path,
        locations: Vec<(u32, PathBuf)>,
        dir_mode: u32,
        jobs: usize,
        progress: Option<&'a dyn Progress>,
    ) -> StreamDir<'a> {
        let failed: Arc<Mutex<Option<Error>>> = Arc::new(Mutex::new(None));
        let (give_back, spare) = bounded::<AlignedBuf>(jobs.max(1) * 5);
        let (txs, workers) = (0..jobs.max(1))
            .map(|_| {
                let (tx, rx) = bounded::<Piece>(4);
                let failed = failed.clone();
                let give_back = give_back.clone();
                let w = std::thread::spawn(move || {
                    for p in rx {
                        if let Err(e) = write_piece(&p) {
                            let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
                            f.get_or_insert(e);
                        }
                        let mut data = p.data;
                        data.clear();
                        let _ = give_back.try_send(data);
                    }
                });
                (tx, w)
            })
            .unzip();
        StreamDir {
            pg_path: pg_path.to_path_buf(),
            locations,
            root: pg_path.to_path_buf(),
            tablespace: None,
            dir_mode,
            txs,
            spare,
            workers,
            failed,
            cur: None,
            next_writer: 0,
            buf: aligned_buf(PIECE),
            bytes: 0,
            progress,
            reported: 0,
            delta: None,
            incremental: false,
            incr: None,
            from_header: None,
        }
    }

    /// This sink making, when the stream starts, the tablespaces its header lists that
    /// `locations` lacks (a replication-only role: nothing listed them before): each in its
    /// `map` entry (by OID or original location) or its original location, which must be
    /// empty, with its `pg_tblspc` link.
    pub fn tablespaces_from_header(mut self, map: Vec<(String, PathBuf)>) -> Self {
        self.from_header = Some(map);
        self
    }

    /// See [`StreamDir::tablespaces_from_header`]. Errors: a map entry that names no
    /// tablespace, a directory that is not empty or cannot be made.
    fn make_listed_tablespaces(&mut self, listed: &[(u32, String)]) -> Result<()> {
        let Some(map) = &self.from_header else {
            return Ok(());
        };
        super::check_map_used(map, listed)?;
        for (oid, location) in listed {
            if self.locations.iter().any(|(o, _)| o == oid) {
                continue;
            }
            let dir = super::mapped_dir(map, *oid, location).unwrap_or_else(|| location.into());
            super::check_empty_target(&dir, &format!("tablespace OID {oid} directory"))?;
            super::create_cluster_dir(&dir, self.dir_mode)?;
            let tblspc = self.pg_path.join("pg_tblspc");
            crate::io::fs::create_dir_all(&tblspc, self.dir_mode)?;
            let link = tblspc.join(oid.to_string());
            match fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io("remove", &link, e))
                }
                _ => {}
            }
            std::os::unix::fs::symlink(&dir, &link)
                .map_err(|e| Error::io("create tablespace link", &link, e))?;
            tracing::info!("tablespace OID {oid} goes to {}", dir.display());
            self.locations.push((*oid, dir));
        }
        Ok(())
    }

    /// This sink as a delta over a kept copy (see the module's documentation).
    pub fn delta(mut self) -> Self {
        self.delta = Some(DeltaReceived::default());
        self
    }

    /// This delta's stream as an incremental `BASE_BACKUP`: each `INCREMENTAL.<name>` file
    /// is applied in place to `<name>` ([`IncrementalFile`]); the others are written as
    /// [`StreamDir::delta`] writes them.
    pub fn incremental(mut self) -> Self {
        self.incremental = true;
        self.delta()
    }

    /// What a delta received (None for a full copy); call after [`StreamDir::finish`].
    pub fn take_delta(&mut self) -> Option<DeltaReceived> {
        self.delta.take()
    }

    /// `path` (relative to the archive's root) relative to the data directory.
    fn in_data_dir(&self, path: &str) -> String {
        let path = path.trim_end_matches('/');
        match self.tablespace {
            None => path.to_string(),
            Some(oid) => format!("pg_tblspc/{oid}/{path}"),
        }
    }

    fn check(&self) -> Result<()> {
        let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        match f.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn dispatch(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let (target, offset, writer) = self
            .cur
            .as_mut()
            .ok_or_else(|| Error::Other("stream: data outside a file".into()))?;
        let next = self.spare.try_recv().unwrap_or_else(|_| aligned_buf(PIECE));
        let data = std::mem::replace(&mut self.buf, next);
        let n = data.len() as u64;
        let piece = Piece {
            target: target.clone(),
            offset: *offset,
            data,
            delta: self.delta.as_ref().map(|d| d.count.clone()),
        };
        *offset += n;
        self.txs
            .get(*writer)
            .ok_or_else(|| Error::Other("stream: the writers are gone".into()))?
            .send(piece)
            .map_err(|_| Error::Other("stream: the writers stopped".into()))?;
        self.check()
    }

    /// The writer for a new file: the one with the shortest queue, searched from the one
    /// after the last chosen.
    fn pick_writer(&mut self) -> usize {
        let n = self.txs.len().max(1);
        let w = (0..n)
            .map(|i| (self.next_writer + i) % n)
            .min_by_key(|&w| self.txs.get(w).map_or(0, |t| t.len()))
            .unwrap_or(0);
        self.next_writer = (w + 1) % n;
        w
    }

    /// Waits for every piece to be written. Errors: the first write that failed.
    pub fn finish(&mut self) -> Result<()> {
        self.txs.clear();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        self.check()
    }
}

impl Drop for StreamDir<'_> {
    fn drop(&mut self) {
        self.txs.clear();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Writes a piece at its offset, leaving all-zero blocks as holes (the file was created
/// sparse at its size, so they read as zeros): runs of non-zero blocks in one write each,
/// of at most [`WRITE`] bytes through the page cache.
fn write_piece(p: &Piece) -> Result<()> {
    if let Some(count) = &p.delta {
        return write_piece_delta(p, count);
    }
    let most = if p.target.file.is_direct() {
        PIECE
    } else {
        WRITE
    };
    let mut at = 0usize;
    while at < p.data.len() {
        let end = (at + BLOCK).min(p.data.len());
        if p.data[at..end].iter().all(|&b| b == 0) {
            at = end;
            continue;
        }
        // Extend over the following non-zero blocks, up to WRITE bytes, so one write covers
        // them.
        let mut stop = end;
        while stop < p.data.len() && stop - at < most {
            let next = (stop + BLOCK).min(p.data.len());
            if p.data[stop..next].iter().all(|&b| b == 0) {
                break;
            }
            stop = next;
        }
        p.target
            .file
            .write_at(&p.data[at..stop], p.offset + at as u64)
            .map_err(|e| Error::io("write", p.target.path.as_path(), e))?;
        at = stop;
    }
    Ok(())
}

/// A delta's piece: the file's bytes at the piece's place are read, and only the 8 KiB
/// blocks that differ are written (runs of them in one write each, at most [`WRITE`] bytes).
fn write_piece_delta(p: &Piece, count: &DeltaCount) -> Result<()> {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::Ordering::Relaxed;
    let path = p.target.path.as_path();
    let mut old = vec![0u8; p.data.len()];
    let mut got = 0;
    while got < old.len() {
        match p
            .target
            .file
            .file()
            .read_at(&mut old[got..], p.offset + got as u64)
        {
            Ok(0) => break, // past the end: compared with zeros, as set_len made them
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read", path, e)),
        }
    }
    let mut at = 0usize;
    while at < p.data.len() {
        let end = (at + BLOCK).min(p.data.len());
        if p.data[at..end] == old[at..end] {
            count.same.fetch_add((end - at) as u64, Relaxed);
            at = end;
            continue;
        }
        let mut stop = end;
        while stop < p.data.len() && stop - at < WRITE {
            let next = (stop + BLOCK).min(p.data.len());
            if p.data[stop..next] == old[stop..next] {
                break;
            }
            stop = next;
        }
        p.target
            .file
            .write_at(&p.data[at..stop], p.offset + at as u64)
            .map_err(|e| Error::io("write", path, e))?;
        count.written.fetch_add((stop - at) as u64, Relaxed);
        at = stop;
    }
    Ok(())
}

impl StreamSink for StreamDir<'_> {
    fn begin_archive(&mut self, name: &str, tablespace: Option<u32>) -> Result<()> {
        self.tablespace = tablespace;
        self.root = match tablespace {
            None => self.pg_path.clone(),
            Some(oid) => self
                .locations
                .iter()
                .find(|(o, _)| *o == oid)
                .map(|(_, d)| d.clone())
                .ok_or_else(|| {
                    Error::Unsafe(format!(
                        "the server sent archive {name} for tablespace OID {oid}, which was not listed when the backup started (created meanwhile?); run replica-create again"
                    ))
                })?,
        };
        Ok(())
    }

    fn directory(&mut self, path: &str, mode: u32) -> Result<()> {
        if self.delta.is_some() {
            let rel = self.in_data_dir(path);
            if let Some(d) = &mut self.delta {
                d.dirs.insert(rel);
            }
        }
        if self.tablespace.is_none() && is_tablespace_link(path) {
            return Ok(()); // made by prepare_target
        }
        let p = self.root.join(path);
        let mode = if mode == 0 { self.dir_mode } else { mode };
        match fs::DirBuilder::new().mode(mode).create(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create directory", &p, e)),
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("chmod", &p, e))
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        if self.tablespace.is_none() && is_tablespace_link(path) {
            return Ok(()); // made by prepare_target, to the chosen location
        }
        let p = self.root.join(path);
        std::os::unix::fs::symlink(target, &p).map_err(|e| Error::io("create link", &p, e))
    }

    fn file_begin(&mut self, path: &str, size: u64, mode: u32, mtime: i64) -> Result<()> {
        if let Some(plain) = self.incremental.then(|| plain_name(path)).flatten() {
            let rel = self.in_data_dir(&plain);
            if let Some(d) = &mut self.delta {
                d.files.insert(rel);
            }
            self.incr = Some(IncrementalFile::open(&self.root, &plain)?);
            self.bytes += size;
            return Ok(());
        }
        let (path, file) = if self.delta.is_some() {
            let rel = self.in_data_dir(path);
            let (p, f, _) = super::delta_target::size_file(&self.root, path, size, mode)?;
            if let Some(d) = &mut self.delta {
                d.files.insert(rel);
            }
            // Read back and compared: through the page cache.
            let w = Writer::wrap(f, &p, false);
            (p, w)
        } else {
            let (p, f) = create_file(&self.root, path, size, mode)?;
            let direct = size >= DIRECT_MIN_WRITE as u64;
            let w = Writer::wrap(f, &p, direct);
            (p, w)
        };
        let target = Target {
            file,
            path,
            mtime,
            failed: self.failed.clone(),
        };
        let writer = self.pick_writer();
        self.cur = Some((Arc::new(target), 0, writer));
        self.bytes += size;
        Ok(())
    }

    fn file_data(&mut self, data: &[u8]) -> Result<()> {
        if let (Some(i), Some(d)) = (&mut self.incr, &self.delta) {
            return i.feed(data, d.count.as_ref());
        }
        let mut rest = data;
        while !rest.is_empty() {
            let n = rest.len().min(PIECE - self.buf.len());
            self.buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.buf.len() == PIECE {
                self.dispatch()?;
            }
        }
        Ok(())
    }

    fn file_end(&mut self) -> Result<()> {
        if let Some(i) = self.incr.take() {
            return i.finish();
        }
        self.dispatch()?;
        self.cur = None;
        Ok(())
    }

    fn started(&mut self, start: &StreamStart) -> Result<()> {
        self.make_listed_tablespaces(&start.tablespaces)?;
        if let Some(p) = self.progress {
            p.begin("replica-create", start.total_bytes);
        }
        Ok(())
    }

    fn progress(&mut self, done: u64) {
        if let Some(p) = self.progress {
            if done > self.reported {
                p.advance(done - self.reported);
                self.reported = done;
            }
        }
    }
}

/// `pg_tblspc/<oid>`: a tablespace's link in the main archive.
fn is_tablespace_link(path: &str) -> bool {
    path.strip_prefix("pg_tblspc/")
        .is_some_and(|r| !r.is_empty() && !r.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_sparse_in_place_and_skips_links() {
        let d = tempfile::tempdir().unwrap();
        let ts = tempfile::tempdir().unwrap();
        let mut s = StreamDir::new(d.path(), vec![(7, ts.path().to_path_buf())], 0o700, 3, None);
        s.begin_archive("base.tar", None).unwrap();
        s.directory("base", 0o700).unwrap();
        s.directory("pg_tblspc", 0o700).unwrap();
        s.symlink("pg_tblspc/7", "/nowhere").unwrap();
        let mut data = vec![0u8; 3 * PIECE + 5];
        data[PIECE + 3] = 9;
        data[3 * PIECE + 4] = 1;
        s.file_begin("base/1", data.len() as u64, 0o640, 1_700_000_000)
            .unwrap();
        for c in data.chunks(70_000) {
            s.file_data(c).unwrap();
        }
        s.file_end().unwrap();
        s.begin_archive("7.tar", Some(7)).unwrap();
        s.file_begin("PG_15_1/x", 3, 0o600, 0).unwrap();
        s.file_data(b"abc").unwrap();
        s.file_end().unwrap();
        assert!(s.begin_archive("8.tar", Some(8)).is_err());
        s.finish().unwrap();
        assert_eq!(std::fs::read(d.path().join("base/1")).unwrap(), data);
        assert_eq!(std::fs::read(ts.path().join("PG_15_1/x")).unwrap(), b"abc");
        assert!(!d.path().join("pg_tblspc/7").exists());
        let m = std::fs::metadata(d.path().join("base/1")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(m.mode() & 0o777, 0o640);
        assert_eq!(
            m.mtime(),
            1_700_000_000,
            "stamped once its last piece was written"
        );
        assert!(m.blocks() * 512 < data.len() as u64, "sparse");
    }
}
