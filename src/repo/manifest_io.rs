//! The manifest as stored (repository format 2): a stream of JSON lines compressed with zstd
//! (`manifest.jsonl.zst`), written and read without holding the encoded text in memory, and a
//! small `summary.json` written last, whose presence makes the backup complete and which
//! `info` reads instead of the manifest. docs/repository-format.md describes both.
//!
//! Lines of the manifest, in order: one `{"header": ...}` with what is known when the backup
//! starts, the `{"dir": ...}` lines, the `{"file": ...}` lines (in any order: a backup may
//! write each file as soon as it is stored), one `{"end": ...}` with what is known when it
//! stops (stop LSN, backup label, WAL) and the counts and totals (a truncated stream lacks
//! it). The summary records the stored manifest's size and XXH3-128, checked on read.
use super::manifest::{BackupManifest, DirEntry, FileEntry, ManifestHeader, StopInfo};
use super::{backup_dir, REPO_FORMAT};
use crate::error::{Error, Result};
use crate::storage::{ObjectWriter, Storage};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use xxhash_rust::xxh3::Xxh3;

/// Object name of the manifest inside a backup's directory.
pub const MANIFEST_OBJECT: &str = "manifest.jsonl.zst";
/// Object name of the summary inside a backup's directory.
pub const SUMMARY_OBJECT: &str = "summary.json";
/// zstd level of the manifest: level 3 shrinks its JSON about tenfold at ~100 MB/s per core.
const MANIFEST_ZSTD_LEVEL: i32 = 3;
/// Bytes handed to the store per write of the manifest stream.
const WRITE_BUFFER: usize = 1 << 20;

/// Name of a backup's manifest object.
pub fn manifest_name(stanza: &str, label: &str) -> String {
    format!("{}/{MANIFEST_OBJECT}", backup_dir(stanza, label))
}

/// Name of a backup's summary object.
pub fn summary_name(stanza: &str, label: &str) -> String {
    format!("{}/{SUMMARY_OBJECT}", backup_dir(stanza, label))
}

/// The last manifest line: what is known when the backup stops, and the counts and totals,
/// so a truncated stream is told from a whole one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestEnd {
    #[serde(flatten)]
    pub stop: StopInfo,
    pub dirs: u64,
    pub files: u64,
    /// Logical bytes of all files.
    pub size: u64,
    /// Stored bytes of all objects.
    pub stored_size: u64,
}

/// One manifest line, borrowed, as it is written.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum LineRef<'a> {
    Header(&'a ManifestHeader),
    Dir(&'a DirEntry),
    File(&'a FileEntry),
    End(&'a ManifestEnd),
}

/// One manifest line, as it is read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Header(ManifestHeader),
    Dir(DirEntry),
    File(FileEntry),
    End(ManifestEnd),
}

/// Where the stored manifest is and what its bytes hash to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestRef {
    pub object: String,
    /// Stored (compressed) bytes.
    pub stored_size: u64,
    /// XXH3-128 (hex) of the stored bytes.
    pub xxh3: String,
}

/// `summary.json`: the manifest's header and end line without the files, and the manifest's
/// reference; what `info` shows of a backup. Written last.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupSummary {
    #[serde(flatten)]
    pub header: ManifestHeader,
    #[serde(flatten)]
    pub end: ManifestEnd,
    pub manifest: ManifestRef,
}

/// A [`Write`] over an [`ObjectWriter`] that hashes and counts what passes, in chunks of
/// [`WRITE_BUFFER`].
struct HashingSink {
    out: Box<dyn ObjectWriter>,
    buf: Vec<u8>,
    hash: Xxh3,
    bytes: u64,
    /// The first store error (a [`Write`] can only return io::Error).
    failed: Option<Error>,
}

impl HashingSink {
    fn flush_buf(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.hash.update(&self.buf);
        self.bytes += self.buf.len() as u64;
        if let Err(e) = self.out.write(&self.buf) {
            let msg = e.to_string();
            self.failed = Some(e);
            return Err(std::io::Error::other(msg));
        }
        self.buf.clear();
        Ok(())
    }
}

