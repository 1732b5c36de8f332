//! The [`RestoreTarget`] seam: where reading a backup back ([`super::read_back`]) puts the
//! pieces it has checked. The data directory's writer (`crate::pgdata::write::DataDirWriter`)
//! implements it; the repository layer knows only paths within the backup, never files.
use crate::error::Result;

/// Where checked pieces go, by the file's path in the backup (relative to the data
/// directory, as in the manifest). Called from several writer threads at once, never for
/// the same bytes twice.
pub trait RestoreTarget: Sync {
    /// Creates the file `path`, which must not exist yet, with permission bits `mode` (0:
    /// 0600), holding `data` (the whole file: its one piece) at its start with the all-zero
    /// pages `zero_pages` (`[first page, count]`, pages of `BLCKSZ` bytes) left as holes,
    /// sized `size` bytes and with mtime `mtime` (Unix seconds).
    ///
    /// Errors: the file exists or cannot be written.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        path: &str,
        mode: u32,
        size: u64,
        mtime: i64,
        data: &[u8],
        zero_pages: &[[u32; 2]],
    ) -> Result<()>;

    /// Writes the piece `data` at byte `offset` of the existing file `path`, sized already.
    /// Its all-zero pages `zero_pages` read as zeros afterwards (a target that may hold other
    /// bytes, as a delta restore's, clears them; a new one leaves its holes).
    ///
    /// Errors: the file is missing or cannot be written.
    fn write(&self, path: &str, offset: u64, data: &[u8], zero_pages: &[[u32; 2]]) -> Result<()>;

    /// True when the `want.len()` bytes at `offset` of the existing file `path` are `want`
    /// (a delta restore compares before it writes; a shorter file differs).
    ///
    /// Errors: the file cannot be opened or read.
    fn holds(&self, path: &str, offset: u64, want: &[u8]) -> Result<bool>;

    /// Every wanted piece in the `len` bytes at `offset` of `path` is written: a hint that
    /// they can go to the disk now. The default does nothing.
    fn written(&self, _path: &str, _offset: u64, _len: u64) {}

    /// Every wanted piece of `path` is written: its mtime is set to `mtime` (Unix seconds).
    ///
    /// Errors: the time cannot be set.
    fn finish(&self, path: &str, mtime: i64) -> Result<()>;
}

/// A file of a [`MemoryTarget`]: its bytes, and its mtime once finished.
#[cfg(test)]
type MemoryFile = (Vec<u8>, Option<i64>);

/// A [`RestoreTarget`] in memory, for the repository layer's tests: each file by path.
#[cfg(test)]
#[derive(Default)]
pub struct MemoryTarget {
    files: std::sync::Mutex<std::collections::BTreeMap<String, MemoryFile>>,
}

#[cfg(test)]
impl MemoryTarget {
    /// Makes the file `path` of `size` zero bytes (as a restore's planner does for a file of
    /// several pieces).
    pub fn make(&self, path: &str, size: u64) {
        self.lock()
            .insert(path.to_string(), (vec![0; size as usize], None));
    }

    /// The bytes and mtime of `path`, if it exists.
    pub fn file(&self, path: &str) -> Option<MemoryFile> {
        self.lock().get(path).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, MemoryFile>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn missing(path: &str) -> crate::error::Error {
        crate::error::Error::io(
            "open",
            std::path::Path::new(path),
            std::io::ErrorKind::NotFound.into(),
        )
    }
}

#[cfg(test)]
impl RestoreTarget for MemoryTarget {
    fn create(
        &self,
        path: &str,
        _mode: u32,
        size: u64,
        mtime: i64,
        data: &[u8],
        _zero_pages: &[[u32; 2]],
    ) -> Result<()> {
        let mut files = self.lock();
        if files.contains_key(path) {
            return Err(crate::error::Error::io(
                "create",
                std::path::Path::new(path),
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        let mut bytes = data.to_vec();
        bytes.resize(size as usize, 0);
        files.insert(path.to_string(), (bytes, Some(mtime)));
        Ok(())
    }

    fn write(&self, path: &str, offset: u64, data: &[u8], _zero_pages: &[[u32; 2]]) -> Result<()> {
        let mut files = self.lock();
        let (bytes, _) = files.get_mut(path).ok_or_else(|| Self::missing(path))?;
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
        Ok(())
    }

    fn holds(&self, path: &str, offset: u64, want: &[u8]) -> Result<bool> {
        let files = self.lock();
        let (bytes, _) = files.get(path).ok_or_else(|| Self::missing(path))?;
        Ok(bytes.get(offset as usize..offset as usize + want.len()) == Some(want))
    }

    fn finish(&self, path: &str, mtime: i64) -> Result<()> {
        let mut files = self.lock();
        files.get_mut(path).ok_or_else(|| Self::missing(path))?.1 = Some(mtime);
        Ok(())
    }
}
