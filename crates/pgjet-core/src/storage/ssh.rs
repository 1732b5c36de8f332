//! The ssh control masters behind an SFTP repository, and their end.
//!
//! OpenDAL's SFTP service connects through the `openssh` crate, which starts one `ssh -M -f
//! -N -o ControlPersist=yes` master per pooled connection, its control socket in a temporary
//! directory under `$XDG_STATE_HOME` (else `~/.local/state`). The master outlives its client
//! unless told to exit: the crate does that when a session is closed or dropped, but a
//! connection whose setup is cancelled between the master's start and the session's
//! creation leaves a master whose socket directory is already gone, and a process that exits
//! before a session's closing task has run leaves one too. pgjet therefore gives each
//! process its own state directory ([`own_control_dir`]) and, when it exits, ends whatever
//! master still names it ([`stop_masters`]): no command leaves an ssh process behind.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// This process's private state directory for ssh control sockets, once created.
static CONTROL_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Creates a private directory (mode 0700, under the temporary directory) and points
/// `XDG_STATE_HOME` at it, so that the ssh masters the SFTP store starts keep their control
/// sockets there and name it on their command line.
///
/// Must be called before any other thread runs (it changes the environment) and before the
/// first SFTP connection (the `openssh` crate reads the variable once). Does nothing when
/// called again; a directory that cannot be created leaves the environment as it was (the
/// masters then go to the default place and are closed only by the crate).
pub fn own_control_dir() {
    if CONTROL_DIR.get().is_some() {
        return;
    }
    let Ok(dir) = tempfile::Builder::new().prefix("pgjet-ssh-").tempdir() else {
        return;
    };
    let path = dir.keep();
    // SAFETY: called from main before any other thread is started (see above), so no
    // thread reads the environment concurrently.
    unsafe { std::env::set_var("XDG_STATE_HOME", &path) };
    let _ = CONTROL_DIR.set(path);
}

/// Ends the ssh masters still running with a control socket in this process's directory
/// (SIGTERM: the master closes its connection and exits) and removes the directory.
/// Returns the number of masters signalled. Does nothing when [`own_control_dir`] was not
/// called.
pub fn stop_masters() -> usize {
    let Some(dir) = CONTROL_DIR.get() else {
        return 0;
    };
    let pids = masters_naming(dir);
    for &pid in &pids {
        // SAFETY: kill(2) on a PID read from /proc whose command line names our own private
        // directory; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let _ = std::fs::remove_dir_all(dir);
    pids.len()
}

/// The processes of this user whose command line has an argument inside `dir`
/// (`-S DIR/.ssh-connectionXXXX/master`), read from `/proc/PID/cmdline`.
fn masters_naming(dir: &Path) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as libc::pid_t;
    // SAFETY: getuid(2) has no preconditions.
    let uid = unsafe { libc::getuid() };
    let prefix = dir.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        use std::os::unix::fs::MetadataExt;
        if e.metadata().ok().map(|m| m.uid()) != Some(uid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .split(|&b| b == 0)
            .any(|arg| arg.starts_with(prefix) && arg.get(prefix.len()) == Some(&b'/'))
        {
            pids.push(pid);
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_process_naming_the_directory_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join(".ssh-connectionX/master");
        // `sleep 30` named ARG (argv[0]): a process whose command line holds ARG, that
        // starts no other (a shell's forked child holds its parent's command line until it
        // execs, and was found too under load).
        let holding = |arg: &std::ffi::OsStr| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sleep")
                .arg0(arg)
                .arg("30")
                .spawn()
                .unwrap()
        };
        let mut child = holding(inside.as_os_str());
        let mut other = holding(format!("{}x/master", dir.path().display()).as_ref());
        // Looked for again for up to 2 s: under load (the whole suite beside it) one walk of
        // /proc missed the child once, in CI.
        let want = vec![child.id() as libc::pid_t];
        let mut found = masters_naming(dir.path());
        for _ in 0..40 {
            if found == want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            found = masters_naming(dir.path());
        }
        assert_eq!(found, want);
        child.kill().unwrap();
        other.kill().unwrap();
        child.wait().unwrap();
        other.wait().unwrap();
    }
}
