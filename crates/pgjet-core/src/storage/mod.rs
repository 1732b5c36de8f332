//! Byte stores behind one trait: the posix store (direct I/O, batched syncfs) and the object
//! stores S3, GCS, Azure Blob and SFTP through OpenDAL ([`object`]).
//!
//! Data objects are bounded in size by the transfer engine (one chunk or one bundle, at most
//! [`crate::transfer::CHUNK_SIZE`] logical bytes), so [`Storage::put`] takes the whole object:
//! memory stays bounded and an object store uploads it in one request (or a few parts).
//! Objects of unbounded size (a manifest of a million files) go through
//! [`Storage::writer`] and [`Storage::reader`], which stream.
//!
//! Nothing here assumes rename, flock or a local path: completeness is an object written last,
//! locks are conditional creates ([`Storage::create_new`]) with a lease (see `repo::lock`).

pub mod config;
pub mod fault;
pub mod object;
use crate::io::direct;
pub mod posix;
pub mod ssh;

use crate::error::Result;
use config::RepoConfig;
use std::io::Read;
use std::sync::Arc;

/// Whole-object reads a restore keeps in flight on a posix repository (one thread each,
/// ahead of the decoders), each with
/// one direct read in flight. Reads share the disk with the writers' requests, and most
/// objects of a zstd backup are small (an 8 MiB chunk of table data stores as about
/// 1.6 MiB), so each read waits behind the queued writes: with two readers the decoders
/// waited for objects about 8 of 11 seconds, with four about 5 (docs/benchmark-notes.md,
/// restore section). An object store gets its own count ([`Storage::read_ahead`]).
pub const READ_AHEAD: usize = 4;

/// A streaming upload of one object. The object exists, complete, only after
/// [`ObjectWriter::finish`] returns; a writer dropped before that leaves nothing that looks
/// complete (posix: a temporary file; object stores: an aborted multipart upload).
pub trait ObjectWriter: Send {
    /// Appends `data`.
    fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Completes the object and makes it durable.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// A flat namespace of objects addressed by '/'-separated names relative to the repository
/// root. A "directory" is a name prefix; it exists while an object is below it.
///
/// Errors: [`crate::error::Error::Storage`] (object stores, with a [`crate::error::StorageFault`]
/// telling retryable from permanent after the store's own retries) or
/// [`crate::error::Error::Io`] (posix).
pub trait Storage: Send + Sync {
    /// Where the repository is, for messages: `posix /var/lib/pgjet`,
    /// `s3 https://host/bucket/prefix`.
    fn describe(&self) -> String;
    /// Writes (or replaces) object `name`. Not durable until [`Storage::sync`]
    /// (object stores: durable when this returns).
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    /// How many whole-object reads a restore keeps in flight: posix 4 (the disk is shared
    /// with the restore's writes, [`READ_AHEAD`]); an object store
    /// more, since each request waits a round trip and ramps its connection up.
    fn read_ahead(&self) -> usize {
        READ_AHEAD
    }
    /// Whether the store's requests cross a network (object stores, SFTP): then a restore
    /// is bound by its downloads rather than by the disk it writes, and spends its buffers
    /// on reads in flight. Posix (a local or mounted directory): false.
    fn remote(&self) -> bool {
        false
    }
    /// [`Storage::put`] of a buffer the store may keep instead of copying: returns it when
    /// the caller can reuse it (posix, the default), None when the store kept it (object
    /// stores upload the buffer itself, and free it when the upload ends).
    fn put_owned(
        &self,
        name: &str,
        data: direct::AlignedBuf,
    ) -> Result<Option<direct::AlignedBuf>> {
        self.put(name, &data)?;
        Ok(Some(data))
    }
    /// Writes `name` so that it is either absent or complete and durable when this returns
    /// (posix: temp file, fsync, rename, fsync of the directory).
    fn put_durable(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Creates `name`, complete and durable, only if it does not exist: Ok(true) when this
    /// call created it, Ok(false) when it was already there (nothing written). Atomic against
    /// other writers (posix: link(2) of a synced temporary file; S3: `If-None-Match: *`).
    fn create_new(&self, name: &str, data: &[u8]) -> Result<bool>;
    /// [`Storage::create_new`] of a buffer the store may change (an encrypting store seals
    /// it in place instead of into a new buffer); returns the buffer for reuse, its
    /// contents unspecified.
    fn create_new_owned(&self, name: &str, data: Vec<u8>) -> Result<(bool, Vec<u8>)> {
        Ok((self.create_new(name, &data)?, data))
    }
    /// Reads `len` bytes at `offset` of `name`; errors if the object is shorter.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Reads all of `name`.
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// Reads all of `name` into `buf` (replacing its contents, keeping its allocation when
    /// it is large enough; a restore reuses a few buffers this way). `size` is the size the
    /// caller expects (from the manifest), when it knows one: an object store then reads a
    /// large object as several ranged requests at once. Whatever the object holds, `buf`
    /// gets all of it and no more, so a caller still compares its length with `size`.
    fn get_into(&self, name: &str, size: Option<u64>, buf: &mut direct::AlignedBuf) -> Result<()>;
    /// A streaming reader of all of `name`.
    fn reader(&self, name: &str) -> Result<Box<dyn Read + Send>>;
    /// A streaming writer of `name` (see [`ObjectWriter`]).
    fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>>;
    /// True when the object `name` exists.
    fn exists(&self, name: &str) -> Result<bool>;
    /// Size in bytes of `name`, or None when it does not exist.
    fn size(&self, name: &str) -> Result<Option<u64>>;
    /// Names directly below the directory `dir` (objects and directories, no recursion,
    /// no trailing '/'), in no particular order, as the store yields them (an object store
    /// fetches a page of names at a time); nothing when the directory does not exist.
    /// [`list_sorted`] collects and sorts them.
    fn list(&self, dir: &str) -> Result<Names<'_>>;
    /// Removes the object `name`; absent is fine.
    fn delete(&self, name: &str) -> Result<()>;
    /// Removes `dir` and everything below it; absent is fine.
    fn remove_all(&self, dir: &str) -> Result<()>;
    /// Makes everything written so far durable (object stores: a no-op, every write is).
    fn sync(&self) -> Result<()>;
    /// Makes every call in flight and every later one fail at once (a command that already
    /// failed stops waiting on its other requests). Posix calls are short: a no-op.
    fn cancel(&self) {}
}

/// The names of a listing ([`Storage::list`]), each an error when the store failed while
/// listing.
pub type Names<'a> = Box<dyn Iterator<Item = Result<String>> + Send + 'a>;

/// The names directly below `dir` in `store`, sorted, each once.
///
/// Errors: the store's.
pub fn list_sorted(store: &dyn Storage, dir: &str) -> Result<Vec<String>> {
    let mut names = store.list(dir)?.collect::<Result<Vec<String>>>()?;
    names.sort();
    names.dedup();
    Ok(names)
}

/// Opens the repository `cfg` describes.
///
/// Errors: a posix path that is not a directory; for object stores, settings that cannot work,
/// refused credentials or a missing bucket (one request checks both).
pub fn open(cfg: &RepoConfig) -> Result<Arc<dyn Storage>> {
    match cfg {
        RepoConfig::Posix { path } => Ok(Arc::new(posix::PosixStorage::open(path)?)),
        other => Ok(Arc::new(object::ObjectStorage::open(other)?)),
    }
}
