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
use std::path::Path;

/// Whether a process title is that of a WAL archiver: `postgres: archiver ...`, or
/// `postgres: <cluster_name>: archiver ...` (the title PostgreSQL sets with
/// init_ps_display, src/backend/utils/misc/ps_status.c).
fn is_archiver_title(title: &str) -> bool {
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
    super::processes::postmaster_child(data_dir, is_archiver_title)
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
    fn an_archiver_is_known_by_its_title() {
        assert!(is_archiver_title("postgres: archiver "));
        assert!(is_archiver_title(
            "postgres: archiver last was 000000010000000000000003"
        ));
        assert!(is_archiver_title(
            "postgres: main: archiver failed on 00000001000000000000000A"
        ));
        assert!(!is_archiver_title("postgres: checkpointer "));
        assert!(!is_archiver_title("postgres: archiver: checkpointer "));
        assert!(!is_archiver_title("/usr/bin/pgjet archive-push pg_wal/x"));
    }

    #[test]
    fn no_postmaster_pid_means_no_archiver() {
        let dir = std::env::temp_dir().join(format!("pgjet-archiver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(archiver_pid(&dir), None);
        assert_eq!(wake_archiver(&dir).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
