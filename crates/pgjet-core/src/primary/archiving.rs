//! Whether the cluster being backed up archives its WAL, and waiting for a WAL file to reach
//! the repository while watching PostgreSQL's archiver (`backup`'s archive-check and
//! `check`).
//!
//! WAL is archived when archive_mode is not off and an archive_command or archive_library
//! is set (PostgreSQL src/backend/postmaster/pgarch.c). archive_mode = on with neither set
//! archives nothing while every segment waits in pg_wal for its turn (the `.ready` files of
//! src/backend/access/transam/xlogarchive.c), so that state is refused as pgBackRest's
//! archive-check refuses it; archive_mode = off is a choice (pgjet's backups hold their own
//! WAL), said once with what it costs.
use crate::error::{Error, Result};
use crate::pg::session::{ArchiverStats, Archiving, ServerInfo, Session};
use crate::repo::wal::wait_archived;
use crate::repo::Stanza;

/// How many times PostgreSQL's archiver runs archive_command for one file before it waits
/// a minute (NUM_ARCHIVE_RETRIES in src/backend/postmaster/pgarch.c).
pub const ARCHIVER_TRIES: u64 = 3;

/// The archive_command line that names `config` (when one was read) and `stanza`.
pub fn archive_command_line(config: Option<&std::path::Path>, stanza: &str) -> String {
    match config {
        Some(c) if c != std::path::Path::new(crate::options::DEFAULT_CONFIG) => {
            format!(
                "archive_command = 'pgjet --config {} --stanza={stanza} archive-push %p'",
                c.display()
            )
        }
        _ => format!("archive_command = 'pgjet --stanza={stanza} archive-push %p'"),
    }
}

/// The misconfiguration of `a` that archives nothing while PostgreSQL keeps every segment
/// waiting in pg_wal (archive_mode on or always, no archive_command or archive_library),
/// said; None otherwise.
fn nothing_archived(a: &Archiving) -> Option<String> {
    (a.mode != "off" && !a.active()).then(|| {
        format!(
            "archive_mode is {} but archive_command is empty (and no archive_library): PostgreSQL archives nothing and keeps every WAL segment in pg_wal",
            a.mode
        )
    })
}

/// What a backup does about the archive, decided before it starts: Ok(true) when it waits
/// for its WAL in the archive. Logs what the user should know (a standby, archive-check=n,
/// no archiving at all: no point-in-time recovery past the backup).
///
/// Errors: [`Error::Unsafe`] when archive_mode is on and nothing archives (archive-check=y;
/// with archive-check=n a warning instead).
pub fn backup_waits_for_archive(
    a: &Archiving,
    info: &ServerInfo,
    archive_check: bool,
    command_line: &str,
) -> Result<bool> {
    if let Some(what) = nothing_archived(a) {
        if archive_check {
            return Err(Error::Unsafe(format!(
                "{what}; the backup's WAL would never reach the archive"
            ))
            .with_hint(format!(
                "set {command_line} and reload (SELECT pg_reload_conf()), then run `pgjet check`; archive-check=n (--archive-check=n) takes the backup anyway, with its own WAL only"
            )));
        }
        tracing::warn!("{what}; archive-check=n: backing up anyway, with the backup's own WAL only (no point-in-time recovery past it); fix: {command_line}");
        return Ok(false);
    }
    if !a.active() {
        tracing::warn!(
            "WAL is not archived (archive_mode = off): this backup restores to its own end, but point-in-time recovery past it is impossible; to archive, set archive_mode = on and {command_line}"
        );
        return Ok(false);
    }
    if info.in_recovery {
        tracing::info!("backup of a standby: not waiting for the backup's WAL in the archive (the backup holds its own WAL)");
        return Ok(false);
    }
    if !archive_check {
        tracing::info!("archive-check=n: not waiting for the backup's WAL in the archive");
        return Ok(false);
    }
    Ok(true)
}

/// Waits (up to `timeout` seconds) until WAL file `name` is in `st`'s archive, as
/// [`wait_archived`], and stops at once when PostgreSQL's archiver, read by `archiver`
/// (pg_stat_archiver, first read once the file is a second late), is seen failing
/// ([`archiver_blocks`]). With `patient` (a backup, whose copy would be lost), an archiver
/// already stuck on an earlier file is given its next try (it waits up to a minute between
/// rounds of tries) until the timeout; `check` is not patient. Returns the seconds waited.
///
/// Errors: [`Error::Unsafe`] quoting pg_stat_archiver's last failure; `archiver`'s; as
/// [`wait_archived`].
pub fn wait_for_archive(
    archiver: &mut dyn FnMut() -> Result<ArchiverStats>,
    st: &Stanza,
    name: &str,
    timeout: f64,
    patient: bool,
) -> Result<f64> {
    let mut first: Option<(ArchiverStats, std::time::Instant)> = None;
    wait_archived(st, name, timeout, &mut || {
        let now = archiver()?;
        let (start, at) = first.get_or_insert_with(|| (now.clone(), std::time::Instant::now()));
        let seconds = if patient {
            0.0
        } else {
            at.elapsed().as_secs_f64()
        };
        match archiver_blocks(start, &now, name, seconds) {
            true => Err(archiver_failure(&now, name)),
            false => Ok(()),
        }
    })
}