impl Write for HashingSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= WRITE_BUFFER {
            self.flush_buf()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flush_buf()
    }
}

/// Writes a backup's manifest as the backup runs: the header when it starts, each directory
/// and file as it is known, then [`ManifestWriter::finish`] writes the end line and the
/// summary. Memory is the compressor's and one write buffer, whatever the file count. A
/// writer dropped unfinished leaves no manifest (and no summary).
pub struct ManifestWriter {
    name: String,
    header: ManifestHeader,
    z: zstd::stream::write::Encoder<'static, HashingSink>,
    dirs: u64,
    files: u64,
    size: u64,
}

impl ManifestWriter {
    /// Starts the manifest of the backup `header` describes and writes the header line.
    pub fn create(store: &dyn Storage, header: ManifestHeader) -> Result<ManifestWriter> {
        let name = manifest_name(&header.stanza, &header.label);
        let sink = HashingSink {
            out: store.writer(&name)?,
            buf: Vec::with_capacity(WRITE_BUFFER + (64 << 10)),
            hash: Xxh3::new(),
            bytes: 0,
            failed: None,
        };
        let z = zstd::stream::write::Encoder::new(sink, MANIFEST_ZSTD_LEVEL)
            .map_err(|e| Error::Other(format!("cannot start the manifest {name}: {e}")))?;
        let mut w = ManifestWriter {
            name,
            header,
            z,
            dirs: 0,
            files: 0,
            size: 0,
        };
        let h = w.header.clone();
        w.line(LineRef::Header(&h))?;
        Ok(w)
    }

    fn line(&mut self, l: LineRef<'_>) -> Result<()> {
        let r = serde_json::to_writer(&mut self.z, &l)
            .map_err(std::io::Error::other)
            .and_then(|_| self.z.write_all(b"\n"));
        r.map_err(|e| self.error(e))
    }

    /// The store's own error when a write failed there, else an encoding error.
    fn error(&mut self, e: std::io::Error) -> Error {
        self.z.get_mut().failed.take().unwrap_or_else(|| {
            Error::Other(format!("cannot write the manifest {}: {e}", self.name))
        })
    }

    /// Adds a directory.
    pub fn dir(&mut self, d: &DirEntry) -> Result<()> {
        self.dirs += 1;
        self.line(LineRef::Dir(d))
    }

    /// Adds a file.
    pub fn file(&mut self, f: &FileEntry) -> Result<()> {
        self.files += 1;
        self.size += f.size;
        self.line(LineRef::File(f))
    }

    /// Files added so far.
    pub fn files(&self) -> u64 {
        self.files
    }

    /// Logical bytes of the files added so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Writes the end line, completes the manifest object, makes everything durable and
    /// writes the summary last: the backup is complete when this returns.
    /// `stored_size`: bytes of the data objects.
    pub fn finish(
        mut self,
        store: &dyn Storage,
        stop: StopInfo,
        stored_size: u64,
    ) -> Result<BackupSummary> {
        let end = ManifestEnd {
            stop,
            dirs: self.dirs,
            files: self.files,
            size: self.size,
            stored_size,
        };
        self.line(LineRef::End(&end))?;
        // The zstd frame's end, then the last buffered bytes: errors keep the store's own.
        let done = self
            .z
            .do_finish()
            .and_then(|_| self.z.get_mut().flush_buf());
        done.map_err(|e| self.error(e))?;
        let sink = self
            .z
            .finish()
            .map_err(|e| Error::Other(format!("cannot write the manifest {}: {e}", self.name)))?;
        let manifest = ManifestRef {
            object: MANIFEST_OBJECT.into(),
            stored_size: sink.bytes,
            xxh3: format!("{:032x}", sink.hash.digest128()),
        };
        sink.out.finish()?;
        let summary = BackupSummary {
            header: self.header,
            end,
            manifest,
        };
        let json = serde_json::to_vec_pretty(&summary)
            .map_err(|e| Error::Other(format!("cannot encode the summary: {e}")))?;
        store.sync()?;
        store.put_durable(
            &summary_name(&summary.header.stanza, &summary.header.label),
            &json,
        )?;
        Ok(summary)
    }
}

