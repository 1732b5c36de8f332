//! The `BASE_BACKUP` stream: the command, and the decoder of what the server sends back
//! (PostgreSQL 15+; see src/backend/backup/basebackup.c, basebackup_copy.c and
//! src/bin/pg_basebackup/pg_basebackup.c, which reads the same stream).
//!
//! What the server sends for `BASE_BACKUP ( ... )`:
//! 1. a result set with the start LSN and timeline (`recptr` text, `tli` int8);
//! 2. a result set listing the tablespaces (`spcoid`, `spclocation`, `size` in KiB; the
//!    main data directory is the row with NULL oid and location, last);
//! 3. CopyOutResponse, then one COPY stream of CopyData messages whose first byte says what
//!    they hold: `n` a new archive (archive name and tablespace path, NUL-terminated), `d`
//!    archive or manifest bytes, `p` progress (int64 bytes done), `m` the manifest follows;
//!    one tar archive per tablespace, the main one (`base.tar`) last, each compressed as a
//!    whole when COMPRESSION was asked for (the manifest never is);
//! 4. CopyDone, then a result set with the end LSN and timeline, CommandComplete and
//!    ReadyForQuery.
//!
//! [`decode_copy_stream`] turns the COPY stream into tar entries for a [`StreamSink`]:
//! decompression (gzip, lz4 frames, zstd) and tar parsing run on the calling thread; the
//! sink decides where the bytes go (and may spread the writing over threads). `backup_label`,
//! `tablespace_map` and `global/pg_control` are held back (returned, never given to the
//! sink) so the caller's one finish writes them, pg_control last. Every file's size and
//! CRC-32C is recorded for [`check_manifest`], which compares them with the server's
//! backup_manifest. Nothing the server sends can make the decoder panic or write outside the
//! archive's root: a malformed stream, a path with `..`, a short or corrupt archive is an
//! error.
use crate::error::{Error, Result};
use crate::pg::lsn::Lsn;
use crate::remote::replication::{parse_data_row, ReplConn, Rows};
use std::io::Read;

/// Compression the server applies to each archive (`COMPRESSION` of BASE_BACKUP; lz4 and
/// zstd need a server built with them, gzip is always there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireCodec {
    None,
    Gzip,
    Lz4,
    Zstd,
}

impl WireCodec {
    /// The name BASE_BACKUP and pg_basebackup use.
    pub fn name(self) -> &'static str {
        match self {
            WireCodec::None => "none",
            WireCodec::Gzip => "gzip",
            WireCodec::Lz4 => "lz4",
            WireCodec::Zstd => "zstd",
        }
    }
}

/// What to ask of `BASE_BACKUP`.
#[derive(Debug, Clone)]
pub struct BaseBackupCommand {
    /// LABEL (shows in backup_label).
    pub label: String,
    /// CHECKPOINT 'fast' instead of 'spread'.
    pub fast: bool,
    /// WAL: put the WAL from the start to the end LSN in the main archive (under pg_wal/).
    pub wal: bool,
    /// MAX_RATE, bytes per second (the server takes KiB/s, 32 to 1048576); None: no limit.
    pub max_rate: Option<u64>,
    pub codec: WireCodec,
    /// Compression level; None: the server's default.
    pub level: Option<i32>,
    /// zstd worker threads on the server (ZSTD_c_nbWorkers, basebackup_zstd.c); None or 0:
    /// none, the backend compresses.
    pub workers: Option<u32>,
    /// TABLESPACE_MAP: send tablespace_map (and no `pg_tblspc/<oid>` links); without it the
    /// links come as symbolic links in the main archive.
    pub tablespace_map: bool,
    /// INCREMENTAL (PostgreSQL 17+): relation files as `INCREMENTAL.` files against the
    /// manifest sent before on the same connection (`ReplConn::upload_manifest`).
    pub incremental: bool,
}

