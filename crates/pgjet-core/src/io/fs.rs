//! Small file operations that must be durable or atomic, on paths of this host: a file
//! written whole (renamed into place), a small file written and fsynced, a directory
//! fsynced after a create or rename, a filesystem synced once at the end of a unit of work,
//! a file created only if new, a modification time set without opening; and the permission
//! bits of what pgjet creates.
//!
//! Modes. Everything pgjet creates in a repository or a spool directory gets at most
//! [`FILE_MODE`] (0640) or [`DIR_MODE`] (0750): the owner reads and writes, the group reads,
//! other users get nothing. They are passed to open(2) and mkdir(2), so the process umask can
//! only remove bits: a umask stricter than 027 gives stricter modes (0600/0700 under
//! PostgreSQL's own umask 077), a permissive one (000, 022) never adds world access.
//! Files of a data directory (restore, replica-create) get the modes PostgreSQL gives them
//! (see `crate::pgdata::DataDirModes`), exactly.
use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Permission bits of every file pgjet creates in a repository (posix store) or a spool
/// directory: 0640, owner read/write, group read, no access for others. pgBackRest's
/// default repository file mode is the same (its `neutral-umask` option documentation:
/// "the default directory mode is 0750 and default file mode is 0640"). The umask may remove
/// more bits, never add any.
pub const FILE_MODE: u32 = 0o640;

/// Permission bits of every directory pgjet creates in a repository or a spool directory:
/// 0750 (see [`FILE_MODE`]).
pub const DIR_MODE: u32 = 0o750;

/// Creates `dir` and any missing parents with permission bits `mode` (as mkdir(2) applies
/// them: less the umask); an existing directory is left as it is.
///
/// Errors: [`Error::Io`] naming the directory.
pub fn create_dir_all(dir: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| Error::io("create directory", dir, e))
}

/// Gives the new file `f` (at `path`) exactly the permission bits `mode` when they include
/// group or other bits, which a umask may have removed at the create; owner-only modes are
/// left to the create (a umask never removes owner bits in practice).
///
/// For data directories, whose modes are PostgreSQL's and not the caller's umask's.
pub fn set_exact_mode(f: &File, path: &Path, mode: u32) -> Result<()> {
    if mode & 0o077 == 0 {
        return Ok(());
    }
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path, e))
}

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

/// Writes a small file of a data directory durably (write, fsync); a new file gets exactly
/// the permission bits `mode` (0600, or 0640 in a cluster with group access; 0: 0600), an
/// existing one keeps its own.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    write_from(path, &mut &data[..], mode)
}

/// [`write_file`] with the bytes of a reader (a file larger than memory should hold).
pub fn write_from(path: &Path, data: &mut dyn std::io::Read, mode: u32) -> Result<()> {
    let mode = if mode == 0 { 0o600 } else { mode };
    let existed = path.exists();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| Error::io("create", path, e))?;
    if !existed {
        set_exact_mode(&f, path, mode)?;
    }
    std::io::copy(data, &mut f).map_err(|e| Error::io("write", path, e))?;
    f.sync_all().map_err(|e| Error::io("fsync", path, e))
}

/// Writes `data` to `dest` through a temporary sibling (`<dest>.pgjet.tmp`) renamed into
/// place, so no reader (PostgreSQL, a foreground waiting on the spool) sees a half-written
/// file. Not fsynced: what it writes can be fetched again. The file gets the permission bits
/// `mode` less the umask.
///
/// The callers pass [`FILE_MODE`] (0640) for spool files and for archive-get's `%p`: run
/// as PostgreSQL's restore_command, the umask is PostgreSQL's own (077, or 027 when the
/// cluster allows group access; postmaster.c sets it from the data directory's mode), so
/// `%p` gets 0600 (0640), the mode PostgreSQL gives its own WAL files
/// (pg_file_create_mode, src/common/file_perm.c); run by hand with a permissive umask it
/// gets 0640, never world access.
///
/// Errors: [`Error::Io`] naming the path.
pub fn write_whole(dest: &Path, data: &[u8], mode: u32) -> Result<()> {
    write_whole_with(dest, data, mode, false)
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
pub fn write_whole_with(dest: &Path, data: &[u8], mode: u32, sync: bool) -> Result<()> {
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".pgjet.tmp");
    let tmp = PathBuf::from(tmp);
    let r = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
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

/// Creates the file `path` of a data directory, which must not exist, with exactly the
/// permission bits `mode` (0: 0600; see [`set_exact_mode`]), and returns it open for
/// writing. A missing parent directory is made, mode 0700 (checked only when the create
/// finds none: no extra stat per file). Errors: the file exists, or cannot be made.
pub fn create_new_file(path: &Path, mode: u32) -> Result<std::fs::File> {
    let mode = if mode == 0 { 0o600 } else { mode };
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
    };
    let f = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                create_dir_all(parent, 0o700)?;
            }
            open()
        }
        other => other,
    }
    .map_err(|e| Error::io("create", path, e))?;
    set_exact_mode(&f, path, mode)?;
    Ok(f)
}

/// Bytes an unprivileged writer may still use on the filesystem holding `path`
/// (statvfs(2): `f_bavail` × `f_frsize`), or None when it cannot be read.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: statvfs writes one struct into `st` and reads the NUL-terminated path `c`.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail * st.f_frsize)
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

/// Runs `body` in a child process (this test binary again, running only the test `test`,
/// its full path, e.g. "storage::posix::tests::modes") whose umask is `umask`, and fails
/// unless it passed there. The umask belongs to the whole process and the tests of one
/// binary run as threads of one process: set in place, it would change what the other tests
/// create meanwhile.
#[cfg(test)]
pub(crate) fn with_umask_in_child(test: &str, umask: u32, body: impl FnOnce()) {
    const CHILD: &str = "PGJET_TEST_UMASK_CHILD";
    if std::env::var(CHILD).ok().as_deref() == Some(test) {
        // SAFETY: umask(2) changes only this process's mask; this process runs this test
        // alone (--exact, one thread).
        unsafe { libc::umask(umask as libc::mode_t) };
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, test)
        .output()
        .expect("run the test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{test} under umask {umask:03o}:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "{test} did not run in the child:\n{text}"
    );
}

/// Every directory and file below `root` (not `root` itself) with its permission bits,
/// sorted by path; symbolic links are not followed.
#[cfg(test)]
pub(crate) fn modes_below(root: &Path) -> Vec<(PathBuf, bool, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for ent in fs::read_dir(&d).unwrap() {
            let ent = ent.unwrap();
            let meta = fs::symlink_metadata(ent.path()).unwrap();
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.is_dir() {
                stack.push(ent.path());
            }
            out.push((
                ent.path(),
                meta.is_dir(),
                meta.permissions().mode() & 0o7777,
            ));
        }
    }
    out.sort();
    out
}

/// Asks the kernel to start writing back the dirty pages of `path` in `len` bytes from
/// `offset` (`sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`: it does not wait for the
/// disk and promises nothing about durability; the caller's final sync does). Best effort:
/// an error (the file gone, a filesystem without it) is ignored.
pub fn start_writeback(path: &Path, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return;
    };
    // SAFETY: plain syscall on an open descriptor.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}
