//! Byte stores behind one trait. Only the posix store exists so far; object stores (S3 via
//! OpenDAL) come with the next issue and implement the same trait.
//!
//! Objects are bounded in size by the transfer engine (one chunk or one bundle, at most
//! [`crate::transfer::CHUNK_SIZE`] logical bytes), so `put` takes the whole object: memory
//! stays bounded without a streaming writer, and object stores can upload each object in one
//! request. Whole files are never buffered.
pub mod direct;
pub mod posix;

use crate::error::Result;

/// A flat namespace of objects addressed by '/'-separated names relative to the store root.
pub trait Storage: Send + Sync {
    /// Writes (or replaces) object `name`. Not durable until [`Storage::sync`].
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Writes `name` so that it is either absent or complete and durable when this returns
    /// (posix: temp file, fsync, rename, fsync of the directory).
    fn put_durable(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Reads `len` bytes at `offset` of `name`; errors if the object is shorter.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Reads all of `name`.
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// Reads all of `name` into a buffer aligned for direct I/O (see [`direct`]).
    fn get_aligned(&self, name: &str) -> Result<direct::AlignedBuf> {
        let v = self.get(name)?;
        let mut b = direct::aligned_buf(v.len());
        b.extend_from_slice(&v);
        Ok(b)
    }
    /// Reads all of `name` into `buf` (replacing its contents, keeping its allocation when
    /// it is large enough), aligned for direct I/O. Restore reuses a few buffers this way.
    fn get_aligned_into(&self, name: &str, buf: &mut direct::AlignedBuf) -> Result<()> {
        let v = self.get(name)?;
        buf.clear();
        buf.extend_from_slice(&v);
        Ok(())
    }
    /// True when `name` exists.
    fn exists(&self, name: &str) -> Result<bool>;
    /// Size in bytes of `name`, or None when it does not exist.
    fn size(&self, name: &str) -> Result<Option<u64>>;
    /// Names directly below the directory `dir` (no recursion), sorted.
    fn list(&self, dir: &str) -> Result<Vec<String>>;
    /// Removes `dir` and everything below it; absent is fine.
    fn remove_all(&self, dir: &str) -> Result<()>;
    /// Makes everything written so far durable.
    fn sync(&self) -> Result<()>;
}