impl BaseBackupCommand {
    /// The command text (PostgreSQL 15+ option syntax, src/backend/replication/repl_gram.y
    /// and the options parsed by parse_basebackup_options in basebackup.c): always PROGRESS,
    /// WAIT false (the caller's slot keeps the WAL), MANIFEST 'yes' with CRC32C checksums.
    pub fn sql(&self) -> String {
        let mut o = vec![
            format!("LABEL {}", quote(&self.label)),
            "PROGRESS".to_string(),
            format!("CHECKPOINT '{}'", if self.fast { "fast" } else { "spread" }),
            format!("WAL {}", self.wal),
            "WAIT false".to_string(),
            "MANIFEST 'yes'".to_string(),
            "MANIFEST_CHECKSUMS 'CRC32C'".to_string(),
        ];
        if self.tablespace_map {
            o.push("TABLESPACE_MAP".to_string());
        }
        if self.incremental {
            o.push("INCREMENTAL".to_string());
        }
        if let Some(r) = self.max_rate {
            // basebackup.c: MAX_RATE in kB/s, MAX_RATE_LOWER 32 .. MAX_RATE_UPPER 1048576.
            o.push(format!("MAX_RATE {}", (r / 1024).clamp(32, 1_048_576)));
        }
        if self.codec != WireCodec::None {
            o.push(format!("COMPRESSION '{}'", self.codec.name()));
            let mut detail = Vec::new();
            if let Some(l) = self.level {
                detail.push(format!("level={l}"));
            }
            if let (WireCodec::Zstd, Some(w @ 1..)) = (self.codec, self.workers) {
                detail.push(format!("workers={w}"));
            }
            if !detail.is_empty() {
                o.push(format!("COMPRESSION_DETAIL '{}'", detail.join(",")));
            }
        }
        format!("BASE_BACKUP ( {} )", o.join(", "))
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The payloads of a COPY OUT stream, one CopyData message at a time.
pub trait CopyMessages {
    /// The next CopyData payload; None at CopyDone. Errors: the connection failed, or the
    /// server sent an ErrorResponse.
    fn next_copy_data(&mut self) -> Result<Option<Vec<u8>>>;
}

/// A canned stream (tests, and replaying a stream kept in memory).
impl CopyMessages for std::vec::IntoIter<Vec<u8>> {
    fn next_copy_data(&mut self) -> Result<Option<Vec<u8>>> {
        Ok(self.next())
    }
}

pub use crate::transfer::stream_units::{StreamSink, StreamStart};

/// A file held back from the sink (backup_label, tablespace_map, global/pg_control).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldFile {
    pub bytes: Vec<u8>,
    pub mode: u32,
    pub mtime: i64,
}

/// The files received, in the manifest's terms (paths relative to the data directory,
/// `pg_tblspc/<oid>/...` for a tablespace's files), kept small for a million files: per
/// file the XXH3-64 of its path, its size and CRC-32C (24 bytes), and the paths under
/// `pg_wal/` whole (a backup names its WAL segments).
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// (path hash, size in bytes, CRC-32C, under pg_wal/), in arrival order.
    entries: Vec<(u64, u64, u32, bool)>,
    /// Paths of the files under pg_wal/, in arrival order.
    pub wal: Vec<String>,
}

impl Received {
    /// Records a file.
    pub fn add(&mut self, path: &str, size: u64, crc32c: u32) {
        let wal = path.starts_with("pg_wal/");
        if wal {
            self.wal.push(path.to_string());
        }
        self.entries.push((
            xxhash_rust::xxh3::xxh3_64(path.as_bytes()),
            size,
            crc32c,
            wal,
        ));
    }

    /// Files recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The server's backup_manifest, spooled to an unnamed temporary file as it arrives (a
/// cluster of a million files has a manifest of about 150 MB).
#[derive(Debug)]
pub struct SpooledManifest {
    file: std::fs::File,
    /// Bytes received.
    pub len: u64,
}

impl SpooledManifest {
    /// An empty manifest in the system's temporary directory ($TMPDIR, else /tmp).
    /// Errors: the file cannot be made.
    pub fn new() -> Result<SpooledManifest> {
        let file = tempfile::tempfile()
            .map_err(|e| Error::io("create a temporary file in", std::env::temp_dir(), e))?;
        Ok(SpooledManifest { file, len: 0 })
    }

