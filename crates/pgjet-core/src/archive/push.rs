//! `archive-push`: archive one WAL file into every configured repository, for PostgreSQL's
//! `archive_command = 'pgjet --stanza=NAME archive-push %p'`.
//!
//! The file is read once, checked against the stanza (a segment's long page header carries
//! the system identifier, the segment size and the WAL format's magic number), compressed
//! and stored with a conditional create: exit status 0 only once it is durable in every
//! repository. A file archived before is compared, never replaced (see [`wal::store`]).
use crate::codec::{Compression, Compressor};
use crate::error::{Error, Result};
use crate::options::ArchiveConfig;
use crate::pg::lsn;
use crate::repo::wal::{self, PushOutcome, WalFile, WalFileKind};
use crate::repo::{Stanza, StanzaInfo};
use std::fs;
use std::path::{Path, PathBuf};

/// Smallest and largest WAL segment size PostgreSQL allows, in bytes (`WalSegMinSize`,
/// `WalSegMaxSize` in src/include/access/xlog_internal.h).
const WAL_SEG_MIN: u64 = 1 << 20;

const WAL_SEG_MAX: u64 = 1 << 30;

/// The repositories archive-push writes to, each with its stanza's facts, read once (the
/// background pusher keeps one for its whole life).
pub struct Archiver {
    stanza: String,
    repos: Vec<(Stanza, StanzaInfo)>,
    compression: Compression,
    /// Data directory whose pg_control must name the stanza's cluster (--pg-path, else the
    /// working directory when it holds one: PostgreSQL runs archive_command there).
    control_dir: Option<PathBuf>,
    /// A file archived before is normal, not worth a warning (archive-stream beside
    /// archive-push into one stanza).
    duplicates_expected: bool,
}

impl Archiver {
    /// Opens every configured repository (`--repo N` alone when given) and reads the
    /// stanza's facts from each.
    ///
    /// Errors: no stanza or repository configured; a repository that cannot be opened or
    /// lacks the stanza; the data directory's pg_control naming another cluster.
    pub fn open(s: &ArchiveConfig) -> Result<Archiver> {
        let stanza = s.stanza()?.to_string();
        let mut repos = Vec::new();
        for st in crate::repo::open::open_stanzas(&s.repo_set)? {
            let info = st.info()?;
            repos.push((st, info));
        }
        let control_dir = match &s.pg_path {
            Some(p) => Some(p.clone()),
            None => std::env::current_dir()
                .ok()
                .filter(|d| d.join("global/pg_control").is_file()),
        };
        let a = Archiver {
            stanza,
            repos,
            compression: s.compression,
            control_dir,
            duplicates_expected: false,
        };
        if let Some(dir) = &a.control_dir {
            // A data directory that cannot be read (another user's) proves nothing either
            // way; the segments' own headers are still checked.
            if let Ok(sysid) = crate::pg::control::read_system_identifier(dir) {
                for (st, info) in &a.repos {
                    let n = st.repo();
                    if info.system_identifier != sysid {
                        return Err(Error::Repo(format!(
                            "repo{n}: stanza '{}' belongs to the cluster with system identifier {}, but {} has system identifier {sysid}",
                            a.stanza, info.system_identifier, dir.display()
                        )));
                    }
                }
            }
        }
        Ok(a)
    }

    /// Files archived before are expected (archive-stream, which shares the stanza with
    /// archive-push): they are logged at debug level rather than as a warning.
    pub fn expecting_duplicates(mut self) -> Archiver {
        self.duplicates_expected = true;
        self
    }

    /// The stanza's name.
    pub fn stanza(&self) -> &str {
        &self.stanza
    }

    /// The stanza in each repository, in order.
    pub fn repos(&self) -> impl Iterator<Item = &Stanza> {
        self.repos.iter().map(|(st, _)| st)
    }

    /// A compressor for [`Archiver::push`] (one per thread).
    pub fn compressor(&self) -> Result<Compressor> {
        Compressor::new(self.compression)
            .map_err(|e| Error::Other("cannot create a compressor".into()).because(e))
    }