/// Writes `m`'s manifest and then its summary (last: the backup is complete from then on),
/// through a [`ManifestWriter`]. Returns the summary.
///
/// Errors: storage errors; a stream that could not be encoded.
pub fn write_manifest(store: &dyn Storage, m: &BackupManifest) -> Result<BackupSummary> {
    let mut w = ManifestWriter::create(store, m.header.clone())?;
    for d in &m.directories {
        w.dir(d)?;
    }
    for f in &m.files {
        w.file(f)?;
    }
    w.finish(store, m.stop.clone(), m.stored_size)
}

/// Reads a backup's summary; errors when the backup does not exist or is incomplete.
pub fn read_summary(store: &dyn Storage, stanza: &str, label: &str) -> Result<BackupSummary> {
    let name = summary_name(stanza, label);
    let bytes = match store.get(&name) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(Error::Repo(format!(
                "backup '{label}' of stanza '{stanza}' does not exist or is incomplete"
            )))
        }
        Err(e) => return Err(e),
    };
    let s: BackupSummary = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Repo(format!("{name} is not valid: {e}")))?;
    let h = &s.header;
    if h.format != REPO_FORMAT {
        return Err(Error::Repo(format!(
            "{name} has format {}, this pgjet reads {REPO_FORMAT}",
            h.format
        )));
    }
    if h.label != label || h.stanza != stanza {
        return Err(Error::Repo(format!(
            "{name} describes backup {}/{}, not {stanza}/{label}",
            h.stanza, h.label
        )));
    }
    Ok(s)
}

/// A [`Read`] that hashes and counts what passes.
struct HashingSource<R> {
    inner: R,
    hash: Xxh3,
    bytes: u64,
}