    /// Appends bytes.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        self.file
            .write_all(bytes)
            .map_err(|e| Error::io("write the spooled manifest in", std::env::temp_dir(), e))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// A reader from the first byte (a handle of its own; one reader at a time).
    pub fn reader(&self) -> Result<std::io::BufReader<std::fs::File>> {
        use std::io::Seek;
        let io = |e| Error::io("read the spooled manifest in", std::env::temp_dir(), e);
        let mut f = self.file.try_clone().map_err(io)?;
        f.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
        Ok(std::io::BufReader::with_capacity(1 << 20, f))
    }

    /// The whole manifest in memory (tests, small manifests).
    pub fn bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(self.len as usize);
        self.reader()?
            .read_to_end(&mut v)
            .map_err(|e| Error::io("read the spooled manifest in", std::env::temp_dir(), e))?;
        Ok(v)
    }

    /// Writes it to `path` with permission bits `mode`, durably ([`crate::io::fs`]).
    pub fn write_to(&self, path: &std::path::Path, mode: u32) -> Result<()> {
        let mut r = self.reader()?;
        crate::io::fs::write_from(path, &mut r, mode)
    }
}

/// What [`decode_copy_stream`] got.
#[derive(Debug, Default)]
pub struct Decoded {
    pub backup_label: Option<HeldFile>,
    pub tablespace_map: Option<HeldFile>,
    pub control: Option<HeldFile>,
    /// The server's backup_manifest, as sent (None when the stream ended before it).
    pub manifest: Option<SpooledManifest>,
    /// Every file received, the held-back ones included.
    pub received: Received,
    /// Bytes of CopyData payload received (what crossed the wire, before TLS).
    pub wire_bytes: u64,
    /// Bytes of file content decoded.
    pub logical_bytes: u64,
    /// Archives decoded, by name.
    pub archives: Vec<String>,
}

/// Largest file held in memory (backup_label, tablespace_map, pg_control): 16 MiB; a
/// tablespace_map of many tablespaces stays far below it.
pub const MAX_HELD: u64 = 16 << 20;

/// Bytes read from the decompressor at a time for a file's content.
const FILE_CHUNK: usize = 256 << 10;

/// An [`Error::Protocol`] of the stream's contents (the decoder sees no connection).
fn stream_protocol(detail: impl Into<String>) -> Error {
    Error::Protocol {
        target: "the BASE_BACKUP stream".into(),
        detail: detail.into(),
    }
}

fn corrupt(what: &str, detail: String) -> Error {
    Error::Corrupt {
        label: format!("BASE_BACKUP stream ({what})"),
        files: vec![detail],
    }
}

/// What ended an archive's bytes.
enum Next {
    Archive(Vec<u8>),
    Manifest,
    End,
}

/// The bytes of one archive, as a reader over the CopyData messages: it ends (reads 0) at
/// the next `n` or `m` message or at CopyDone, which it keeps in `next`.
struct ArchiveReader<'a, M: CopyMessages + ?Sized> {
    msgs: &'a mut M,
    cur: Vec<u8>,
    pos: usize,
    next: Option<Next>,
    /// The first error of the message source, kept whole (Read can only return io errors).
    failed: Option<Error>,
    wire: &'a mut u64,
    sink_progress: Vec<u64>,
}

impl<M: CopyMessages + ?Sized> Read for ArchiveReader<'_, M> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.pos < self.cur.len() {
                let n = buf.len().min(self.cur.len() - self.pos);
                buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.next.is_some() || self.failed.is_some() {
                return Ok(0);
            }
            match self.msgs.next_copy_data() {
                Err(e) => {
                    let m = e.to_string();
                    self.failed = Some(e);
                    return Err(std::io::Error::other(m));
                }
                Ok(None) => self.next = Some(Next::End),
                Ok(Some(m)) => {
                    *self.wire += m.len() as u64;
                    match m.first() {
                        Some(b'd') => {
                            self.cur = m;
                            self.pos = 1;
                        }
                        Some(b'p') => {
                            if let Some(b) = m.get(1..9) {
                                let mut a = [0u8; 8];
                                a.copy_from_slice(b);
                                self.sink_progress.push(u64::from_be_bytes(a));
                            }
                        }
                        Some(b'n') => self.next = Some(Next::Archive(m)),
                        Some(b'm') => self.next = Some(Next::Manifest),
                        other => {
                            let e = stream_protocol(format!(
                                "unknown CopyData message type {:?}",
                                other.map(|b| b.escape_ascii().to_string())
                            ));
                            let s = e.to_string();
                            self.failed = Some(e);
                            return Err(std::io::Error::other(s));
                        }
                    }
                }
            }
        }
    }
}