/// Seconds an archiver that was failing on an earlier file when first looked at must stay
/// idle (no success, no new failure) before a wait gives up: time for one woken by a
/// reload (a fixed archive_command) to archive something.
pub const STUCK_SECONDS: f64 = 2.0;

/// True when the archiver, seen as `now` (and as `start` when first looked at, `seconds`
/// ago), cannot deliver WAL file `name`: it is failing on that file or an earlier one, and
/// either it was failing on an earlier file when first looked at and has done nothing since
/// (PostgreSQL's archiver waits a minute after [`ARCHIVER_TRIES`] failures), or it has
/// failed [`ARCHIVER_TRIES`] more times since (one failure may be followed by a retry that
/// Waits until the last WAL segment a backup needs is in the archive of `stanza`: the
/// backup ran from `lsns` (start, stop, timeline) on a cluster of `seg_size`-byte segments.
/// The archiver's progress (pg_stat_archiver) is read on a session of its own to `conn`,
/// opened only if the segment is late; with `replication_only` it cannot be read, and the
/// wait watches the repository alone. Returns the first and last segment names the backup
/// needs.
///
/// Errors: the segment not archived within `timeout` seconds (naming the archiver's last
/// failure when known); the server's; the repository's.
pub fn wait_for_backup_wal(
    conn: &crate::options::PrimaryConn,
    stanza: &Stanza,
    lsns: (crate::pg::lsn::Lsn, crate::pg::lsn::Lsn, u32),
    seg_size: u64,
    timeout: f64,
    replication_only: bool,
) -> Result<(String, String)> {
    use crate::pg::lsn;
    let (start_lsn, stop_lsn, tli) = lsns;
    let first = lsn::wal_segment_name(tli, lsn::segno_of(start_lsn, seg_size), seg_size);
    let last = lsn::wal_segment_name(tli, lsn::prev_segno_of(stop_lsn, seg_size), seg_size);
    let mut side: Option<Session> = None;
    if replication_only {
        tracing::info!(
            "the role may connect for replication only: pg_stat_archiver cannot be read, so a failing archive_command shows only as the wait's timeout ({timeout} s)"
        );
    }
    let mut archiver = || match &side {
        Some(x) => x.archiver(),
        // Nothing known of the archiver: the wait only watches the repository.
        None if replication_only => Ok(ArchiverStats::default()),
        None => {
            let x = Session::connect(&super::primary_target(conn)?)?;
            let a = x.archiver();
            side = Some(x);
            a
        }
    };
    let waited = wait_for_archive(&mut archiver, stanza, &last, timeout, true)?;
    tracing::info!(
        "WAL segment {last} is in the archive (waited {waited:.1} s); the backup needs {first} to {last}"
    );
    Ok((first, last))
}

/// works).
pub fn archiver_blocks(
    start: &ArchiverStats,
    now: &ArchiverStats,
    name: &str,
    seconds: f64,
) -> bool {
    let comparable = |w: &str| w.len() == name.len();
    let at_or_before = !comparable(&now.last_failed_wal) || now.last_failed_wal.as_str() <= name;
    let stuck = start.failing
        && (!comparable(&start.last_failed_wal) || start.last_failed_wal.as_str() < name)
        && now.last_archived_wal == start.last_archived_wal
        && now.failed_count == start.failed_count
        && seconds >= STUCK_SECONDS;
    now.failing
        && at_or_before
        && (stuck || now.failed_count >= start.failed_count + ARCHIVER_TRIES)
}

/// The error of a failing archiver, quoting pg_stat_archiver.
pub fn archiver_failure(now: &ArchiverStats, name: &str) -> Error {
    Error::Unsafe(format!(
        "PostgreSQL's archiver is failing: archive_command failed for {} at {} ({} failures in pg_stat_archiver; last archived: {}), so WAL file {name} cannot reach the archive",
        now.last_failed_wal,
        now.last_failed_time,
        now.failed_count,
        if now.last_archived_wal.is_empty() { "none" } else { &now.last_archived_wal },
    ))
    .with_hint("the server log has archive_command's own error; fix it (archive_command = 'pgjet [--config FILE] --stanza=NAME archive-push %p') and run the command again: PostgreSQL retries a failed file every minute")
}

