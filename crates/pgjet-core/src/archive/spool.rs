//! The spool directory of asynchronous archiving (`archive-async=y`) and the background
//! processes that work through it.
//!
//! ```text
//! <spool-path>/archive/<stanza>/out/<file>.ok     acknowledged: durable in every repository
//!                                                 (or dropped by the queue limit: the file
//!                                                 then holds the warning)
//! <spool-path>/archive/<stanza>/out/<file>.error  the last attempt failed: the message
//! <spool-path>/archive/<stanza>/out/global.error  the background pusher could not start
//! <spool-path>/archive/<stanza>/in/<segment>      segments the prefetcher fetched ahead
//! <spool-path>/archive/<stanza>/push.lock         flock(2) held by the background pusher
//! <spool-path>/archive/<stanza>/archiver-failed   the foreground failed a file: PostgreSQL's
//!                                                 archiver may be waiting up to 60 s; the
//!                                                 pusher wakes it once it acknowledges one
//! <spool-path>/archive/<stanza>/get.lock          flock(2) held by the prefetcher
//! <spool-path>/archive/<stanza>/push.log, get.log their logs
//! <spool-path>/archive/<stanza>/gap/<first>-<last>.json  gap records not yet in a repository
//! ```
//!
//! A background process is this binary started again, in a session of its own, with a
//! hidden subcommand (`archive-push-async`, `archive-get-async`); one per stanza and kind, kept
//! single by its lock.
//!
//! Modes: every directory of the spool (the spool path itself when pgjet creates it) is
//! created with mode [`DIR_MODE`] (0750) and every file (acknowledgements, locks, logs, gap
//! records, prefetched segments and their marks) with [`FILE_MODE`] (0640), less the umask:
//! under PostgreSQL's umask (077) that is 0700/0600; never world access.
use crate::error::{Error, Result};
use crate::io::fs::{DIR_MODE, FILE_MODE};
use crate::options::ArchiveConfig;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the background pusher (and the prefetcher, without a new request) stays with
/// nothing to do before it exits; the next foreground starts another. 2 s in unit tests,
/// which run a prefetcher in a thread and wait for it to end.
pub const IDLE_EXIT: Duration = Duration::from_secs(if cfg!(test) { 2 } else { 10 });

/// How often the background pusher scans archive_status when idle, and how often the
/// foreground looks for its acknowledgement: short, because PostgreSQL's archiver waits for
/// the foreground.
pub(super) const SCAN_EVERY: Duration = Duration::from_millis(5);

pub(super) const ACK_POLL: Duration = Duration::from_millis(2);

/// The free space under which the spool counts as full: a few acknowledgement and lock
/// files and a log line need far less; this is margin.
pub const SPOOL_MIN_FREE: u64 = 64 << 10;

/// The spool directory of one stanza.
pub struct Spool {
    pub(super) dir: PathBuf,
}

impl Spool {
    /// Opens (creating if needed) `<spool-path>/archive/<stanza>` with `out/` and `gap/`.
    ///
    /// Errors: [`Error::Io`] when the spool path cannot be created (it must belong to the
    /// cluster's OS user).
    pub fn open(s: &ArchiveConfig, stanza: &str) -> Result<Spool> {
        let dir = Spool::dir_of(s, stanza);
        for d in [dir.join("out"), dir.join("gap")] {
            crate::io::fs::create_dir_all(&d, DIR_MODE)?;
        }
        Ok(Spool { dir })
    }

    /// `<spool-path>/archive/<stanza>`, the stanza's spool directory (nothing is created).
    pub fn dir_of(s: &ArchiveConfig, stanza: &str) -> PathBuf {
        s.archive.spool_path.join("archive").join(stanza)
    }