/// Splits a `n` message: archive name and tablespace path (NUL-terminated strings).
fn parse_new_archive(m: &[u8]) -> Result<(String, String)> {
    let body = m.get(1..).unwrap_or(&[]);
    let mut parts = body.split(|&b| b == 0);
    let name = parts.next().unwrap_or(&[]);
    let path = parts
        .next()
        .ok_or_else(|| stream_protocol("a malformed new-archive message"))?;
    Ok((
        String::from_utf8_lossy(name).into_owned(),
        String::from_utf8_lossy(path).into_owned(),
    ))
}

/// Decodes a whole COPY stream (from the first `n` message to CopyDone) into `sink`.
/// `tablespaces`: (OID, location) as the server listed them, to tell which tablespace an
/// archive holds (its `n` message carries the location; the archive name `<oid>.tar...` is
/// the fallback).
///
/// Errors: [`Error::Corrupt`] for a malformed, short or corrupt archive (naming the
/// archive and the entry); the message source's and the sink's errors.
pub fn decode_copy_stream<M: CopyMessages + ?Sized>(
    msgs: &mut M,
    codec: WireCodec,
    tablespaces: &[(u32, String)],
    sink: &mut dyn StreamSink,
) -> Result<Decoded> {
    let mut out = Decoded::default();
    let mut wire = 0u64;
    let first = msgs.next_copy_data()?;
    let mut next = match first {
        None => Next::End,
        Some(m) => {
            wire += m.len() as u64;
            match m.first() {
                Some(b'n') => Next::Archive(m),
                Some(b'm') => Next::Manifest,
                _ => return Err(stream_protocol("data before the first archive")),
            }
        }
    };
    loop {
        match next {
            Next::End => break,
            Next::Manifest => {
                loop {
                    match msgs.next_copy_data()? {
                        None => break,
                        Some(m) => {
                            wire += m.len() as u64;
                            match m.first() {
                                Some(b'd') => {
                                    if out.manifest.is_none() {
                                        out.manifest = Some(SpooledManifest::new()?);
                                    }
                                    if let Some(sm) = out.manifest.as_mut() {
                                        sm.append(&m[1..])?;
                                    }
                                }
                                Some(b'p') => {}
                                _ => {
                                    return Err(stream_protocol(
                                        "an unexpected message after the manifest",
                                    ))
                                }
                            }
                        }
                    }
                }
                break;
            }
            Next::Archive(m) => {
                let (name, path) = parse_new_archive(&m)?;
                let oid = if path.is_empty() {
                    None
                } else {
                    let from_list = tablespaces.iter().find(|(_, l)| *l == path).map(|t| t.0);
                    let from_name = name.split('.').next().and_then(|s| s.parse().ok());
                    Some(from_list.or(from_name).ok_or_else(|| {
                        stream_protocol(format!(
                            "archive {name} for tablespace {path}, which the server did not list"
                        ))
                    })?)
                };
                sink.begin_archive(&name, oid)?;
                let mut reader = ArchiveReader {
                    msgs: &mut *msgs,
                    cur: Vec::new(),
                    pos: 0,
                    next: None,
                    failed: None,
                    wire: &mut wire,
                    sink_progress: Vec::new(),
                };
                let r = read_archive(&mut reader, codec, &name, oid, sink, &mut out);
                if let Some(e) = reader.failed.take() {
                    return Err(e);
                }
                r?;
                // The decompressor has reached the end of its stream; nothing may follow it
                // before the next archive (this also reads up to that next message).
                let mut extra = 0usize;
                let mut rest = [0u8; 8192];
                loop {
                    match reader.read(&mut rest) {
                        Ok(0) => break,
                        Ok(n) => extra += n,
                        Err(_) => break,
                    }
                }
                if let Some(e) = reader.failed.take() {
                    return Err(e);
                }
                if extra > 0 {
                    return Err(corrupt(
                        &name,
                        format!("{name}: {extra} bytes after the end of the compressed archive"),
                    ));
                }
                for p in reader.sink_progress.drain(..) {
                    sink.progress(p);
                }
                out.archives.push(name);
                next = reader.next.take().unwrap_or(Next::End);
            }
        }
    }
    out.wire_bytes = wire;
    Ok(out)
}

