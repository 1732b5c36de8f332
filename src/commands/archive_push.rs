//! `archive-push`: archive one WAL file into every configured repository, for PostgreSQL's
//! `archive_command = 'pgjet --stanza=NAME archive-push %p'`.
//!
//! The file is read once, checked against the stanza (a segment's long page header carries
//! the system identifier, the segment size and the WAL format's magic number), compressed
//! and stored with a conditional create: exit status 0 only once it is durable in every
//! repository. A file archived before is compared, never replaced (see [`wal::store`]).
use super::*;
use crate::codec::{Compression, Compressor};
use crate::repo::wal::{self, PushOutcome, WalFile, WalFileKind};
use crate::repo::{self, StanzaInfo};
use std::sync::Arc;

/// Smallest and largest WAL segment size PostgreSQL allows, in bytes (`WalSegMinSize`,
/// `WalSegMaxSize` in src/include/access/xlog_internal.h).
const WAL_SEG_MIN: u64 = 1 << 20;
const WAL_SEG_MAX: u64 = 1 << 30;

/// The repositories archive-push writes to, each with its stanza's facts, read once (the
/// background pusher keeps one for its whole life).
pub struct Archiver {
    stanza: String,
    repos: Vec<(u8, Arc<dyn Storage>, StanzaInfo)>,
    compression: Compression,
    /// Data directory whose pg_control must name the stanza's cluster (--pg-path, else the
    /// working directory when it holds one: PostgreSQL runs archive_command there).
    control_dir: Option<PathBuf>,
}