    /// Errors with [`Error::Unsafe`] naming the spool when its filesystem has less than
    /// [`SPOOL_MIN_FREE`] bytes left for unprivileged writers (statvfs(2) `f_bavail`): the
    /// background processes could not record their acknowledgements there, so a foreground
    /// would only wait out archive-timeout. Ok when the space cannot be read.
    pub fn check_space(&self) -> Result<()> {
        let Some(free) = crate::io::fs::free_bytes(&self.dir) else {
            return Ok(());
        };
        if free < SPOOL_MIN_FREE {
            return Err(Error::Unsafe(format!(
                "the spool {} is full (no space left on device: {free} bytes free): the background process cannot record what it archived or fetched; free space there or set spool-path to another filesystem",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// `out/<name>.<ext>`.
    pub fn ack(&self, name: &str, ext: &str) -> PathBuf {
        self.dir.join("out").join(format!("{name}.{ext}"))
    }

    /// Writes an acknowledgement (or error) file whole: a temporary file renamed into place.
    pub(super) fn write_ack(&self, name: &str, ext: &str, text: &str) -> Result<()> {
        let p = self.ack(name, ext);
        crate::io::fs::write_whole(&p, text.as_bytes(), FILE_MODE)
    }

    /// Takes `<name>.lock` with flock(2) without waiting: Some(file) while held, None when
    /// another process holds it. The kernel releases it when the holder dies.
    pub fn try_lock(&self, name: &str) -> Result<Option<fs::File>> {
        let p = self.dir.join(format!("{name}.lock"));
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(FILE_MODE)
            .open(&p)
            .map_err(|e| Error::io("open", &p, e))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            Ok(Some(f))
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Ok(None)
            } else {
                Err(Error::io("lock", &p, e))
            }
        }
    }

    /// Path of a background process's log.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    pub(super) fn gap_dir(&self) -> PathBuf {
        self.dir.join("gap")
    }

    /// The mark a foreground leaves when it fails a file ([`crate::pg::archiver`]: after
    /// three failures PostgreSQL's archiver waits up to 60 s before it tries again).
    pub(super) fn archiver_failed(&self) -> PathBuf {
        self.dir.join("archiver-failed")
    }
}

/// A fingerprint of this invocation's resolved settings (flags, `PGJET_*` environment and
/// config file together): a background process started with other settings (the
/// archive_command or pgjet.conf changed) is replaced.
pub(super) fn settings_fingerprint(s: &ArchiveConfig) -> String {
    format!(
        "{:032x}",
        xxhash_rust::xxh3::xxh3_128(format!("{s:?}").as_bytes())
    )
}

/// Records in the held lock file `lock` which process holds it, with which settings, and a
/// token unique to this process's lifetime: `<pid> <fingerprint> <token>`. Returns the token
/// (the prefetcher marks what it writes with it; a PID alone may come again after a reboot).
pub(super) fn write_lock_owner(lock: &mut fs::File, fingerprint: &str) -> String {
    use std::io::{Seek, Write};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let token = format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(
            format!("{} {} {fingerprint}", std::process::id(), now.as_nanos()).as_bytes()
        )
    );
    let _ = lock.set_len(0);
    let _ = lock.seek(std::io::SeekFrom::Start(0));
    let _ = writeln!(lock, "{} {fingerprint} {token}", std::process::id());
    token
}

/// What lock `name`'s file says of its last holder ([`write_lock_owner`]): PID (0 when
/// unreadable), settings fingerprint and token (empty when not written).
pub(super) fn lock_owner(spool: &Spool, name: &str) -> (i32, String, String) {
    let owner = fs::read_to_string(spool.dir.join(format!("{name}.lock"))).unwrap_or_default();
    let mut it = owner.split_whitespace();
    let pid = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let fingerprint = it.next().unwrap_or("").to_string();
    (pid, fingerprint, it.next().unwrap_or("").to_string())
}

/// Starts the background process `name` ("push" or "get") unless one runs with the same
/// settings; one that runs with other settings is stopped (SIGTERM: like a kill -9, it
/// leaves nothing half-done) and replaced. True when it started one.
pub(super) fn ensure_running(
    s: &ArchiveConfig,
    spool: &Spool,
    name: &str,
    command: &str,
    value: &std::ffi::OsStr,
) -> Result<bool> {
    let mine = settings_fingerprint(s);
    if spool.try_lock(name)?.is_none() {
        let (pid, theirs, _) = lock_owner(spool, name);
        if pid <= 0 || theirs.is_empty() || theirs == mine {
            return Ok(false);
        }
        tracing::info!(
            "the background {name} process (PID {pid}) runs with other settings: replacing it"
        );
        // SAFETY: kill(2) with a PID read from our own lock file; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let freed = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            spool.try_lock(name).map(|l| l.is_some()).unwrap_or(false)
        });
        if !freed {
            return Ok(false);
        }
    }
    // The lock was free (and is released again here): start one. Should two starts race,
    // the second finds the lock taken and exits.
    spawn_self(s, spool, name, command, value).map(|_| true)
}