/// One archive through its decompressor and the tar reader.
fn read_archive<M: CopyMessages + ?Sized>(
    reader: &mut ArchiveReader<'_, M>,
    codec: WireCodec,
    name: &str,
    oid: Option<u32>,
    sink: &mut dyn StreamSink,
    out: &mut Decoded,
) -> Result<()> {
    let io_err = |e: std::io::Error| {
        corrupt(
            name,
            format!("{name}: cannot decode the {} stream: {e}", codec.name()),
        )
    };
    match codec {
        WireCodec::None => read_tar(reader, name, oid, sink, out),
        WireCodec::Gzip => read_tar(
            &mut flate2::read::MultiGzDecoder::new(reader),
            name,
            oid,
            sink,
            out,
        ),
        WireCodec::Lz4 => read_tar(
            &mut lz4_flex::frame::FrameDecoder::new(reader),
            name,
            oid,
            sink,
            out,
        ),
        WireCodec::Zstd => {
            let mut d = zstd::stream::read::Decoder::new(reader).map_err(io_err)?;
            read_tar(&mut d, name, oid, sink, out)
        }
    }
}

/// Reads exactly `buf.len()` bytes; Ok(false) when the stream ended before the first byte.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A tar number: octal digits (NUL/space padded), or base-256 when the high bit of the
/// first byte is set (what PostgreSQL's print_tar_number writes for large values, see
/// src/port/tar.c).
fn tar_number(f: &[u8]) -> Option<u64> {
    if f.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = (f[0] & 0x7f) as u64;
        for &b in &f[1..] {
            v = v.checked_mul(256)?.checked_add(b as u64)?;
        }
        return Some(v);
    }
    let s: Vec<u8> = f
        .iter()
        .copied()
        .skip_while(|b| *b == b' ')
        .take_while(|b| *b != 0 && *b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(std::str::from_utf8(&s).ok()?, 8).ok()
}

fn tar_string(f: &[u8]) -> &[u8] {
    &f[..f.iter().position(|&b| b == 0).unwrap_or(f.len())]
}

/// A path from an archive, checked: relative, no `..`, `.` or empty component.
fn safe_path(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?;
    let s = s.trim_end_matches('/');
    let s = s.strip_prefix("./").unwrap_or(s);
    if s.is_empty() || s.starts_with('/') {
        return None;
    }
    if s.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return None;
    }
    Some(s.to_string())
}