/// The check of `check`: whether the cluster archives and, when it does, that a WAL switch
/// reaches every repository (see [`crate::commands`]'s check). Returns its lines, and the
/// problem that fails `check` when there is one.
pub fn check_archiving(
    sess: &Session,
    info: &ServerInfo,
    repos: &[Stanza],
    timeout: f64,
    command_line: &str,
) -> Result<(Vec<String>, Option<Error>)> {
    let a = crate::remote::control::Control::archiving(sess)?;
    if let Some(what) = nothing_archived(&a) {
        let e = Error::Unsafe(what).with_hint(format!(
            "set {command_line} and reload (SELECT pg_reload_conf())"
        ));
        return Ok((vec![format!("PROBLEM: {}", e.kind())], Some(e)));
    }
    if !a.active() {
        return Ok((
            vec![format!(
                "note: WAL is not archived (archive_mode = off): backups hold their own WAL; point-in-time recovery needs archive_mode = on and {command_line}"
            )],
            None,
        ));
    }
    if info.in_recovery {
        return Ok((
            vec!["the cluster is a standby: the WAL switch check runs on the primary".into()],
            None,
        ));
    }
    sess.create_restore_point("pgjet archive check")?;
    let segment = sess.switch_wal()?;
    let mut lines = Vec::new();
    for st in repos {
        let n = st.repo();
        match wait_for_archive(&mut || sess.archiver(), st, &segment, timeout, false) {
            Ok(waited) => lines.push(format!(
                "repo{n}: WAL segment {segment} (after pg_switch_wal) reached the archive in {waited:.1} s"
            )),
            Err(e @ Error::Hinted { .. }) | Err(e @ Error::Unsafe(_)) => {
                lines.push(format!("PROBLEM: repo{n}: {}", e.kind()));
                return Ok((lines, Some(e)));
            }
            Err(e) => return Err(e),
        }
    }
    Ok((lines, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(failing: bool, count: u64, wal: &str) -> ArchiverStats {
        ArchiverStats {
            failed_count: count,
            last_failed_wal: wal.into(),
            failing,
            ..ArchiverStats::default()
        }
    }

    #[test]
    fn the_archiver_blocks_when_it_fails_on_the_file_or_before() {
        let seg = "000000010000000000000005";
        // Failing on an earlier segment when first looked at, and idle since: stuck.
        let early = stats(true, 3, "000000010000000000000004");
        assert!(archiver_blocks(&early, &early, seg, STUCK_SECONDS));
        assert!(!archiver_blocks(&early, &early, seg, 0.5), "not yet");
        // ... but one that archived something since was woken (a fixed command): not stuck.
        let mut woken = early.clone();
        woken.last_archived_wal = "000000010000000000000004".into();
        assert!(!archiver_blocks(&early, &woken, seg, 10.0));
        // A first failure on this very segment may be retried with success.
        assert!(!archiver_blocks(
            &stats(true, 1, seg),
            &stats(true, 1, seg),
            seg,
            10.0
        ));
        // One new failure may be a retry that works: not yet; three are.
        let start = stats(false, 0, "");
        assert!(!archiver_blocks(&start, &stats(true, 1, seg), seg, 1.0));
        assert!(archiver_blocks(&start, &stats(true, 3, seg), seg, 1.0));
        // A failure on a later file, or none now, does not block this one.
        let later = stats(true, 3, "000000010000000000000009");
        assert!(!archiver_blocks(
            &later,
            &stats(true, 9, "000000010000000000000009"),
            seg,
            9.0
        ));
        assert!(!archiver_blocks(&start, &stats(false, 5, seg), seg, 9.0));
        // A history file's failure blocks (the archiver goes in order of .ready files).
        let h = stats(true, 3, "00000002.history");
        assert!(archiver_blocks(&h, &h, seg, 3.0));
    }

    #[test]
    fn the_archive_command_names_a_config_that_is_not_the_default() {
        assert_eq!(
            archive_command_line(Some(std::path::Path::new("/srv/pgjet.conf")), "main"),
            "archive_command = 'pgjet --config /srv/pgjet.conf --stanza=main archive-push %p'"
        );
        assert_eq!(
            archive_command_line(
                Some(std::path::Path::new(crate::options::DEFAULT_CONFIG)),
                "main"
            ),
            "archive_command = 'pgjet --stanza=main archive-push %p'"
        );
    }
}
