//! PostgreSQL's WAL archiver process, seen from the host it runs on: finding it and waking it.
//!
//! After `archive_command` has failed three times in a row (`NUM_ARCHIVE_RETRIES`), the
//! archiver gives up for the moment and waits on its latch for up to 60 s
//! (`PGARCH_AUTOWAKE_INTERVAL`, src/backend/postmaster/pgarch.c) before it scans
//! `archive_status` again. A segment completing sets that latch, and so does SIGUSR1: since
//! PostgreSQL 14 the archiver handles it with `procsignal_sigusr1_handler`, which ends with
//! `SetLatch(MyLatch)`; before 14 its own `pgarch_waken` did the same. A SIGUSR1 that carries
//! no procsignal reason does nothing else, so waking the archiver this way is harmless.
use crate::error::{Error, Result};
use std::fs;
use std::path::Path;

/// The PID of the postmaster of `data_dir`, from the first line of its `postmaster.pid`.
/// None when there is no such file (the cluster is down) or it does not start with a PID.
fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// The parent PID in the text of `/proc/<pid>/stat` (its fourth field, after the command
/// name in parentheses, which may itself hold spaces and parentheses).
fn parent_pid(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process title (`/proc/<pid>/cmdline`, NUL bytes as separators) is that of a
/// WAL archiver: `postgres: archiver ...`, or `postgres: <cluster_name>: archiver ...` (the
/// title PostgreSQL sets with init_ps_display, src/backend/utils/misc/ps_status.c).
fn is_archiver_title(cmdline: &[u8]) -> bool {
    let title = String::from_utf8_lossy(cmdline).replace('\0', " ");
    let Some(rest) = title.trim().strip_prefix("postgres: ") else {
        return false;
    };
    let mut words = rest.split_whitespace();
    let first = words.next().unwrap_or("");
    first == "archiver" || (first.ends_with(':') && words.next() == Some("archiver"))
}

/// The PID of the WAL archiver of the cluster running in `data_dir`: the child of its
/// postmaster whose process title says archiver. None when the cluster is down, archives
/// nothing (`archive_mode=off`), or runs where this process cannot see it.
pub fn archiver_pid(data_dir: &Path) -> Option<u32> {
    let postmaster = postmaster_pid(data_dir)?;
    let rd = fs::read_dir("/proc").ok()?;
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parent_pid(&stat) != Some(postmaster) {
            continue;
        }
        if fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_archiver_title(&c)) {
            return Some(pid);
        }
    }
    None
}

/// Wakes the WAL archiver of the cluster running in `data_dir` (SIGUSR1), so that it runs
/// `archive_command` for the files still ready now rather than at the end of its wait of up to
/// 60 s. Returns the archiver's PID, or None when there is none to wake ([`archiver_pid`]).
///
/// Errors: [`Error::Other`] when the signal cannot be sent (another user's cluster).
pub fn wake_archiver(data_dir: &Path) -> Result<Option<u32>> {
    let Some(pid) = archiver_pid(data_dir) else {
        return Ok(None);
    };
    // SAFETY: kill(2) with a PID found as the postmaster's archiver child; no memory involved.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) } != 0 {
        return Err(Error::Other(format!(
            "cannot wake PostgreSQL's archiver (PID {pid}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(Some(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archiver_is_known_by_its_title_and_parent() {
        assert!(is_archiver_title(b"postgres: archiver \0\0"));
        assert!(is_archiver_title(
            b"postgres: archiver last was 000000010000000000000003"
        ));
        assert!(is_archiver_title(
            b"postgres: main: archiver failed on 00000001000000000000000A"
        ));
        assert!(!is_archiver_title(b"postgres: checkpointer "));
        assert!(!is_archiver_title(b"postgres: archiver: checkpointer "));
        assert!(!is_archiver_title(b"/usr/bin/pgjet archive-push pg_wal/x"));
        assert_eq!(
            parent_pid("4242 (postgres: a (b)) S 17 4242 4242 0"),
            Some(17)
        );
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn no_postmaster_pid_means_no_archiver() {
        let dir = std::env::temp_dir().join(format!("pgjet-archiver-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(archiver_pid(&dir), None);
        assert_eq!(wake_archiver(&dir).unwrap(), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