/// Parses one tar archive (ustar, as src/port/tar.c writes it) from `r` into `sink`.
fn read_tar(
    r: &mut dyn Read,
    name: &str,
    oid: Option<u32>,
    sink: &mut dyn StreamSink,
    out: &mut Decoded,
) -> Result<()> {
    let bad = |d: String| corrupt(name, format!("{name}: {d}"));
    let short = |e: std::io::Error, at: &str| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            bad(format!("the archive ends early, in {at}"))
        } else {
            bad(format!("cannot decode the archive ({at}): {e}"))
        }
    };
    let prefix = oid.map(|o| format!("pg_tblspc/{o}/")).unwrap_or_default();
    let mut h = [0u8; 512];
    let mut buf = vec![0u8; FILE_CHUNK];
    let mut last = String::from("its first header");
    loop {
        match fill(r, &mut h) {
            Ok(true) => {}
            Ok(false) => {
                return Err(bad(format!(
                    "the archive ends before its end-of-archive marker (after {last})"
                )))
            }
            Err(e) => return Err(short(e, &format!("the header after {last}"))),
        }
        if h.iter().all(|&b| b == 0) {
            break;
        }
        // The header checksum: the sum of its bytes with the checksum field as spaces.
        let stored = tar_number(&h[148..156]);
        let sum: u64 = h
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    b as u64
                }
            })
            .sum();
        if stored != Some(sum) {
            return Err(bad(format!("a damaged tar header after {last}")));
        }
        let mut raw_name = tar_string(&h[0..100]).to_vec();
        if &h[257..262] == b"ustar" {
            let pre = tar_string(&h[345..500]);
            if !pre.is_empty() {
                let mut p = pre.to_vec();
                p.push(b'/');
                p.extend_from_slice(&raw_name);
                raw_name = p;
            }
        }
        let path = safe_path(&raw_name).ok_or_else(|| {
            bad(format!(
                "an entry with an unsafe or invalid path '{}'",
                String::from_utf8_lossy(&raw_name)
            ))
        })?;
        let mode = tar_number(&h[100..108]).unwrap_or(0) as u32 & 0o7777;
        let size =
            tar_number(&h[124..136]).ok_or_else(|| bad(format!("{path}: an invalid size")))?;
        let mtime = tar_number(&h[136..148]).unwrap_or(0) as i64;
        match h[156] {
            b'5' => sink.directory(&path, mode)?,
            b'2' => {
                let target = String::from_utf8_lossy(tar_string(&h[157..257])).into_owned();
                sink.symlink(&path, &target)?;
            }
            b'0' | 0 => {
                let held = oid.is_none()
                    && matches!(
                        path.as_str(),
                        "backup_label" | "tablespace_map" | "global/pg_control"
                    );
                if held && size > MAX_HELD {
                    return Err(bad(format!("{path} of {size} bytes")));
                }
                let mut held_bytes = Vec::new();
                if !held {
                    sink.file_begin(&path, size, mode, mtime)?;
                }
                let mut crc = 0u32;
                let mut left = size;
                while left > 0 {
                    let n = left.min(FILE_CHUNK as u64) as usize;
                    r.read_exact(&mut buf[..n]).map_err(|e| short(e, &path))?;
                    crc = crc32c::crc32c_append(crc, &buf[..n]);
                    if held {
                        held_bytes.extend_from_slice(&buf[..n]);
                    } else {
                        sink.file_data(&buf[..n])?;
                    }
                    left -= n as u64;
                }
                let pad = ((512 - size % 512) % 512) as usize;
                if pad > 0 {
                    r.read_exact(&mut buf[..pad]).map_err(|e| short(e, &path))?;
                }
                if held {
                    let f = HeldFile {
                        bytes: held_bytes,
                        mode,
                        mtime,
                    };
                    match path.as_str() {
                        "backup_label" => out.backup_label = Some(f),
                        "tablespace_map" => out.tablespace_map = Some(f),
                        _ => out.control = Some(f),
                    }
                } else {
                    sink.file_end()?;
                }
                out.logical_bytes += size;
                out.received.add(&format!("{prefix}{path}"), size, crc);
            }
            t => {
                return Err(bad(format!(
                    "{path}: tar entry type '{}' is not one PostgreSQL sends",
                    t.escape_ascii()
                )))
            }
        }
        last = path;
    }
    // After the end-of-archive marker only zero blocks may follow, up to the end.
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if buf[..n].iter().any(|&b| b != 0) {
                    return Err(bad("data after the end-of-archive marker".into()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(short(e, "the end of the archive")),
        }
    }
}

/// The COPY stream of a [`ReplConn`]: CopyData payloads until CopyDone.
struct ConnCopy<'a> {
    conn: &'a mut ReplConn,
}

