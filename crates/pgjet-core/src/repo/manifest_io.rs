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
use super::handle::Backup;
use super::manifest::{BackupManifest, DirEntry, FileEntry, ManifestHeader, StopInfo};
use super::REPO_FORMAT;
use crate::error::{Error, Result};
use crate::storage::{ObjectWriter, Storage};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::Arc;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// Object name of the manifest inside a backup's directory.
pub const MANIFEST_OBJECT: &str = "manifest.jsonl.zst";
/// Object name of the summary inside a backup's directory.
pub const SUMMARY_OBJECT: &str = "summary.json";
/// zstd level of the manifest: level 3 shrinks its JSON about tenfold at ~100 MB/s per core.
const MANIFEST_ZSTD_LEVEL: i32 = 3;
/// Bytes handed to the store per write of the manifest stream.
const WRITE_BUFFER: usize = 1 << 20;

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
    /// Stored bytes of all objects (of this backup: what it added to the repository).
    pub stored_size: u64,
    /// Logical bytes of the pieces this backup stored itself (a full: `size`; a diff or
    /// incr: what changed), pgBackRest's `info.delta`; absent in backups written before
    /// pgjet recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_size: Option<u64>,
    /// Pages whose checksum failed twice in the source (each listed with its file in the
    /// manifest), pgBackRest's `error`; absent in backups written before pgjet recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_errors: Option<u64>,
    /// Labels of the older backups whose objects this one's pieces name, sorted; a
    /// reader needs each of them complete. Empty for a full backup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<String>,
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
    /// The backup's repository, and the name of its summary.
    store: Arc<dyn Storage>,
    summary_name: String,
    header: ManifestHeader,
    z: zstd::stream::write::Encoder<'static, HashingSink>,
    dirs: u64,
    files: u64,
    size: u64,
    /// Logical bytes of the pieces so far that this backup stored itself.
    delta_size: u64,
    /// Pages of the files so far whose checksum failed.
    page_errors: u64,
    /// Labels of the older backups the pieces so far name.
    references: std::collections::BTreeSet<String>,
    /// The resume journal each file line also goes to ([`super::resume`]).
    journal: Option<super::resume::Journal>,
}