    /// Reads the WAL file at `path`, checks it against the stanza and archives it into every
    /// repository. Returns the file's identity (`<size> <XXH3-128 hex>`). Every repository is tried;
    /// the first failure is returned after the others were written (PostgreSQL retries the
    /// file, and the repositories that have it answer [`PushOutcome::AlreadyArchived`]).
    ///
    /// The file is read through a memory map ([`WalBytes`]); `out` holds the encoded archive
    /// object, and a caller that pushes many files passes the same one (its capacity is
    /// kept: no fresh, page-faulted buffer per segment).
    ///
    /// Errors: the file cannot be read, is not a WAL file name, or changed while it was being
    /// read ([`Error::Io`], [`Error::Config`], [`Error::Repo`]); a segment whose size or
    /// header does not fit the stanza ([`Error::Repo`]); a different copy already archived
    /// ([`Error::Repo`]); the store's errors.
    pub fn push(
        &self,
        path: &Path,
        compressor: &mut Compressor,
        out: &mut Vec<u8>,
    ) -> Result<String> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Config(format!("{} names no WAL file", path.display())))?;
        let file = WalFile::parse(name)?;
        let bytes = WalBytes::open(path)?;
        // What was hashed and compressed is what the file still holds.
        self.push_bytes(&file, bytes.as_slice(), compressor, out, &|| {
            bytes.check_unchanged()
        })
    }

    /// The cluster's system identifier, as the first repository's stanza records it.
    pub fn system_identifier(&self) -> u64 {
        self.repos
            .first()
            .map(|r| r.1.system_identifier)
            .unwrap_or(0)
    }

    /// The cluster's WAL segment size in bytes, as the first repository's stanza records it.
    pub fn segment_size(&self) -> u64 {
        self.repos
            .first()
            .map(|r| r.1.wal_segment_size)
            .unwrap_or(crate::repo::default_wal_segment_size())
    }

    /// The compression archived files are stored with.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// [`Archiver::push`] of the bytes `data` of `file`, already in memory (`archive-stream`
    /// has them from the server): checked against the stanza, encoded into `out`, then,
    /// once `before_store` agrees, stored into every repository. Returns the file's identity.
    ///
    /// Errors: as [`Archiver::push`], and `before_store`'s.
    pub fn push_bytes(
        &self,
        file: &WalFile,
        data: &[u8],
        compressor: &mut Compressor,
        out: &mut Vec<u8>,
        before_store: &dyn Fn() -> Result<()>,
    ) -> Result<String> {
        self.check(file, data)?;
        let xxh3 = crate::codec::xxh3_hex(data);
        let encode = |compressor: &mut Compressor, out: &mut Vec<u8>| {
            wal::encode_hashed(
                &file.name,
                data,
                &xxh3,
                self.compression,
                compressor,
                self.system_identifier(),
                out,
            )
        };
        encode(compressor, out)?;
        before_store()?;
        let mut first_err = None;
        for (i, (st, _)) in self.repos.iter().enumerate() {
            let n = st.repo();
            match wal::store(st, file, data, out, i + 1 == self.repos.len()) {
                Ok(PushOutcome::AlreadyArchived) if self.duplicates_expected => tracing::debug!(
                    "WAL file {} is already in repo{n} with the same content",
                    file.name
                ),
                Ok(PushOutcome::AlreadyArchived) => tracing::warn!(
                    "WAL file {} is already in repo{n} with the same content; nothing written",
                    file.name
                ),
                Ok(PushOutcome::Stored) => {}
                Ok(PushOutcome::Damaged(reason)) => {
                    tracing::warn!(
                        "repo{n}: the archived copy of {} is damaged ({reason}): replaced by this one",
                        file.name
                    );
                    // `out` may have been handed to the store: encoded again.
                    let replaced =
                        encode(compressor, out).and_then(|_| wal::replace(st, file, out));
                    if let Err(e) = replaced {
                        first_err.get_or_insert(e);
                    }
                }
                Err(e) => {
                    if self.repos.len() > 1 {
                        tracing::error!("repo{n}: cannot archive {}: {e}", file.name);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(identity(data.len() as u64, &xxh3)),
        }
    }

    /// Checks a segment (or partial segment) against every repository's stanza: a power-of-two
    /// size PostgreSQL allows, and a long page header with the stanza's system identifier,
    /// the file's own address and segment size, and the major version's WAL magic.
    fn check(&self, file: &WalFile, data: &[u8]) -> Result<()> {
        if !matches!(file.kind, WalFileKind::Segment | WalFileKind::Partial) {
            return Ok(());
        }
        let size = data.len() as u64;
        if !(WAL_SEG_MIN..=WAL_SEG_MAX).contains(&size) || !size.is_power_of_two() {
            return Err(Error::Repo(format!(
                "{} is {size} bytes: not a WAL segment (a power of two from 1 MiB to 1 GiB)",
                file.name
            )));
        }
        let seg = file.segment().unwrap_or(&file.name);
        let (tli, segno) = crate::pg::lsn::parse_wal_segment_name(seg, size).ok_or_else(|| {
            Error::Repo(format!(
                "{} is not a valid segment name for {size}-byte segments",
                file.name
            ))
        })?;
        for (st, info) in &self.repos {
            let n = st.repo();
            lsn::check_wal_segment_header(data, tli, segno, size, info.system_identifier).map_err(
                |e| {
                    Error::Repo(format!(
                        "{} does not belong to stanza '{}' of repo{n}",
                        file.name, self.stanza
                    ))
                    .because(e)
                },
            )?;
            let magic = lsn::wal_page_magic(data);
            if let (Some(want), Some(got)) = (lsn::xlog_page_magic(&info.pg_version), magic) {
                if want != got {
                    return Err(Error::Repo(format!(
                        "{} was written by another PostgreSQL major version (page magic {got:#06X}; PostgreSQL {} writes {want:#06X}); stanza '{}' of repo{n} holds PostgreSQL {}",
                        file.name, info.pg_version, self.stanza, info.pg_version
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A WAL file's identity as an acknowledgement records it: `<size> <XXH3-128 hex>`. A
/// foreground trusts an acknowledgement only for the bytes it names (a stale one, left from
/// another cluster or a restored copy, names other bytes). The archiver builds it from the
/// hash it already has; this form is for tests.
#[cfg(test)]
pub(crate) fn wal_identity(data: &[u8]) -> String {
    identity(data.len() as u64, &crate::codec::xxh3_hex(data))
}

/// The bytes of a WAL file being archived: a read-only memory map of a file of 1 MiB or more
/// (a segment or a partial segment), the file read into memory otherwise (a timeline history
/// or backup history file, a few hundred bytes, or a filesystem that cannot map files).
///
/// Why a map: the background pusher hashes and compresses every segment. Measured on the
/// development machine (24 different 16 MiB segments in the page cache, one long-lived
/// process as the pusher is, XXH3 + zstd level 1, median per segment): read into one kept
/// 16 MiB buffer 14.6 ms, mapped 9.4 ms. The read is a 16 MiB copy from the page cache to
/// memory and back; the map lets both passes read the page cache itself.
///
/// Safety of the map: PostgreSQL never writes a segment again once it is complete and marked
/// `.ready`, and never truncates one; pgjet only reads. The file's size and modification time
/// are taken before the map and compared again once it was hashed and compressed
/// ([`WalBytes::check_unchanged`]), so a file changed by something else while it was read is
/// not archived. A file truncated under the map while being read would end the process with
/// SIGBUS, which is safe like a kill -9 (README, "kill -9"): nothing is acknowledged that is
/// not durable.
pub struct WalBytes {
    path: PathBuf,
    bytes: WalBytesKind,
    /// Size and modification time when opened.
    stamp: (u64, std::time::SystemTime),
}

enum WalBytesKind {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

/// Files smaller than this are read, not mapped (PostgreSQL's smallest segment, 1 MiB).
const MAP_MIN: u64 = WAL_SEG_MIN;

impl WalBytes {
    /// Opens (maps or reads) the file at `path`.
    ///
    /// Errors: [`Error::Io`] naming the path.
    pub fn open(path: &Path) -> Result<WalBytes> {
        use std::io::Read;
        let io = |e| Error::io("read", path, e);
        let mut f = fs::File::open(path).map_err(io)?;
        let stamp = file_stamp(&f).map_err(io)?;
        // SAFETY: the map is read-only and private to this value; see the type's doc for why
        // nothing writes or truncates the file while it is mapped.
        let mapped = (stamp.0 >= MAP_MIN)
            .then(|| unsafe { memmap2::Mmap::map(&f) })
            .and_then(|m| {
                // A filesystem that cannot map files is read instead.
                m.map_err(|e| tracing::debug!("cannot map {}: {e}", path.display()))
                    .ok()
            });
        let bytes = match mapped {
            Some(m) => WalBytesKind::Mapped(m),
            None => {
                let mut v = Vec::with_capacity(stamp.0 as usize);
                f.read_to_end(&mut v).map_err(io)?;
                WalBytesKind::Read(v)
            }
        };
        Ok(WalBytes {
            path: path.to_path_buf(),
            bytes,
            stamp,
        })
    }

    /// The file's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.bytes {
            WalBytesKind::Mapped(m) => m,
            WalBytesKind::Read(v) => v,
        }
    }

    /// Checks that the file still has the size and modification time it had when opened.
    ///
    /// Errors: [`Error::Repo`] when it changed (PostgreSQL retries the file), [`Error::Io`]
    /// when it cannot be examined.
    pub fn check_unchanged(&self) -> Result<()> {
        let now = fs::File::open(&self.path)
            .and_then(|f| file_stamp(&f))
            .map_err(|e| Error::io("read", &self.path, e))?;
        if now != self.stamp || now.0 != self.as_slice().len() as u64 {
            return Err(Error::Repo(format!(
                "{} changed while it was being archived ({} bytes before, {} now); nothing was written, the file is tried again",
                self.path.display(),
                self.stamp.0,
                now.0
            )));
        }
        Ok(())
    }
}

/// A file's size and modification time.
fn file_stamp(f: &fs::File) -> std::io::Result<(u64, std::time::SystemTime)> {
    let m = f.metadata()?;
    Ok((m.len(), m.modified()?))
}

/// The identity of `size` bytes whose XXH3-128 is `xxh3` (hex): `<size> <xxh3>`.
fn identity(size: u64, xxh3: &str) -> String {
    format!("{size} {xxh3}")
}

/// The piece [`wal_file_identity`] reads at a time, in bytes (see there for the measurement).
const IDENTITY_PIECE: usize = 128 << 10;

/// The identity (`<size> <XXH3-128 hex>`) of the file at `path`, read in 128 KiB pieces
/// through one buffer. The foreground runs once per segment, on PostgreSQL's critical path.
/// Measured on the development machine (a fresh process per 16 MiB segment in the page
/// cache, read and hashed, median of 24): in 1 MiB pieces 7.5 ms, in 128 KiB or 64 KiB pieces
/// 2.1 ms (in a long-lived process, one reused 16 MiB buffer took 7.0 ms).
///
/// Errors: [`Error::Io`] naming the path.
pub fn wal_file_identity(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut f = fs::File::open(path).map_err(|e| Error::io("read", path, e))?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; IDENTITY_PIECE];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("read", path, e)),
        };
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(identity(size, &format!("{:032x}", h.digest128())))
}

/// Resolves `%p`/`%f`-style paths: relative ones are relative to the working directory
/// (PostgreSQL runs archive_command and restore_command in the data directory).
pub fn resolve_path(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_bytes_map_segments_read_small_files_and_refuse_a_changed_file() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("000000010000000000000001");
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 253) as u8).collect();
        fs::write(&seg, &data).unwrap();
        let b = WalBytes::open(&seg).unwrap();
        assert!(matches!(b.bytes, WalBytesKind::Mapped(_)));
        assert_eq!(b.as_slice(), &data[..]);
        b.check_unchanged().unwrap();
        let hist = dir.path().join("00000002.history");
        fs::write(&hist, b"1\t0/3000000\tno recovery target specified\n").unwrap();
        let h = WalBytes::open(&hist).unwrap();
        assert!(matches!(h.bytes, WalBytesKind::Read(_)));
        assert_eq!(h.as_slice(), &fs::read(&hist).unwrap()[..]);
        h.check_unchanged().unwrap();
        // Rewritten in place with the same size: the modification time tells.
        let f = fs::OpenOptions::new().write(true).open(&hist).unwrap();
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
            .unwrap();
        let e = h.check_unchanged().unwrap_err();
        assert!(
            e.to_string()
                .contains("changed while it was being archived"),
            "{e}"
        );
        // Grown: the size tells.
        let g = WalBytes::open(&hist).unwrap();
        fs::write(&hist, b"1\t0/3000000\tno recovery target specified\n2\n").unwrap();
        assert!(g.check_unchanged().is_err());
        let e = WalBytes::open(&dir.path().join("gone")).err().unwrap();
        assert!(e.to_string().contains("gone"), "{e}");
    }

    #[test]
    fn file_identity_matches_the_identity_of_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // Larger than a piece, and not a multiple of it.
        let data: Vec<u8> = (0..(3 << 20) + 12345u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let p = dir.path().join("000000010000000000000001");
        fs::write(&p, &data).unwrap();
        assert_eq!(wal_file_identity(&p).unwrap(), wal_identity(&data));
        fs::write(&p, b"").unwrap();
        assert_eq!(wal_file_identity(&p).unwrap(), wal_identity(b""));
        let e = wal_file_identity(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