impl CopyMessages for ConnCopy<'_> {
    fn next_copy_data(&mut self) -> Result<Option<Vec<u8>>> {
        crate::io::cancel::check()?;
        let m = self.conn.read_message()?;
        match m.tag {
            b'd' => Ok(Some(m.body)),
            b'c' => Ok(None),
            b'E' => Err(self.conn.server_error(&m.body)),
            t => Err(self.conn.protocol(format!(
                "unexpected message '{}' in the BASE_BACKUP stream",
                t.escape_ascii()
            ))),
        }
    }
}

/// What a whole `BASE_BACKUP` run gave.
#[derive(Debug)]
pub struct StreamOutcome {
    /// Start LSN and timeline (the first result set).
    pub start_lsn: Lsn,
    pub start_tli: u32,
    /// End LSN and timeline (the result set after CopyDone).
    pub end_lsn: Lsn,
    pub end_tli: u32,
    /// The tablespaces the server listed: (OID, location, size in KiB); the main data
    /// directory is not in it.
    pub tablespaces: Vec<(u32, String, Option<u64>)>,
    /// Total size the server announced for the backup, bytes (the sum of the list's sizes).
    pub total_bytes: u64,
    pub decoded: Decoded,
}

/// Reads the rows of result sets until `stop` (a message type) arrives; returns the result
/// sets' rows, one Vec per RowDescription. Errors: an ErrorResponse.
fn result_sets(conn: &mut ReplConn, stop: u8) -> Result<Vec<Rows>> {
    let mut sets: Vec<Rows> = Vec::new();
    loop {
        let m = conn.read_message()?;
        match m.tag {
            b'T' => sets.push(Vec::new()),
            b'D' => {
                let row = parse_data_row(&m.body)?;
                match sets.last_mut() {
                    Some(s) => s.push(row),
                    None => sets.push(vec![row]),
                }
            }
            b'C' => {}
            b'E' => {
                let e = conn.server_error(&m.body);
                // The server ends the command with ReadyForQuery; the caller drops the
                // connection anyway.
                return Err(e);
            }
            t if t == stop => return Ok(sets),
            t => {
                return Err(conn.protocol(format!(
                    "unexpected message '{}' before the BASE_BACKUP stream",
                    t.escape_ascii()
                )))
            }
        }
    }
}

fn lsn_tli(conn: &ReplConn, rows: Option<&Rows>, what: &str) -> Result<(Lsn, u32)> {
    let r = rows
        .and_then(|r| r.first())
        .ok_or_else(|| conn.protocol(format!("BASE_BACKUP sent no {what} position")))?;
    let lsn = r
        .first()
        .cloned()
        .flatten()
        .and_then(|s| s.parse::<Lsn>().ok())
        .ok_or_else(|| conn.protocol(format!("BASE_BACKUP sent an invalid {what} LSN")))?;
    let tli = r
        .get(1)
        .cloned()
        .flatten()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((lsn, tli))
}

/// Runs `BASE_BACKUP` on `conn` and decodes its stream into `sink`
/// ([`decode_copy_stream`]); the caller checks the files against the manifest
/// ([`check_manifest`]) before it declares anything complete.
///
/// Errors: the server's refusal (e.g. an unknown compression method: "this build does not
/// support compression with lz4"), a broken connection, [`Error::Corrupt`] for a bad stream.
pub fn run_stream(
    conn: &mut ReplConn,
    cmd: &BaseBackupCommand,
    sink: &mut dyn StreamSink,
) -> Result<StreamOutcome> {
    let sql = cmd.sql();
    tracing::debug!("{}: {sql}", conn.describe());
    conn.send_query(&sql)?;
    let sets = result_sets(conn, b'H')?;
    let (start_lsn, start_tli) = lsn_tli(conn, sets.first(), "start")?;
    let mut tablespaces = Vec::new();
    let mut total_bytes = 0u64;
    for r in sets.get(1).into_iter().flatten() {
        let kib: Option<u64> = r.get(2).cloned().flatten().and_then(|s| s.parse().ok());
        total_bytes += kib.unwrap_or(0) * 1024;
        let oid = r.first().cloned().flatten().and_then(|s| s.parse().ok());
        if let (Some(oid), Some(loc)) = (oid, r.get(1).cloned().flatten()) {
            tablespaces.push((oid, loc, kib));
        }
    }
    let locs: Vec<(u32, String)> = tablespaces
        .iter()
        .map(|(o, l, _)| (*o, l.clone()))
        .collect();
    sink.started(&StreamStart {
        start_lsn,
        timeline: start_tli,
        total_bytes,
        tablespaces: locs.clone(),
    })?;
    let decoded = decode_copy_stream(&mut ConnCopy { conn }, cmd.codec, &locs, sink)?;
    let sets = result_sets(conn, b'Z')?;
    let (end_lsn, end_tli) = lsn_tli(conn, sets.first(), "end")?;
    Ok(StreamOutcome {
        start_lsn,
        start_tli,
        end_lsn,
        end_tli,
        tablespaces,
        total_bytes,
        decoded,
    })
}