impl Archiver {
    /// Opens every configured repository (`--repo N` alone when given) and reads the
    /// stanza's facts from each.
    ///
    /// Errors: no stanza or repository configured; a repository that cannot be opened or
    /// lacks the stanza; the data directory's pg_control naming another cluster.
    pub fn open(s: &Settings) -> Result<Archiver> {
        let stanza = s.stanza()?.to_string();
        let mut repos = Vec::new();
        for (n, store) in open_repos(s)? {
            let info = repo::read_stanza(&*store, &stanza)?;
            repos.push((n, store, info));
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
        };
        if let Some(dir) = &a.control_dir {
            // A data directory that cannot be read (another user's) proves nothing either
            // way; the segments' own headers are still checked.
            if let Ok(sysid) = read_control_system_identifier(dir) {
                for (n, _, info) in &a.repos {
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

    /// The stanza's name.
    pub fn stanza(&self) -> &str {
        &self.stanza
    }

    /// The repositories, by number.
    pub fn repos(&self) -> impl Iterator<Item = (u8, &Arc<dyn Storage>)> {
        self.repos.iter().map(|(n, s, _)| (*n, s))
    }

    /// A compressor for [`Archiver::push`] (one per thread).
    pub fn compressor(&self) -> Result<Compressor> {
        Compressor::new(self.compression)
            .map_err(|e| Error::Other(format!("cannot create a compressor: {e}")))
    }

    /// Reads the WAL file at `path`, checks it against the stanza and archives it into every
    /// repository. Returns the file's identity (`<size> <XXH3-128 hex>`). Every repository is tried;
    /// the first failure is returned after the others were written (PostgreSQL retries the
    /// file, and the repositories that have it answer [`PushOutcome::AlreadyArchived`]).
    ///
    /// `buf` holds the file's bytes; a caller that pushes many files passes the same one
    /// (its capacity is kept: no fresh 16 MiB, page-faulted, per segment).
    ///
    /// Errors: the file cannot be read or is not a WAL file name; a segment whose size or
    /// header does not fit the stanza ([`Error::Repo`]); a different copy already archived
    /// ([`Error::Repo`]); the store's errors.
    pub fn push(
        &self,
        path: &Path,
        compressor: &mut Compressor,
        buf: &mut Vec<u8>,
    ) -> Result<String> {
        use std::io::Read;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Config(format!("{} names no WAL file", path.display())))?;
        let file = WalFile::parse(name)?;
        buf.clear();
        fs::File::open(path)
            .and_then(|mut f| f.read_to_end(buf))
            .map_err(|e| Error::io("read", path, e))?;
        let data = &buf[..];
        self.check(&file, data)?;
        let sysid = self
            .repos
            .first()
            .map(|r| r.2.system_identifier)
            .unwrap_or(0);
        let xxh3 = crate::codec::xxh3_hex(data);
        let encoded =
            wal::encode_hashed(&file.name, data, &xxh3, self.compression, compressor, sysid)?;
        let mut first_err = None;
        for (n, store, _) in &self.repos {
            match wal::store(&**store, &self.stanza, &file, data, &encoded) {
                Ok(PushOutcome::AlreadyArchived) => tracing::warn!(
                    "WAL file {} is already in repo{n} with the same content; nothing written",
                    file.name
                ),
                Ok(PushOutcome::Stored) => {}
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
        for (n, _, info) in &self.repos {
            lsn::check_wal_segment_header(data, tli, segno, size, info.system_identifier).map_err(
                |e| {
                    Error::Repo(format!(
                        "{} does not belong to stanza '{}' of repo{n}: {e}",
                        file.name, self.stanza
                    ))
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

/// The identity of `size` bytes whose XXH3-128 is `xxh3` (hex): `<size> <xxh3>`.
fn identity(size: u64, xxh3: &str) -> String {
    format!("{size} {xxh3}")
}

/// The identity (`<size> <XXH3-128 hex>`) of the file at `path`, read in 1 MiB pieces through one buffer: the
/// foreground runs once per segment, and a whole-file read into a fresh 16 MiB buffer costs
/// a page fault per page (the asynchronous foreground with its acknowledgement waiting took
/// about 7 ms a segment this way on the development machine).
///
/// Errors: [`Error::Io`] naming the path.
pub fn wal_file_identity(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut f = fs::File::open(path).map_err(|e| Error::io("read", path, e))?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
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

/// Synchronous archive-push with a queue limit: when the WAL waiting in `archive_status`
/// (this file included) passes `max` bytes, a segment is dropped instead of archived, and the
/// gap recorded. Returns the warning when it dropped the file.
fn drop_if_queue_full(
    s: &Settings,
    archiver: &Archiver,
    path: &Path,
    max: u64,
) -> Result<Option<String>> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if WalFile::parse(name)?.kind != WalFileKind::Segment {
        return Ok(None);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let ready = match super::archive_async::ready_files(dir) {
        Ok(r) => r,
        // No archive_status next to the file: not PostgreSQL's queue, nothing to measure.
        Err(_) => return Ok(None),
    };
    let size = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let queued = size * ready.len().max(1) as u64;
    if queued <= max {
        return Ok(None);
    }
    let spool = super::archive_async::Spool::open(s, archiver.stanza())?;
    let reason = format!(
        "archive-push-queue-max ({}) was exceeded: {} waited to be archived",
        mib(max),
        mib(queued)
    );
    super::archive_async::drop_segments(&spool, archiver, &[name.to_string()], size, &reason)
        .map(Some)
}

/// Runs `archive-push` for the WAL file at `wal_path`: returns once it is durable in every
/// repository.
///
/// Errors: as [`Archiver::open`] and [`Archiver::push`].
pub fn run(s: &Settings, wal_path: &Path) -> Result<()> {
    if let Some(dir) = std::env::var_os(super::archive_async::BACKGROUND_ENV) {
        return super::archive_async::push_background(s, Path::new(&dir));
    }
    if s.archive.asynchronous {
        return super::archive_async::push_foreground(s, wal_path);
    }
    let path = resolve_path(wal_path);
    let archiver = Archiver::open(s)?;
    if let Some(max) = s.archive.push_queue_max {
        // Gap records that could not reach a repository yet go first.
        super::archive_async::flush_gaps(
            &super::archive_async::Spool::open(s, archiver.stanza())?,
            &archiver,
        );
        if let Some(warning) = drop_if_queue_full(s, &archiver, &path, max)? {
            tracing::warn!("{warning}");
            return Ok(());
        }
    }
    let mut c = archiver.compressor()?;
    archiver.push(&path, &mut c, &mut Vec::new())?;
    tracing::debug!("archived {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_identity_matches_the_identity_of_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // Larger than the 1 MiB piece, and not a multiple of it.
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