impl ManifestWriter {
    /// Starts the manifest of the backup `header` describes and writes the header line.
    /// Called through [`Backup::begin`], which checks that `header` names `backup`.
    pub(super) fn create(backup: &Backup, header: ManifestHeader) -> Result<ManifestWriter> {
        let name = backup.file_name(MANIFEST_OBJECT);
        let store = backup.stanza().store_arc();
        let sink = HashingSink {
            out: store.writer(&name)?,
            buf: Vec::with_capacity(WRITE_BUFFER + (64 << 10)),
            hash: Xxh3::new(),
            bytes: 0,
            failed: None,
        };
        let z = zstd::stream::write::Encoder::new(sink, MANIFEST_ZSTD_LEVEL)
            .map_err(|e| Error::Other(format!("cannot start the manifest {name}")).because(e))?;
        let mut w = ManifestWriter {
            name,
            store,
            summary_name: backup.file_name(SUMMARY_OBJECT),
            header,
            z,
            dirs: 0,
            files: 0,
            size: 0,
            delta_size: 0,
            page_errors: 0,
            references: Default::default(),
            journal: None,
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
            Error::Other(format!("cannot write the manifest {}", self.name)).because(e)
        })
    }

    /// Adds a directory.
    pub fn dir(&mut self, d: &DirEntry) -> Result<()> {
        self.dirs += 1;
        self.line(LineRef::Dir(d))
    }

    /// Sends every file line from now on to `journal` too.
    pub fn with_journal(mut self, journal: super::resume::Journal) -> ManifestWriter {
        self.journal = Some(journal);
        self
    }

    /// Tells the resume journal how many logical bytes the backup copies
    /// ([`super::resume::Journal::scale_to`]).
    pub fn journal_total(&mut self, total: u64) {
        if let Some(j) = &mut self.journal {
            j.scale_to(total);
        }
    }

    /// Logical bytes of the files added so far whose frames an earlier attempt of this
    /// backup stored (0 without a journal).
    pub fn reused(&self) -> u64 {
        self.journal.as_ref().map_or(0, |j| j.reused())
    }

    /// Saves the first `covered` bytes of a file still being stored, `f` naming the pieces
    /// that hold them, to the resume journal (nothing without one): the manifest gets the
    /// file once it is whole ([`ManifestWriter::file`]).
    ///
    /// Errors: the journal's last save.
    pub fn partial(&mut self, f: FileEntry, covered: u64) -> Result<()> {
        match &mut self.journal {
            Some(j) => j.partial(f, covered),
            None => Ok(()),
        }
    }

    /// Adds a file.
    pub fn file(&mut self, f: &FileEntry) -> Result<()> {
        if let Some(j) = &mut self.journal {
            j.add(f)?;
        }
        self.files += 1;
        self.size += f.size;
        self.page_errors += f.page_errors.len() as u64;
        for p in &f.pieces {
            match &p.backup {
                Some(b) => {
                    if !self.references.contains(b) {
                        self.references.insert(b.clone());
                    }
                }
                None => self.delta_size += p.logical_size,
            }
        }
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
    pub fn finish(mut self, stop: StopInfo, stored_size: u64) -> Result<BackupSummary> {
        let mut journal = self.journal.take();
        if let Some(j) = &mut journal {
            j.close()?;
        }
        let mut references: Vec<String> =
            std::mem::take(&mut self.references).into_iter().collect();
        references.sort();
        let end = ManifestEnd {
            stop,
            dirs: self.dirs,
            files: self.files,
            size: self.size,
            stored_size,
            delta_size: Some(self.delta_size),
            page_errors: Some(self.page_errors),
            references,
        };
        self.line(LineRef::End(&end))?;
        // The zstd frame's end, then the last buffered bytes: errors keep the store's own.
        let done = self
            .z
            .do_finish()
            .and_then(|_| self.z.get_mut().flush_buf());
        done.map_err(|e| self.error(e))?;
        let sink = self.z.finish().map_err(|e| {
            Error::Other(format!("cannot write the manifest {}", self.name)).because(e)
        })?;
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
            .map_err(|e| Error::Other("cannot encode the summary".into()).because(e))?;
        self.store.sync()?;
        self.store.put_durable(&self.summary_name, &json)?;
        if let Some(j) = journal {
            j.remove();
        }
        Ok(summary)
    }
}