/// Starts this binary again as `<options given on the command line> command -- value` (a
/// hidden subcommand: [`crate::archive::pusher::PUSH_COMMAND`],
/// [`crate::archive::prefetcher::GET_COMMAND`]), in a session of its own (the environment is
/// inherited), its output appended to the spool's `<log>.log`.
pub(super) fn spawn_self(
    s: &ArchiveConfig,
    spool: &Spool,
    log: &str,
    command: &str,
    value: &std::ffi::OsStr,
) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::io("locate", "pgjet", e))?;
    let log_path = spool.log(log);
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .open(&log_path)
        .map_err(|e| Error::io("open", &log_path, e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io("open", &log_path, e))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(s.command_line_flags.clone())
        .args([
            std::ffi::OsStr::new(command),
            std::ffi::OsStr::new("--"),
            value,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid() in the child before exec is async-signal-safe and touches no memory.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| Error::io("start a background process", &log_path, e))?;
    tracing::debug!(
        "started a background {log} process (log {})",
        log_path.display()
    );
    Ok(())
}

/// Moves a prefetched file to `dest`: a rename when both are on one filesystem, else a copy
/// through a temporary file and a rename. False when `src` is gone (the caller fetches the
/// file itself). `dest` is archive-get's `%p`: renamed, it keeps the mode the prefetcher
/// gave it; copied, it gets [`FILE_MODE`] less the umask (see
/// [`crate::io::fs::write_whole`]).
pub(super) fn move_into(src: &Path, dest: &Path) -> Result<bool> {
    match fs::rename(src, dest) {
        Ok(()) => return Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(_) => {}
    }
    let data = match fs::read(src) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io("read", src, e)),
    };
    crate::io::fs::write_whole(dest, &data, FILE_MODE)?;
    let _ = fs::remove_file(src);
    Ok(true)
}

/// The archive settings of a unit test: stanza "main", a posix repository `<dir>/repo`, asynchronous
/// archiving through `<dir>/spool`, archive-timeout `timeout` seconds.
#[cfg(test)]
pub(crate) fn test_settings(dir: &Path, timeout: f64) -> ArchiveConfig {
    crate::options::Settings::from_flags(&[
        ("stanza", "main".into()),
        ("repo-path", dir.join("repo").display().to_string()),
        ("archive-async", "y".into()),
        ("spool-path", dir.join("spool").display().to_string()),
        ("archive-timeout", timeout.to_string()),
    ])
    .unwrap()
    .archive_config()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a umask that removes nothing: the spool path pgjet creates and its directories
    /// are 0750, acknowledgements, errors and lock files 0640.
    #[test]
    fn spool_files_and_directories_get_no_world_access() {
        crate::io::fs::with_umask_in_child(
            "archive::spool::tests::spool_files_and_directories_get_no_world_access",
            0o000,
            || {
                let d = tempfile::tempdir().unwrap();
                let s = test_settings(d.path(), 1.0);
                let spool = Spool::open(&s, "main").unwrap();
                spool
                    .write_ack("000000010000000000000001", "ok", "")
                    .unwrap();
                spool
                    .write_ack("000000010000000000000002", "error", "failed")
                    .unwrap();
                let lock = spool.try_lock("push").unwrap();
                assert!(lock.is_some());
                let root = d.path().join("spool");
                let mode = fs::metadata(&root).unwrap().permissions();
                use std::os::unix::fs::PermissionsExt;
                assert_eq!(mode.mode() & 0o7777, 0o750);
                let all = crate::io::fs::modes_below(&root);
                assert_eq!(all.iter().filter(|(_, d, _)| !d).count(), 3, "{all:?}");
                for (p, is_dir, m) in all {
                    let want = if is_dir { 0o750 } else { 0o640 };
                    assert_eq!(m, want, "{} is {m:04o}", p.display());
                }
            },
        );
    }
}
