//! Small file operations that must be durable or atomic, on paths of this host: a file
//! written whole (renamed into place), a small file written and fsynced, a directory
//! fsynced after a create or rename, a filesystem synced once at the end of a unit of work,
//! a file created only if new, a modification time set without opening.
use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// fsync of a directory, so a rename or create inside it is durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("fsync directory", dir, e))
}

/// A descriptor kept open on a directory from before a unit of work's first write, so that
/// `syncfs(2)` on it reports every writeback error of the filesystem since then (Linux
/// reports errors to descriptors opened before they happened; one opened at the end could
/// miss an error another caller already consumed).
pub struct SyncHandle {
    path: PathBuf,
    file: File,
}

impl SyncHandle {
    /// Opens `path` (a directory) for a later [`SyncHandle::syncfs`].
    pub fn open(path: &Path) -> Result<SyncHandle> {
        let file = File::open(path).map_err(|e| Error::io("open for syncfs", path, e))?;
        Ok(SyncHandle {
            path: path.to_path_buf(),
            file,
        })
    }

    /// `syncfs(2)`: flushes all dirty data and metadata of the filesystem; errors if any
    /// writeback since [`SyncHandle::open`] failed.
    pub fn syncfs(&self) -> Result<()> {
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe { libc::syncfs(self.file.as_raw_fd()) };
        if rc != 0 {
            return Err(Error::io(
                "syncfs",
                &self.path,
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

/// Writes a small file durably (write, fsync) with mode 0600.
pub fn write_file(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io("create", path, e))?;
    f.write_all(data).map_err(|e| Error::io("write", path, e))?;
    f.sync_all().map_err(|e| Error::io("fsync", path, e))
}

/// Writes `data` to `dest` through a temporary sibling (`<dest>.pgjet.tmp`) renamed into
/// place, so no reader (PostgreSQL, a foreground waiting on the spool) sees a half-written
/// file. Not fsynced: what it writes can be fetched again.
///
/// Errors: [`Error::Io`] naming the path.
pub fn write_whole(dest: &Path, data: &[u8]) -> Result<()> {
    write_whole_with(dest, data, false)
}

/// [`write_whole`], with the data written to disk (fdatasync) before the rename when `sync`.
///
/// For the prefetcher's segments: PostgreSQL keeps every segment restore_command gives it,
/// with a `durable_rename` that fsyncs it (KeepFileRestoredFromArchive in
/// src/backend/access/transam/xlogarchive.c), so recovery's startup process would otherwise
/// wait for each 16 MiB to reach the disk. Written to disk ahead, in the background, that
/// fsync finds nothing to write.
///
/// Errors: as [`write_whole`].
pub fn write_whole_with(dest: &Path, data: &[u8], sync: bool) -> Result<()> {
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".pgjet.tmp");
    let tmp = PathBuf::from(tmp);
    let r = fs::File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(data)?;
            if sync {
                f.sync_data()?;
            }
            Ok(())
        })
        .map_err(|e| Error::io("write", &tmp, e))
        .and_then(|_| fs::rename(&tmp, dest).map_err(|e| Error::io("rename", dest, e)));
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

/// Creates the file `path`, which must not exist, with permission bits `mode` (0: 0600),
/// and returns it open for writing. A missing parent directory is made (checked only when
/// the create finds none: no extra stat per file). Errors: the file exists, or cannot be
/// made.
pub fn create_new_file(path: &Path, mode: u32) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if mode == 0 { 0o600 } else { mode })
            .open(path)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| Error::io("create directory", parent, e))?;
            }
            open()
        }
        other => other,
    }
    .map_err(|e| Error::io("create", path, e))
}

/// Sets the modification time of `path` to `mtime` (Unix seconds; negative as 0), without
/// opening it.
pub fn set_mtime(path: &Path, mtime: i64) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Other(format!("{} contains a NUL byte", path.display())))?;
    let t = libc::timespec {
        tv_sec: mtime.max(0) as libc::time_t,
        tv_nsec: 0,
    };
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        t,
    ];
    // SAFETY: a NUL-terminated path and two timespecs, as utimensat(2) takes them.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    if rc != 0 {
        return Err(Error::io(
            "set mtime",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}