impl<R: Read> Read for HashingSource<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(out)?;
        self.hash.update(&out[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Reads a backup's manifest as a stream, checks it against its summary (size, XXH3 of the
/// stored bytes, counts and totals of the last line) and validates it.
///
/// Errors: [`Error::Repo`] for a missing or incomplete backup or another format;
/// [`Error::Corrupt`] naming the manifest when its bytes or lines are damaged.
pub fn read_manifest(store: &dyn Storage, stanza: &str, label: &str) -> Result<BackupManifest> {
    let summary = read_summary(store, stanza, label)?;
    let name = format!("{}/{}", backup_dir(stanza, label), summary.manifest.object);
    let corrupt = |why: String| Error::Corrupt {
        label: label.to_string(),
        files: vec![format!("{} ({why})", summary.manifest.object)],
    };
    let mut src = HashingSource {
        inner: store.reader(&name).map_err(|e| {
            if e.is_not_found() {
                corrupt("missing".into())
            } else {
                e
            }
        })?,
        hash: Xxh3::new(),
        bytes: 0,
    };
    let (mut header, mut dirs, mut files, mut end) = (None, Vec::new(), Vec::new(), None);
    {
        let z = zstd::stream::read::Decoder::new(&mut src)
            .map_err(|e| corrupt(format!("not zstd: {e}")))?;
        let mut lines = BufReader::with_capacity(1 << 20, z);
        let mut buf = String::new();
        let mut n = 0u64;
        loop {
            buf.clear();
            let got = lines
                .read_line(&mut buf)
                .map_err(|e| corrupt(format!("unreadable after line {n}: {e}")))?;
            if got == 0 {
                break;
            }
            n += 1;
            if end.is_some() {
                return Err(corrupt(format!("line {n} follows the end line")));
            }
            let l: Line = serde_json::from_str(&buf)
                .map_err(|e| corrupt(format!("line {n} is not valid: {e}")))?;
            match (l, header.is_some()) {
                (Line::Header(h), false) if n == 1 => header = Some(h),
                (Line::Dir(d), true) => dirs.push(d),
                (Line::File(f), true) => files.push(f),
                (Line::End(e), true) => end = Some(e),
                _ => return Err(corrupt(format!("line {n} is out of order"))),
            }
        }
        // Drain what the decoder did not need, so the hash covers every stored byte.
        let mut rest = lines.into_inner().finish();
        std::io::copy(&mut rest, &mut std::io::sink())
            .map_err(|e| corrupt(format!("unreadable: {e}")))?;
    }
    let digest = format!("{:032x}", src.hash.digest128());
    if src.bytes != summary.manifest.stored_size || digest != summary.manifest.xxh3 {
        return Err(corrupt(format!(
            "{} bytes with XXH3 {digest}, the summary records {} bytes with XXH3 {}",
            src.bytes, summary.manifest.stored_size, summary.manifest.xxh3
        )));
    }
    let (header, end) = match (header, end) {
        (Some(h), Some(e)) => (h, e),
        _ => return Err(corrupt("truncated: no header or no end line".into())),
    };
    if end.dirs != dirs.len() as u64 || end.files != files.len() as u64 {
        return Err(corrupt(format!(
            "the end line counts {} directories and {} files, the stream holds {} and {}",
            end.dirs,
            end.files,
            dirs.len(),
            files.len()
        )));
    }
    if header.format != REPO_FORMAT || header.label != label || header.stanza != stanza {
        return Err(corrupt(format!(
            "the header describes {}/{} in format {}",
            header.stanza, header.label, header.format
        )));
    }
    let m = BackupManifest {
        header,
        stop: end.stop,
        size: end.size,
        stored_size: end.stored_size,
        directories: dirs,
        files,
    };
    m.validate().map_err(corrupt)?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::posix::PosixStorage;

    fn store() -> (tempfile::TempDir, PosixStorage) {
        let dir = tempfile::tempdir().unwrap();
        let s = PosixStorage::open(dir.path()).unwrap();
        (dir, s)
    }

    #[test]
    fn a_manifest_round_trips_and_its_summary_marks_it_complete() {
        let (_d, st) = store();
        let m = super::super::manifest::tests::sample();
        assert!(read_summary(&st, &m.header.stanza, &m.header.label).is_err());
        let s = write_manifest(&st, &m).unwrap();
        let sum: u64 = m.files.iter().map(|f| f.size).sum();
        assert_eq!((s.end.files, s.end.size), (m.files.len() as u64, sum));
        let back = read_manifest(&st, &m.header.stanza, &m.header.label).unwrap();
        assert_eq!(back.files, m.files);
        assert_eq!(back.directories, m.directories);
        assert_eq!(back.stop, m.stop);
        assert_eq!(back.header, m.header);
        assert_eq!(
            read_summary(&st, &m.header.stanza, &m.header.label)
                .unwrap()
                .manifest,
            s.manifest
        );
    }

    #[test]
    fn a_damaged_or_truncated_manifest_is_named() {
        let (d, st) = store();
        let m = super::super::manifest::tests::sample();
        write_manifest(&st, &m).unwrap();
        let path = d
            .path()
            .join(manifest_name(&m.header.stanza, &m.header.label));
        let good = std::fs::read(&path).unwrap();
        // A flipped byte: the stored bytes no longer match the summary.
        let mut bad = good.clone();
        let i = bad.len() / 2;
        bad[i] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let e = read_manifest(&st, &m.header.stanza, &m.header.label)
            .unwrap_err()
            .to_string();
        assert!(e.contains(MANIFEST_OBJECT), "{e}");
        // Truncated.
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        let e = read_manifest(&st, &m.header.stanza, &m.header.label)
            .unwrap_err()
            .to_string();
        assert!(e.contains(MANIFEST_OBJECT), "{e}");
        // Missing.
        std::fs::remove_file(&path).unwrap();
        let e = read_manifest(&st, &m.header.stanza, &m.header.label).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    }
}