/// Reads a backup's summary; errors when the backup does not exist or is incomplete.
pub(super) fn read_summary(backup: &Backup) -> Result<BackupSummary> {
    let (stanza, label) = (backup.stanza().name(), backup.label());
    let name = backup.file_name(SUMMARY_OBJECT);
    let bytes = match backup.store().get(&name) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(Error::Repo(format!(
                "backup '{label}' of stanza '{stanza}' does not exist or is incomplete"
            )))
        }
        Err(e) => return Err(e),
    };
    let s: BackupSummary = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Repo(format!("{name} is not valid")).because(e))?;
    let h = &s.header;
    if h.format != REPO_FORMAT && h.format != super::CHAIN_FORMAT {
        return Err(Error::Repo(format!(
            "{name} has format {}, this pgjet reads {REPO_FORMAT} and {}",
            h.format,
            super::CHAIN_FORMAT
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

/// A directory or file line of a manifest being read.
#[derive(Debug)]
pub enum Entry {
    Dir(DirEntry),
    File(FileEntry),
}

/// The decoded lines of a stored manifest, over a reader that hashes the stored bytes.
type Lines =
    BufReader<zstd::stream::read::Decoder<'static, BufReader<HashingSource<Box<dyn Read + Send>>>>>;

/// Reads a backup's manifest as a stream of [`Entry`], one line at a time: memory is one
/// line and the decoder's window, whatever the file count.
///
/// Checks as it goes: the header line matches the summary (format, stanza, label); every
/// line is well formed and passes [`DirEntry::check`] / [`FileEntry::check`]; and at the
/// end, the stored bytes match the summary's size and XXH3-128, and the end line matches
/// the summary and counts what the stream held. A failed check is [`Error::Corrupt`] naming
/// the manifest object; after an error the stream yields nothing more. Whole-manifest
/// checks (unique paths, pg_control, WAL) are [`ManifestChecks`].
pub struct ManifestReader {
    label: String,
    object: String,
    summary: BackupSummary,
    lines: Option<Lines>,
    buf: String,
    line_no: u64,
    dirs: u64,
    files: u64,
    size: u64,
    end: Option<ManifestEnd>,
}

impl ManifestReader {
    /// Reads the summary of backup `label`, opens its manifest and reads the header line.
    ///
    /// Errors: [`Error::Repo`] for a missing or incomplete backup or another format;
    /// [`Error::Corrupt`] for a missing manifest object or a header that does not match.
    pub(super) fn open(backup: &Backup) -> Result<ManifestReader> {
        let (store, label) = (backup.store(), backup.label());
        let summary = read_summary(backup)?;
        let name = backup.file_name(&summary.manifest.object);
        let mut r = ManifestReader {
            label: label.to_string(),
            object: summary.manifest.object.clone(),
            summary,
            lines: None,
            buf: String::new(),
            line_no: 0,
            dirs: 0,
            files: 0,
            size: 0,
            end: None,
        };
        let inner = store.reader(&name).map_err(|e| {
            if e.is_not_found() {
                r.corrupt("missing".into())
            } else {
                e
            }
        })?;
        let src = HashingSource {
            inner,
            hash: Xxh3::new(),
            bytes: 0,
        };
        let z = zstd::stream::read::Decoder::new(src)
            .map_err(|e| r.corrupt(format!("not zstd: {e}")))?;
        r.lines = Some(BufReader::with_capacity(1 << 20, z));
        match r.next_line()? {
            Some(Line::Header(h)) if h == r.summary.header => Ok(r),
            Some(Line::Header(h)) => Err(r.corrupt(format!(
                "the header describes {}/{} in format {}, not what the summary describes",
                h.stanza, h.label, h.format
            ))),
            _ => Err(r.corrupt("the first line is not the header".into())),
        }
    }

    /// The backup's summary (its header and end line, as `summary.json` records them).
    pub fn summary(&self) -> &BackupSummary {
        &self.summary
    }

    fn corrupt(&self, why: String) -> Error {
        Error::Corrupt {
            label: format!("backup {}", self.label),
            files: vec![format!("{} ({why})", self.object)],
        }
    }

    /// The next decoded line, None at the end of the stream.
    fn next_line(&mut self) -> Result<Option<Line>> {
        let Some(lines) = self.lines.as_mut() else {
            return Ok(None);
        };
        self.buf.clear();
        let got = lines.read_line(&mut self.buf);
        let n = self.line_no;
        let got = got.map_err(|e| self.corrupt(format!("unreadable after line {n}: {e}")))?;
        if got == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        let n = self.line_no;
        serde_json::from_str(&self.buf)
            .map(Some)
            .map_err(|e| self.corrupt(format!("line {n} is not valid: {e}")))
    }

    /// The next directory or file; None once the whole stream has been read and checked.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        let r = self.step();
        if r.is_err() {
            self.lines = None;
        }
        r
    }

    fn step(&mut self) -> Result<Option<Entry>> {
        loop {
            if self.lines.is_none() {
                return Ok(None);
            }
            let Some(line) = self.next_line()? else {
                self.complete()?;
                return Ok(None);
            };
            let n = self.line_no;
            if self.end.is_some() {
                return Err(self.corrupt(format!("line {n} follows the end line")));
            }
            match line {
                Line::Dir(d) => {
                    d.check().map_err(|e| self.corrupt(e))?;
                    self.dirs += 1;
                    return Ok(Some(Entry::Dir(d)));
                }
                Line::File(f) => {
                    f.check().map_err(|e| self.corrupt(e))?;
                    // References run only to older backups: a chain has no cycle.
                    if let Some(b) = f
                        .pieces
                        .iter()
                        .filter_map(|p| p.backup.as_ref())
                        .find(|b| **b >= self.label)
                    {
                        return Err(self.corrupt(format!(
                            "{} names backup {b}, which is not older than this one",
                            f.path
                        )));
                    }
                    self.files += 1;
                    self.size += f.size;
                    return Ok(Some(Entry::File(f)));
                }
                Line::End(e) => self.end = Some(e),
                Line::Header(_) => return Err(self.corrupt(format!("line {n} is out of order"))),
            }
        }
    }

    /// At the end of the stream: drains the rest of the stored bytes and checks them and
    /// the end line against the summary.
    fn complete(&mut self) -> Result<()> {
        let Some(lines) = self.lines.take() else {
            return Ok(());
        };
        // Drain what the decoder did not need, so the hash covers every stored byte.
        let mut rest = lines.into_inner().finish();
        std::io::copy(&mut rest, &mut std::io::sink())
            .map_err(|e| self.corrupt(format!("unreadable: {e}")))?;
        let src = rest.into_inner();
        let digest = format!("{:032x}", src.hash.digest128());
        let m = &self.summary.manifest;
        if src.bytes != m.stored_size || digest != m.xxh3 {
            return Err(self.corrupt(format!(
                "{} bytes with XXH3 {digest}, the summary records {} bytes with XXH3 {}",
                src.bytes, m.stored_size, m.xxh3
            )));
        }
        let Some(end) = &self.end else {
            return Err(self.corrupt("truncated: no end line".into()));
        };
        if end != &self.summary.end {
            return Err(self.corrupt("the end line does not match the summary".into()));
        }
        if (end.dirs, end.files, end.size) != (self.dirs, self.files, self.size) {
            return Err(self.corrupt(format!(
                "the end line counts {} directories and {} files of {} bytes, the stream holds {}, {} and {}",
                end.dirs, end.files, end.size, self.dirs, self.files, self.size
            )));
        }
        Ok(())
    }
}

impl ManifestReader {
    /// The file lines only, as a stream (the directories are skipped).
    pub fn files(self) -> impl Iterator<Item = Result<FileEntry>> {
        self.filter_map(|e| match e {
            Ok(Entry::File(f)) => Some(Ok(f)),
            Ok(Entry::Dir(_)) => None,
            Err(e) => Some(Err(e)),
        })
    }
}

impl Iterator for ManifestReader {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        self.next_entry().transpose()
    }
}

/// The checks of [`BackupManifest::validate`] that need the whole manifest, made on a
/// stream of file lines in bounded memory: unique paths (an XXH3-64 per path, 8 bytes
/// each; two paths with one hash are resolved by [`scan_manifest`] from the paths
/// themselves), a pg_control, a file for every WAL segment named. Also notes whether each
/// object's pieces are on consecutive lines, as a backup writes them
/// ([`ScannedManifest::contiguous`]).
#[derive(Default)]
pub struct ManifestChecks {
    paths: HashSet<u64>,
    collided: HashSet<u64>,
    wal: HashSet<String>,
    control: Option<FileEntry>,
    /// Objects of the last file line with pieces.
    open: Vec<u64>,
    closed: HashSet<u64>,
    scattered: bool,
    /// Labels of the older backups the pieces name.
    references: std::collections::BTreeSet<String>,
}

/// A hash of the object a piece names, the backup that holds it included.
fn object_key(p: &super::Piece) -> u64 {
    let mut h = Xxh3::new();
    h.update(p.backup.as_deref().unwrap_or("").as_bytes());
    h.update(b"/");
    h.update(p.object.as_bytes());
    h.digest()
}

impl ManifestChecks {
    /// Takes one file line into account.
    pub fn file(&mut self, f: &FileEntry) {
        let h = xxh3_64(f.path.as_bytes());
        if !self.paths.insert(h) {
            self.collided.insert(h);
        }
        if let Some(seg) = f.path.strip_prefix("pg_wal/") {
            self.wal.insert(seg.to_string());
        }
        if f.path == "global/pg_control" {
            self.control = Some(f.clone());
        }
        if f.pieces.is_empty() {
            return;
        }
        for p in &f.pieces {
            if let Some(b) = &p.backup {
                if !self.references.contains(b) {
                    self.references.insert(b.clone());
                }
            }
        }
        let mut objects: Vec<u64> = f.pieces.iter().map(object_key).collect();
        objects.dedup();
        for o in std::mem::take(&mut self.open) {
            if !objects.contains(&o) {
                self.closed.insert(o);
            }
        }
        self.scattered |= objects.iter().any(|o| self.closed.contains(o));
        self.open = objects;
    }

    /// The whole-manifest verdict: pg_control's line, or what is wrong. `stop`: the end
    /// line's stop information (the WAL segments named).
    fn finish(&mut self, end: &ManifestEnd) -> std::result::Result<FileEntry, String> {
        let stop = &end.stop;
        let named: Vec<&String> = self.references.iter().collect();
        if named != end.references.iter().collect::<Vec<_>>() {
            return Err(format!(
                "the pieces name the backups [{}], the end line lists [{}]",
                named
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                end.references.join(", ")
            ));
        }
        for seg in &stop.wal_segments {
            if !self.wal.contains(seg) {
                return Err(format!("WAL segment {seg} is named but not stored"));
            }
        }
        self.control
            .take()
            .ok_or_else(|| "global/pg_control is missing".to_string())
    }
}

/// What restore and verify need of a manifest before they stream its files
/// ([`scan_manifest`]).
#[derive(Debug)]
pub struct ScannedManifest {
    /// Header and end line.
    pub summary: BackupSummary,
    pub directories: Vec<DirEntry>,
    /// The line of global/pg_control (restore writes it last).
    pub control: FileEntry,
    /// Each object's pieces are on consecutive file lines: a reader that groups the pieces
    /// of consecutive lines by object sees each object once, whole, and can check its
    /// size (at least the frames named). True for every manifest a backup writes.
    pub contiguous: bool,
}

/// Reads a backup's manifest once through, checking everything ([`ManifestReader`],
/// [`ManifestChecks`]), and keeps only the directories and pg_control: restore and verify
/// then stream the files with a second [`ManifestReader`], in memory independent of the
/// file count (about 10 bytes per file for the checks of this pass).
///
/// Errors: as [`ManifestReader`]; [`Error::Corrupt`] for a path listed twice, no
/// pg_control, a WAL segment named but not stored.
pub(super) fn scan_manifest(backup: &Backup) -> Result<ScannedManifest> {
    let mut r = ManifestReader::open(backup)?;
    let mut checks = ManifestChecks::default();
    let mut directories = Vec::new();
    for e in &mut r {
        match e? {
            Entry::Dir(d) => directories.push(d),
            Entry::File(f) => checks.file(&f),
        }
    }
    let summary = r.summary.clone();
    let corrupt = |why: String| r.corrupt(why);
    let control = checks.finish(&summary.end).map_err(corrupt)?;
    if !checks.collided.is_empty() {
        // Two paths with one XXH3-64: compare the paths themselves (almost never runs).
        let mut seen: HashSet<String> = HashSet::new();
        for e in ManifestReader::open(backup)? {
            if let Entry::File(f) = e? {
                if checks.collided.contains(&xxh3_64(f.path.as_bytes()))
                    && !seen.insert(f.path.clone())
                {
                    return Err(corrupt(format!("file {} is listed twice", f.path)));
                }
            }
        }
    }
    Ok(ScannedManifest {
        summary,
        directories,
        control,
        contiguous: !checks.scattered,
    })
}

/// Reads a backup's manifest whole into memory ([`ManifestReader`]) and validates it
/// ([`BackupManifest::validate`]). About 1.2 KiB per file: for the commands that need every
/// line at once (a delta restore); restore and verify stream ([`scan_manifest`]).
///
/// Errors: as [`ManifestReader`]; [`Error::Corrupt`] when validation fails.
pub(super) fn read_manifest(backup: &Backup) -> Result<BackupManifest> {
    let mut r = ManifestReader::open(backup)?;
    let (mut directories, mut files) = (Vec::new(), Vec::new());
    for e in &mut r {
        match e? {
            Entry::Dir(d) => directories.push(d),
            Entry::File(f) => files.push(f),
        }
    }
    let s = r.summary.clone();
    let m = BackupManifest {
        header: s.header,
        stop: s.end.stop,
        size: s.end.size,
        stored_size: s.end.stored_size,
        directories,
        files,
    };
    m.validate().map_err(|e| r.corrupt(e))?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::posix::PosixStorage;

    fn store() -> (tempfile::TempDir, super::super::Stanza) {
        let dir = tempfile::tempdir().unwrap();
        let s = PosixStorage::open(dir.path()).unwrap();
        let m = super::super::manifest::tests::sample();
        (
            dir,
            super::super::Stanza::new(1, Arc::new(s), &m.header.stanza),
        )
    }

    #[test]
    fn a_manifest_round_trips_and_its_summary_marks_it_complete() {
        let (_d, st) = store();
        let b = st.backup(&super::super::manifest::tests::sample().header.label);
        let m = super::super::manifest::tests::sample();
        assert!(b.summary().is_err());
        let s = b.write_manifest(&m).unwrap();
        let sum: u64 = m.files.iter().map(|f| f.size).sum();
        assert_eq!((s.end.files, s.end.size), (m.files.len() as u64, sum));
        let back = b.manifest().unwrap();
        assert_eq!(back.files, m.files);
        assert_eq!(back.directories, m.directories);
        assert_eq!(back.stop, m.stop);
        assert_eq!(back.header, m.header);
        assert_eq!(b.summary().unwrap().manifest, s.manifest);
    }

    #[test]
    fn a_damaged_or_truncated_manifest_is_named() {
        let (d, st) = store();
        let b = st.backup(&super::super::manifest::tests::sample().header.label);
        let m = super::super::manifest::tests::sample();
        b.write_manifest(&m).unwrap();
        let path = d.path().join(b.file_name(MANIFEST_OBJECT));
        let good = std::fs::read(&path).unwrap();
        // A flipped byte: the stored bytes no longer match the summary.
        let mut bad = good.clone();
        let i = bad.len() / 2;
        bad[i] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let e = b.manifest().unwrap_err().to_string();
        assert!(e.contains(MANIFEST_OBJECT), "{e}");
        // Truncated.
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        let e = b.manifest().unwrap_err().to_string();
        assert!(e.contains(MANIFEST_OBJECT), "{e}");
        // Missing.
        std::fs::remove_file(&path).unwrap();
        let e = b.manifest().unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    }

    #[test]
    fn the_scan_checks_the_whole_and_notes_scattered_objects() {
        let (_d, st) = store();
        let b = st.backup(&super::super::manifest::tests::sample().header.label);
        let mut m = super::super::manifest::tests::sample();
        b.write_manifest(&m).unwrap();
        let scan = b.scan().unwrap();
        assert!(scan.contiguous);
        assert_eq!(scan.control.path, "global/pg_control");
        assert_eq!(scan.directories, m.directories);
        // Object 000001 on lines 1 and 3, another object between them.
        m.files[1].pieces[0].object = "000002".into();
        m.files[1].pieces[1].object = "000002".into();
        m.files.push(FileEntry {
            path: "base/1/3".into(),
            ..m.files[0].clone()
        });
        b.write_manifest(&m).unwrap();
        assert!(!b.scan().unwrap().contiguous);
        // A path listed twice is refused by the scan, as by the whole-manifest check.
        m.files[3].path = "base/1/2".into();
        b.write_manifest(&m).unwrap();
        let e = b.scan().unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
        let e = b.manifest().unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
    }
}