/// Compares what was received with the server's manifest, read line by line: every file of
/// the manifest must have arrived with its size and CRC-32C, and every file that arrived
/// must be in it (files under `pg_wal/` other than those the manifest lists are the WAL the
/// stream added, which a manifest never lists). Memory: the received list (24 bytes per
/// file) and a mark per file.
///
/// Errors: [`Error::Corrupt`] naming each missing or different file and counting the
/// unexpected ones; a missing manifest.
pub fn check_manifest(
    received: &Received,
    manifest: Option<&SpooledManifest>,
    what: &str,
) -> Result<()> {
    let manifest = manifest.ok_or_else(|| Error::Corrupt {
        label: what.to_string(),
        files: vec!["backup_manifest (the stream ended before it)".into()],
    })?;
    check_manifest_from(received, &mut manifest.reader()?, what)
}

/// [`check_manifest`] over any reader of the manifest.
pub fn check_manifest_from(
    received: &Received,
    manifest: &mut dyn std::io::BufRead,
    what: &str,
) -> Result<()> {
    // Sorted by path hash, with each entry's place in arrival order for the marks.
    let mut order: Vec<u32> = (0..received.entries.len() as u32).collect();
    order.sort_unstable_by_key(|&i| received.entries[i as usize].0);
    let mut seen = vec![false; received.entries.len()];
    let mut damaged = Vec::new();
    crate::pg::pg_manifest::read_manifest_lines(manifest, &mut |e| {
        let h = xxhash_rust::xxh3::xxh3_64(e.path.as_bytes());
        let start = order.partition_point(|&i| received.entries[i as usize].0 < h);
        let candidates: Vec<u32> = order[start..]
            .iter()
            .copied()
            .take_while(|&i| received.entries[i as usize].0 == h)
            .filter(|&i| !seen[i as usize])
            .collect();
        let fits = |i: &u32| {
            let (_, size, crc, _) = received.entries[*i as usize];
            size == e.size && e.crc32c.is_none_or(|c| c == crc)
        };
        match (candidates.iter().find(|i| fits(i)), candidates.first()) {
            (Some(&i), _) => seen[i as usize] = true,
            (None, None) => damaged.push(format!("{} (missing from the stream)", e.path)),
            (None, Some(&i)) => {
                seen[i as usize] = true;
                let (_, size, crc, _) = received.entries[i as usize];
                damaged.push(if size != e.size {
                    format!(
                        "{} (size {size} where the manifest says {})",
                        e.path, e.size
                    )
                } else {
                    format!(
                        "{} (CRC-32C {crc:08x} where the manifest says {:08x})",
                        e.path,
                        e.crc32c.unwrap_or_default()
                    )
                });
            }
        }
        Ok(())
    })?;
    let extra = received
        .entries
        .iter()
        .zip(&seen)
        .filter(|(e, seen)| !**seen && !e.3)
        .count();
    if extra > 0 {
        damaged.push(format!(
            "{extra} file(s) in the stream that the manifest does not list"
        ));
    }
    if damaged.is_empty() {
        return Ok(());
    }
    for d in &damaged {
        tracing::error!("{what}: {d}");
    }
    Err(Error::Corrupt {
        label: what.to_string(),
        files: damaged,
    })
}

#[cfg(test)]
mod tests;
