//! Turning an existing data directory into a copy of a source by changing only what differs
//! (`replica-create --delta`, `restore --delta`): the target checks, the clean-up of everything a full copy
//! would not hold, and the marker that proves an unfinished directory's identity.
//!
//! The result must be indistinguishable from a full copy: after [`clean_target`] the target
//! holds only the source listing's directories and files (the copy then fixes their
//! contents), and pg_control is written last, as in a full copy.
use super::{create_cluster_dir, DataDirModes};
use crate::error::{Error, Result};
use crate::pg::datadir::Listing;
use crate::pg::lsn::Lsn;
use crate::pg::walscan::WalAt;
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Name of the marker pgjet keeps in a data directory while it is being written (removed
/// once pg_control is in place): JSON with the source's system identifier, so that a copy
/// that was interrupted before pg_control existed can be finished with --delta.
pub const MARKER: &str = "pgjet.incomplete";

/// What a delta target is.
#[derive(Debug, PartialEq, Eq)]
pub enum DeltaTarget {
    /// Missing or empty: a full copy.
    Empty,
    /// A data directory of the same cluster.
    SameCluster,
}

/// Checks that `dir` may be overwritten with a copy of the cluster whose system identifier
/// is `system_identifier`: no postmaster.pid (a server may run there), and its pg_control,
/// or pgjet's marker when pg_control is missing or damaged (a copy killed while writing it),
/// names the same cluster.
///
/// Errors: [`Error::Unsafe`] naming the reason.
pub fn check_delta_target(dir: &Path, system_identifier: u64) -> Result<DeltaTarget> {
    match fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DeltaTarget::Empty),
        Err(e) => return Err(Error::io("list", dir, e)),
        Ok(mut rd) => {
            if rd.next().is_none() {
                return Ok(DeltaTarget::Empty);
            }
        }
    }
    if dir.join("postmaster.pid").exists() {
        return Err(Error::Unsafe(format!(
            "{} holds a postmaster.pid: PostgreSQL may be running there; stop it first (remove postmaster.pid only if no server runs)",
            dir.display()
        )));
    }
    let control = dir.join("global/pg_control");
    let readable = match control.exists() {
        false => None,
        // With pgjet's marker the directory is its own unfinished copy, whose pg_control
        // (the last file written) a copy killed while writing it left half written: the
        // marker then names the cluster.
        true => match crate::pg::control::read_system_identifier(dir) {
            Ok(id) => Some(id),
            Err(e) if dir.join(MARKER).exists() => {
                tracing::info!(
                    "{}: {e}; pgjet's {MARKER} names the cluster of this unfinished copy",
                    dir.display()
                );
                None
            }
            Err(e) => return Err(e),
        },
    };
    if let Some(id) = readable {
        if id != system_identifier {
            return Err(Error::Unsafe(format!(
                "{} belongs to another cluster (system identifier {id}, the source's is {system_identifier}); --delta only re-syncs a copy of the same cluster",
                dir.display()
            )));
        }
        return Ok(DeltaTarget::SameCluster);
    }
    match read_marker(dir) {
        Some(id) if id == system_identifier => Ok(DeltaTarget::SameCluster),
        Some(id) => Err(Error::Unsafe(format!(
            "{} holds an unfinished copy of another cluster (system identifier {id}); remove it or choose another directory",
            dir.display()
        ))),
        None => Err(Error::Unsafe(format!(
            "{} is not empty and has neither global/pg_control nor pgjet's {MARKER}: nothing proves it is a copy of this cluster; empty it and run without --delta",
            dir.display()
        ))),
    }
}

/// Where WAL replay of a delta target would start, and what proves how far its WAL goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPoint {
    /// The timeline of `redo`.
    pub timeline: u32,
    /// Where replay would start: every block that may differ from the source was changed by
    /// WAL from here on.
    pub redo: Lsn,
    /// The latest checkpoint record.
    pub checkpoint: Lsn,
    /// Shut down cleanly as a primary: it wrote no WAL after `checkpoint`.
    pub shut_down_primary: bool,
    /// `minRecoveryPoint` (LSN, timeline), when set: no page written in recovery holds a
    /// change from WAL past it; a promoted server sets it to its end-of-recovery record.
    pub min_recovery: Option<(Lsn, u32)>,
    /// The newest timeline the target's own WAL reached (its pg_wal's segments and history
    /// files, its checkpoint's and minimum recovery point's timelines).
    pub last_timeline: u32,
    /// The history of `last_timeline` as the target's own history file says ((parent
    /// timeline, switch point), oldest first; empty on timeline 1 or when it has none).
    pub own_history: Vec<(u32, Lsn)>,
    /// Its pages were written by this directory's own server, so its own WAL bounds them;
    /// false for a copy holding a backup_label (its pages came from another server, up to a
    /// backup end it does not record).
    pub own_pages: bool,
}

/// The newest timeline named in `dir/pg_wal` (segments, `.partial` segments, history files),
/// and that timeline's history as its own history file says. Unreadable: (0, empty).
fn own_timelines(dir: &Path) -> (u32, Vec<(u32, Lsn)>) {
    let Ok(rd) = fs::read_dir(dir.join("pg_wal")) else {
        return (0, Vec::new());
    };
    let newest = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let segment = name.strip_suffix(".partial").unwrap_or(&name);
            let named = name.ends_with(".history") && name.len() == 16
                || crate::pg::lsn::is_wal_segment_name(segment);
            named
                .then(|| u32::from_str_radix(&name[..8], 16).ok())
                .flatten()
        })
        .max()
        .unwrap_or(0);
    let history = if newest > 1 {
        fs::read_to_string(
            dir.join("pg_wal")
                .join(crate::pg::lsn::history_file_name(newest)),
        )
        .map(|t| crate::pg::lsn::parse_history(&t))
        .unwrap_or_default()
    } else {
        Vec::new()
    };
    (newest, history)
}

/// The point from which WAL summaries list every block that may differ between the data
/// directory `dir` and its source ([`TargetPoint`]): where WAL replay of `dir` would start.
/// That is its latest checkpoint's redo point (pg_control), or, while `dir` holds a
/// `backup_label` (a copy not yet started), the label's start (`START WAL LOCATION`,
/// `START TIMELINE`): the pages of a copy were read after that point, its pg_control
/// later still. None when nothing proves it: pg_control missing or damaged, a
/// backup_label that does not parse, or pgjet's marker present (an unfinished copy holds
/// blocks from a later point than its pg_control says).
///
/// Why the redo point: every page on disk was either written before that checkpoint
/// completed, or changed by WAL after its redo point (a page dirtied again is in the WAL
/// from there on, a page torn by a crash too); PostgreSQL's own incremental backup takes
/// the blocks changed since its reference's start, which is such a redo point.
pub fn summaries_since(dir: &Path) -> Option<TargetPoint> {
    use crate::pg::control::DbState;
    if dir.join(MARKER).exists() {
        return None;
    }
    let c = crate::pg::control::read_control(dir).ok()?;
    match fs::read_to_string(dir.join("backup_label")) {
        Ok(text) => {
            let l = crate::pg::lsn::parse_backup_label(&text).ok()?;
            Some(TargetPoint {
                timeline: l.start_timeline,
                redo: l.start_lsn.min(c.redo),
                checkpoint: l.checkpoint_lsn,
                shut_down_primary: false,
                min_recovery: None,
                last_timeline: l.start_timeline,
                own_history: Vec::new(),
                own_pages: false,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (wal_tli, own_history) = own_timelines(dir);
            let last_timeline = c
                .timeline
                .max(wal_tli)
                .max(c.min_recovery.map_or(0, |m| m.1));
            Some(TargetPoint {
                timeline: c.timeline,
                redo: c.redo,
                checkpoint: c.checkpoint,
                shut_down_primary: c.state == DbState::ShutDown,
                min_recovery: c.min_recovery,
                last_timeline,
                own_history,
                own_pages: true,
            })
        }
        Err(_) => None,
    }
}

/// [`timeline_path`]'s test of the target `dir`'s own WAL: what its pg_wal holds at an LSN
/// on a timeline ([`WalAt`]; segments of `seg_size` bytes, named as PostgreSQL names them).
pub fn own_wal(dir: &Path, seg_size: u64) -> impl Fn(u32, Lsn) -> WalAt + '_ {
    move |tli, lsn| crate::pg::walscan::record_at(own_segment(dir, tli, seg_size), seg_size, lsn)
}

/// The target `dir`'s own WAL segments of timeline `tli` by segment number, as
/// [`crate::pg::walscan`] reads them: the whole file, or None when pg_wal has no such
/// segment (a promoted server renames its old timeline's last segment `.partial`: that
/// one is read too).
///
/// Errors: a segment that is there but cannot be read.
pub fn own_segment(
    dir: &Path,
    tli: u32,
    seg_size: u64,
) -> impl FnMut(u64) -> Result<Option<Vec<u8>>> + '_ {
    move |segno| {
        let name = crate::pg::lsn::wal_segment_name(tli, segno, seg_size);
        for n in [name.clone(), format!("{name}.partial")] {
            let p = dir.join("pg_wal").join(n);
            match fs::read(&p) {
                Ok(b) => return Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("read", &p, e)),
            }
        }
        Ok(None)
    }
}

/// The WAL between `target`'s redo point and `start` (the copy's start on the source's
/// timeline `source_tli`) as (timeline, from, to) parts, oldest first, following the
/// source's timeline history `history` ((parent timeline, switch point) lines of its
/// history file, oldest first; empty on timeline 1). `own_wal_at(timeline, lsn)` says what
/// the target's own pg_wal holds at `lsn` on `timeline` ([`own_wal`]). Err says why the
/// source's WAL cannot stand for the target's changes:
/// - the target's timelines (its checkpoint's, the newest its WAL reached) are not on the
///   source's history, or its own history file says they switched elsewhere;
/// - the target went through an older timeline and may hold changes from WAL past that
///   timeline's switch point, which the source never had: its latest checkpoint is at or
///   past it, its own WAL goes on past it (or cannot be read there), or its
///   `minRecoveryPoint` lies off the source's history; or its pages came from a copy
///   (a backup_label) whose end it does not record.
///
/// Why that proves every change on disk is on the source's history: a page is written only
/// after the WAL of its changes is flushed (the WAL-before-data rule), and the target's WAL
/// from its redo point on is all in its pg_wal (none of it is removed before a later
/// checkpoint; WAL a standby restores from an archive is kept there too), so a target whose
/// WAL on each older timeline stops at that timeline's switch point wrote no page with a
/// change past it; a standby never writes a page past its `minRecoveryPoint` (xlog.c
/// UpdateMinRecoveryPoint), which a promotion sets to its end-of-recovery record. A target
/// shut down cleanly as a primary with its shutdown checkpoint before the switch point
/// wrote nothing after it (PostgreSQL's own test for a rewind that is not needed,
/// src/bin/pg_rewind); a demoted primary, or a standby, stopped by `-m immediate` after a
/// switchover passes the WAL test.
pub fn timeline_path(
    history: &[(u32, Lsn)],
    source_tli: u32,
    target: &TargetPoint,
    start: Lsn,
    own_wal_at: &dyn Fn(u32, Lsn) -> WalAt,
) -> std::result::Result<Vec<(u32, Lsn, Lsn)>, String> {
    if target.redo > start {
        return Err(format!(
            "the target's redo point {} is past this copy's start {start}",
            target.redo
        ));
    }
    // Where the source's history leaves timeline `t` (None: `t` is the source's own).
    let switch_of = |t: u32| -> std::result::Result<Option<Lsn>, String> {
        if t == source_tli {
            return Ok(None);
        }
        history
            .iter()
            .find(|(h, _)| *h == t)
            .map(|h| Some(h.1))
            .ok_or_else(|| {
                format!(
                    "the target is on timeline {t}, which is not in the history of the primary's timeline {source_tli}"
                )
            })
    };
    let last = target.last_timeline.max(target.timeline);
    switch_of(last)?;
    for &(t, at) in &target.own_history {
        if switch_of(t)? != Some(at) {
            return Err(format!(
                "the target's own history says timeline {t} ended at {at}, the primary's does not: another history"
            ));
        }
    }
    let Some(switch) = switch_of(target.timeline)? else {
        // Checkpoint and WAL on the source's own timeline.
        return Ok(vec![(source_tli, target.redo, start)]);
    };
    if target.checkpoint >= switch {
        return Err(format!(
            "the target's latest checkpoint {} on timeline {} is at or past the switch point {switch}: it wrote WAL the primary does not have",
            target.checkpoint, target.timeline
        ));
    }
    if !(target.shut_down_primary && last == target.timeline) {
        if !target.own_pages {
            return Err(format!(
                "the target is a copy on timeline {} (a backup_label), the primary on {source_tli}: how far its pages go is not recorded",
                target.timeline
            ));
        }
        // Each older timeline the target went through must end, in its own WAL, where
        // the primary's history leaves it.
        for (t, s) in history
            .iter()
            .copied()
            .skip_while(|(t, _)| *t != target.timeline)
            .take_while(|(t, _)| *t <= last)
        {
            let next = history
                .iter()
                .find(|(h, _)| *h > t)
                .map_or(source_tli, |h| h.0);
            match own_wal_at(t, s) {
                WalAt::End => {}
                WalAt::Record => {
                    return Err(format!(
                        "the target's own WAL on timeline {t} goes on past the switch point {s} to timeline {next}: it may hold changes the primary never had"
                    ))
                }
                WalAt::Unknown(why) => {
                    return Err(format!(
                        "the target's own WAL on timeline {t} cannot tell whether it stops at the switch point {s} ({why})"
                    ))
                }
            }
        }
        if let Some((lsn, tli)) = target.min_recovery {
            let on_history = match switch_of(tli) {
                Ok(None) => lsn <= start,
                Ok(Some(end)) => lsn <= end,
                Err(_) => false,
            };
            if !on_history {
                return Err(format!(
                    "the target's minimum recovery point {lsn} on timeline {tli} is not on the primary's history: it may hold changes the primary never had"
                ));
            }
        }
    }
    let i = history
        .iter()
        .position(|(t, _)| *t == target.timeline)
        .unwrap_or(history.len());
    let mut path = vec![(target.timeline, target.redo, switch)];
    for w in history[i..].windows(2) {
        path.push((w[1].0, w[0].1, w[1].1));
    }
    let end = history.last().map(|h| h.1).unwrap_or(switch);
    path.push((source_tli, end, start));
    Ok(path)
}

fn read_marker(dir: &Path) -> Option<u64> {
    let text = fs::read_to_string(dir.join(MARKER)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("system_identifier")?.as_str()?.parse().ok()
}

/// Writes the marker (durably) before anything else changes in `dir`.
pub fn write_marker(dir: &Path, system_identifier: u64) -> Result<()> {
    let text = format!(
        "{{\"system_identifier\": \"{system_identifier}\", \"note\": \"pgjet is writing this data directory; it is not usable until this file is gone\"}}\n"
    );
    crate::io::fs::write_file(&dir.join(MARKER), text.as_bytes(), 0o600)?;
    crate::io::fs::fsync_dir(dir)
}

/// Removes the marker once pg_control is durable.
pub fn remove_marker(dir: &Path) -> Result<()> {
    match fs::remove_file(dir.join(MARKER)) {
        Ok(()) => crate::io::fs::fsync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", dir.join(MARKER), e)),
    }
}

/// Makes the target's layout match `listing`: tablespace links point to `locations`
/// (created if missing), every listed directory exists, and every file or directory the
/// listing does not hold is removed: files the source lacks, what a base backup excludes
/// (old WAL, postmaster.opts, backup_label, pg_replslot contents, temporary files, unlogged
/// relations' main forks, ...) and global/pg_control (written last). Returns the number of
/// entries removed.
///
/// Errors: a directory or file that cannot be listed, created or removed.
pub fn clean_target(
    pg_path: &Path,
    locations: &[(u32, PathBuf)],
    listing: &Listing,
) -> Result<usize> {
    let modes = DataDirModes::of_listing(&listing.dirs);
    let mut removed = set_tablespace_links(pg_path, locations, modes.dir)?;
    let dirs: HashSet<&str> = listing.dirs.iter().map(|(d, _)| d.as_str()).collect();
    let files: HashSet<&str> = listing.files.iter().map(|f| &*f.path).collect();
    removed += remove_unlisted(pg_path, &dirs, &files)?;
    for (rel, mode) in &listing.dirs {
        if let Some(rest) = rel.strip_prefix("pg_tblspc/") {
            if !rest.contains('/') {
                continue;
            }
        }
        let p = pg_path.join(rel);
        let mode = if *mode == 0 { modes.dir } else { *mode };
        if !p.is_dir() {
            crate::io::fs::create_dir_all(&p, mode)?;
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("chmod", &p, e))?;
    }
    Ok(removed)
}

/// Makes `pg_path` (created if missing, mode `dir_mode`) hold exactly the tablespace links
/// of `locations` under pg_tblspc, each pointing where it should (its directory created if
/// missing). Returns the number of links removed.
///
/// Errors: a directory or link that cannot be listed, created or removed.
pub fn set_tablespace_links(
    pg_path: &Path,
    locations: &[(u32, PathBuf)],
    dir_mode: u32,
) -> Result<usize> {
    create_cluster_dir(pg_path, dir_mode)?;
    let tblspc = pg_path.join("pg_tblspc");
    crate::io::fs::create_dir_all(&tblspc, dir_mode)?;
    let wanted: HashSet<String> = locations.iter().map(|(o, _)| o.to_string()).collect();
    let mut removed = 0;
    for ent in fs::read_dir(&tblspc).map_err(|e| Error::io("list", &tblspc, e))? {
        let ent = ent.map_err(|e| Error::io("list", &tblspc, e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if !wanted.contains(&name) {
            remove_any(&ent.path())?;
            removed += 1;
        }
    }
    for (oid, dir) in locations {
        create_cluster_dir(dir, dir_mode)?;
        let link = tblspc.join(oid.to_string());
        let ok = fs::read_link(&link).map(|t| t == *dir).unwrap_or(false);
        if !ok {
            if fs::symlink_metadata(&link).is_ok() {
                remove_any(&link)?;
            }
            std::os::unix::fs::symlink(dir, &link)
                .map_err(|e| Error::io("create tablespace link", &link, e))?;
        }
    }
    Ok(removed)
}

/// Removes from `pg_path` every directory not in `dirs` and every file not in `files`
/// (paths relative to the data directory; `pg_tblspc/<oid>` links and `pg_wal` are
/// followed, and are kept themselves), and global/pg_control (written last). pgjet's marker
/// stays. Returns the number of entries removed.
///
/// Errors: a directory or file that cannot be listed or removed.
pub fn remove_unlisted<S: std::borrow::Borrow<str> + std::hash::Hash + Eq>(
    pg_path: &Path,
    dirs: &HashSet<S>,
    files: &HashSet<S>,
) -> Result<usize> {
    let mut removed = 0;
    // Walk the target; pg_tblspc/<oid> links are followed into their version directory.
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let abs = pg_path.join(&rel);
        let rd = match fs::read_dir(&abs) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("list", &abs, e)),
        };
        for ent in rd {
            let ent = ent.map_err(|e| Error::io("list", &abs, e))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if rel.is_empty() && name == MARKER {
                continue;
            }
            let path = ent.path();
            let is_tblspc_link = rel == "pg_tblspc";
            let is_dir = if is_tblspc_link || (rel.is_empty() && name == "pg_wal") {
                path.is_dir()
            } else {
                ent.file_type().map(|t| t.is_dir()).unwrap_or(false)
            };
            let keep_dir = dirs.contains(child.as_str())
                || is_tblspc_link
                || (rel.is_empty() && name == "pg_tblspc");
            if is_dir {
                if keep_dir {
                    stack.push(child);
                } else {
                    remove_any(&path)?;
                    removed += 1;
                }
            } else if child == "global/pg_control" || !files.contains(child.as_str()) {
                remove_any(&path)?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// Gets a kept copy of the same cluster ready for a delta from the `BASE_BACKUP` stream,
/// which lists its files only as it sends them: the marker first, then pg_control removed
/// (so nothing starts there until the copy is whole), the tablespace links set
/// ([`set_tablespace_links`]). What the stream did not send is removed after it
/// ([`remove_unlisted`]).
///
/// Errors: the marker, pg_control or a link that cannot be written or removed.
pub fn begin_stream_delta(
    pg_path: &Path,
    system_identifier: u64,
    locations: &[(u32, PathBuf)],
    dir_mode: u32,
) -> Result<usize> {
    create_cluster_dir(pg_path, dir_mode)?;
    write_marker(pg_path, system_identifier)?;
    remove_control(pg_path)?;
    set_tablespace_links(pg_path, locations, dir_mode)
}

/// Removes `dir/postmaster.pid` when the process it names is gone (a server that crashed,
/// or was killed, leaves it). A live process, or a file that does not parse, is left for
/// [`check_delta_target`] to refuse. Errors: the file cannot be removed.
pub fn remove_stale_pid(dir: &Path) -> Result<()> {
    let pidfile = dir.join("postmaster.pid");
    let Ok(text) = fs::read_to_string(&pidfile) else {
        return Ok(());
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok())
    else {
        return Ok(());
    };
    if pid > 0 && !crate::io::pid_alive(pid) {
        tracing::info!(
            "{}: the server it names (PID {pid}) is gone: removed",
            pidfile.display()
        );
        fs::remove_file(&pidfile).map_err(|e| Error::io("remove", &pidfile, e))?;
    }
    Ok(())
}

/// Removes everything inside `dir` (the directory itself stays, with its mode).
/// Errors: an entry that cannot be listed or removed.
pub fn empty_dir(dir: &Path) -> Result<()> {
    for ent in fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
        let ent = ent.map_err(|e| Error::io("list", dir, e))?;
        remove_any(&ent.path())?;
    }
    crate::io::fs::fsync_dir(dir)
}

/// Removes global/pg_control, if there, durably.
fn remove_control(pg_path: &Path) -> Result<()> {
    let control = pg_path.join("global/pg_control");
    if control.exists() {
        fs::remove_file(&control).map_err(|e| Error::io("remove", &control, e))?;
        crate::io::fs::fsync_dir(&pg_path.join("global"))?;
    }
    Ok(())
}

/// Removes a file, a symbolic link (not what it points to) or a directory tree.
fn remove_any(p: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(p).map_err(|e| Error::io("stat", p, e))?;
    if meta.is_dir() {
        fs::remove_dir_all(p).map_err(|e| Error::io("remove", p, e))
    } else {
        fs::remove_file(p).map_err(|e| Error::io("remove", p, e))
    }
}

/// Opens (for reading and writing) or creates the target file `rel` below `pg_path`, sets
/// it to `size` bytes and its permission bits to `mode` (0: 0600). Returns its path, the
/// open file and the size it had before (None: it was created).
pub fn size_file(
    pg_path: &Path,
    rel: &str,
    size: u64,
    mode: u32,
) -> Result<(PathBuf, fs::File, Option<u64>)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let p = pg_path.join(rel);
    let old = fs::symlink_metadata(&p)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len());
    let mode = if mode == 0 { 0o600 } else { mode };
    let h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(mode)
        .open(&p)
        .map_err(|e| Error::io("open", &p, e))?;
    if old != Some(size) {
        h.set_len(size).map_err(|e| Error::io("size", &p, e))?;
    }
    fs::set_permissions(&p, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", &p, e))?;
    Ok((p, h, old))
}

/// [`size_file`] for each file (relative path, size, mode). Returns the paths and the
/// size each had before (None: it was created).
pub fn size_files(
    pg_path: &Path,
    files: &[(&str, u64, u32)],
) -> Result<(Vec<PathBuf>, Vec<Option<u64>>)> {
    let mut paths = Vec::with_capacity(files.len());
    let mut before = Vec::with_capacity(files.len());
    for (rel, size, mode) in files {
        let (p, _, old) = size_file(pg_path, rel, *size, *mode)?;
        paths.push(p);
        before.push(old);
    }
    Ok((paths, before))
}

/// Gets an existing data directory ready for a delta: the marker first, then pg_control
/// removed (so nothing starts there until the copy is whole), then [`clean_target`].
/// Returns the number of entries removed.
pub fn begin_delta(
    pg_path: &Path,
    system_identifier: u64,
    locations: &[(u32, PathBuf)],
    listing: &Listing,
) -> Result<usize> {
    create_cluster_dir(pg_path, DataDirModes::of_listing(&listing.dirs).dir)?;
    write_marker(pg_path, system_identifier)?;
    remove_control(pg_path)?;
    clean_target(pg_path, locations, listing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::datadir::SourceFile;

    #[test]
    fn clean_keeps_only_the_listing() {
        let d = tempfile::tempdir().unwrap();
        let pg = d.path().join("pg");
        for dir in ["base/1", "base/99", "pg_wal/archive_status", "global"] {
            fs::create_dir_all(pg.join(dir)).unwrap();
        }
        for f in [
            "base/1/100",
            "base/1/200",
            "base/99/5",
            "pg_wal/000000010000000000000001",
            "global/pg_control",
            "postmaster.opts",
            "backup_label",
        ] {
            fs::write(pg.join(f), b"x").unwrap();
        }
        fs::write(pg.join(MARKER), b"{}").unwrap();
        let listing = Listing {
            dirs: [
                "base",
                "base/1",
                "global",
                "pg_wal",
                "pg_wal/archive_status",
                "pg_tblspc",
            ]
            .iter()
            .map(|d| (d.to_string(), 0o700))
            .collect(),
            files: ["base/1/100", "global/pg_control"]
                .iter()
                .map(|f| SourceFile {
                    path: (*f).into(),
                    size: 1,
                    mtime: 0,
                    mode: 0o600,
                    checksum_segno: None,
                })
                .collect(),
            tablespaces: Vec::new(),
        };
        let removed = clean_target(&pg, &[], &listing).unwrap();
        assert_eq!(removed, 6);
        assert!(pg.join("base/1/100").exists());
        assert!(pg.join(MARKER).exists());
        for gone in [
            "base/1/200",
            "base/99",
            "pg_wal/000000010000000000000001",
            "global/pg_control",
            "postmaster.opts",
            "backup_label",
        ] {
            assert!(!pg.join(gone).exists(), "{gone}");
        }
        assert!(pg.join("pg_wal/archive_status").is_dir());
    }

    #[test]
    fn delta_targets_are_proven_first() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            check_delta_target(&d.path().join("none"), 1).unwrap(),
            DeltaTarget::Empty
        );
        assert_eq!(check_delta_target(d.path(), 1).unwrap(), DeltaTarget::Empty);
        fs::write(d.path().join("PG_VERSION"), b"15\n").unwrap();
        let e = check_delta_target(d.path(), 1).unwrap_err().to_string();
        assert!(e.contains("nothing proves"), "{e}");
        write_marker(d.path(), 42).unwrap();
        assert!(check_delta_target(d.path(), 41).is_err());
        assert_eq!(
            check_delta_target(d.path(), 42).unwrap(),
            DeltaTarget::SameCluster
        );
        fs::create_dir_all(d.path().join("global")).unwrap();
        // A control file is believed only when its CRC matches (crate::pg::control).
        let mut control = vec![0u8; 8192];
        control[..8].copy_from_slice(&7u64.to_le_bytes());
        fs::write(d.path().join("global/pg_control"), &control).unwrap();
        // Damaged: with the marker (a copy killed while writing pg_control) the marker
        // names the cluster; without it, refused.
        assert!(check_delta_target(d.path(), 7).is_err());
        assert_eq!(
            check_delta_target(d.path(), 42).unwrap(),
            DeltaTarget::SameCluster
        );
        fs::rename(d.path().join(MARKER), d.path().join("marker.aside")).unwrap();
        let e = check_delta_target(d.path(), 7).unwrap_err().to_string();
        assert!(e.contains("CRC"), "{e}");
        fs::rename(d.path().join("marker.aside"), d.path().join(MARKER)).unwrap();
        let crc = crc32c::crc32c(&control[..296]);
        control[296..300].copy_from_slice(&crc.to_le_bytes());
        fs::write(d.path().join("global/pg_control"), &control).unwrap();
        assert!(
            check_delta_target(d.path(), 42).is_err(),
            "pg_control wins over the marker"
        );
        assert_eq!(
            check_delta_target(d.path(), 7).unwrap(),
            DeltaTarget::SameCluster
        );
        fs::write(d.path().join("postmaster.pid"), b"1\n").unwrap();
        let e = check_delta_target(d.path(), 7).unwrap_err().to_string();
        assert!(e.contains("postmaster.pid"), "{e}");
    }

    /// Where WAL summaries would start for a target: its checkpoint's redo point and
    /// timeline, or a backup_label's start while one is there; nothing for an unfinished
    /// copy or a damaged control file.
    #[test]
    fn summaries_start_at_the_targets_redo_point() {
        use crate::pg::lsn::Lsn;
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("global")).unwrap();
        let mut control = vec![0u8; 8192];
        control[..8].copy_from_slice(&7u64.to_le_bytes());
        control[16..20].copy_from_slice(&2u32.to_le_bytes());
        control[32..40].copy_from_slice(&0x3000_0060u64.to_le_bytes());
        control[40..48].copy_from_slice(&0x3000_0028u64.to_le_bytes());
        control[48..52].copy_from_slice(&3u32.to_le_bytes());
        control[136..144].copy_from_slice(&0x3000_0100u64.to_le_bytes());
        control[144..148].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&control[..296]);
        control[296..300].copy_from_slice(&crc.to_le_bytes());
        fs::write(d.path().join("global/pg_control"), &control).unwrap();
        // Its pg_wal reached timeline 4 (a segment and the history file of 4).
        fs::create_dir_all(d.path().join("pg_wal")).unwrap();
        fs::write(d.path().join("pg_wal/000000040000000000000031"), b"").unwrap();
        fs::write(
            d.path().join("pg_wal/00000004.history"),
            "1\t0/1000000\tno recovery target specified\n2\t0/2000000\tx\n3\t0/31000000\tx\n",
        )
        .unwrap();
        fs::write(d.path().join("pg_wal/00000005.x"), b"").unwrap();
        let c = crate::pg::control::read_control(d.path()).unwrap();
        assert_eq!(c.state, crate::pg::control::DbState::ShutDownInRecovery);
        assert_eq!((c.checkpoint, c.system_identifier), (Lsn(0x3000_0060), 7));
        assert_eq!(
            summaries_since(d.path()),
            Some(TargetPoint {
                timeline: 3,
                redo: Lsn(0x3000_0028),
                checkpoint: Lsn(0x3000_0060),
                shut_down_primary: false,
                min_recovery: Some((Lsn(0x3000_0100), 3)),
                last_timeline: 4,
                own_history: vec![
                    (1, Lsn(0x100_0000)),
                    (2, Lsn(0x200_0000)),
                    (3, Lsn(0x3100_0000))
                ],
                own_pages: true,
            })
        );
        fs::write(
            d.path().join("backup_label"),
            "START WAL LOCATION: 0/2000028 (file 000000030000000000000002)\n\
             CHECKPOINT LOCATION: 0/2000060\nBACKUP METHOD: streamed\nBACKUP FROM: primary\n\
             START TIME: 2026-11-26 10:00:00 UTC\nLABEL: x\nSTART TIMELINE: 3\n",
        )
        .unwrap();
        assert_eq!(
            summaries_since(d.path()).map(|p| (p.timeline, p.redo, p.checkpoint)),
            Some((3, Lsn(0x200_0028), Lsn(0x200_0060)))
        );
        fs::write(d.path().join("backup_label"), "garbage").unwrap();
        assert_eq!(summaries_since(d.path()), None);
        fs::remove_file(d.path().join("backup_label")).unwrap();
        write_marker(d.path(), 7).unwrap();
        assert_eq!(summaries_since(d.path()), None);
        fs::remove_file(d.path().join(MARKER)).unwrap();
        control[45] ^= 1;
        fs::write(d.path().join("global/pg_control"), &control).unwrap();
        assert_eq!(summaries_since(d.path()), None);
    }

    /// The WAL a target's changes are in, along the source's timelines: the same timeline
    /// as is; an older one only for a target that holds nothing past the switch point (shut
    /// down cleanly as a primary before it, or its own WAL stopping there and its minimum
    /// recovery point on the history); anything else refused with the reason.
    #[test]
    fn the_summaries_path_follows_the_sources_history() {
        use crate::pg::lsn::Lsn;
        let p = |timeline, redo, checkpoint, shut_down_primary| TargetPoint {
            timeline,
            redo: Lsn(redo),
            checkpoint: Lsn(checkpoint),
            shut_down_primary,
            min_recovery: None,
            last_timeline: timeline,
            own_history: Vec::new(),
            own_pages: true,
        };
        let ends = |_: u32, _: Lsn| WalAt::End;
        let start = Lsn(0x900);
        assert_eq!(
            timeline_path(&[], 1, &p(1, 0x100, 0x120, false), start, &ends),
            Ok(vec![(1, Lsn(0x100), start)])
        );
        let history = [(1, Lsn(0x500)), (2, Lsn(0x700))];
        let path = |t: &TargetPoint, wal: &dyn Fn(u32, Lsn) -> WalAt| {
            timeline_path(&history, 3, t, start, wal)
        };
        // A clean switchover: the old primary's shutdown checkpoint before timeline 1's end.
        let ok = Ok(vec![
            (1, Lsn(0x400), Lsn(0x500)),
            (2, Lsn(0x500), Lsn(0x700)),
            (3, Lsn(0x700), start),
        ]);
        assert_eq!(path(&p(1, 0x400, 0x400, true), &ends), ok);
        assert_eq!(
            path(&p(2, 0x600, 0x600, true), &ends),
            Ok(vec![(2, Lsn(0x600), Lsn(0x700)), (3, Lsn(0x700), start)])
        );
        let refused = |t: &TargetPoint, wal: &dyn Fn(u32, Lsn) -> WalAt, what: &str| {
            let e = path(t, wal).unwrap_err();
            assert!(e.contains(what), "{e}");
        };
        refused(
            &p(1, 0x400, 0x500, true),
            &ends,
            "at or past the switch point",
        );
        refused(
            &p(1, 0x400, 0x500, false),
            &ends,
            "at or past the switch point",
        );
        refused(&p(4, 0x400, 0x400, true), &ends, "not in the history");
        let e = timeline_path(&history, 3, &p(3, 0xa00, 0xa00, true), start, &ends);
        assert!(e.unwrap_err().contains("past this copy's start"));
        // Not shut down cleanly as a primary (a demoted primary or a standby stopped by
        // -m immediate, a crashed primary): its own WAL and its minimum recovery point say.
        let crashed = p(1, 0x400, 0x400, false);
        assert_eq!(path(&crashed, &ends), ok);
        // Its own WAL holds a record at `at` on timeline `tli`, and ends everywhere else.
        let record_only = |tli: u32, at: u64| {
            move |t: u32, l: Lsn| {
                if t == tli && l == Lsn(at) {
                    WalAt::Record
                } else {
                    WalAt::End
                }
            }
        };
        refused(
            &crashed,
            &record_only(1, 0x500),
            "goes on past the switch point 0/500 to timeline 2",
        );
        let unreadable = |_: u32, _: Lsn| WalAt::Unknown("no segment".into());
        refused(&crashed, &unreadable, "cannot tell whether it stops");
        let standby = |min: (u64, u32)| TargetPoint {
            min_recovery: Some((Lsn(min.0), min.1)),
            last_timeline: min.1.max(1),
            ..crashed.clone()
        };
        for fine in [(0x480, 1), (0x500, 1), (0x650, 2), (0x900, 3)] {
            assert_eq!(path(&standby(fine), &ends), ok, "{fine:?}");
        }
        for off in [(0x501, 1), (0x701, 2), (0x901, 3)] {
            refused(&standby(off), &ends, "minimum recovery point");
        }
        refused(
            &standby((0x400, 4)),
            &ends,
            "timeline 4, which is not in the history",
        );
        // Promoted to timeline 2 and crashed before its first checkpoint there (checkpoint
        // still on 1): its WAL on 2 is checked at 2's switch point too.
        let promoted = TargetPoint {
            last_timeline: 2,
            own_history: vec![(1, Lsn(0x500))],
            min_recovery: Some((Lsn(0x500), 2)),
            ..crashed.clone()
        };
        assert_eq!(path(&promoted, &ends), ok);
        refused(
            &promoted,
            &record_only(2, 0x700),
            "timeline 2 goes on past the switch point 0/700",
        );
        // Its own history says timeline 1 ended elsewhere: another history.
        let other = TargetPoint {
            own_history: vec![(1, Lsn(0x480))],
            ..promoted.clone()
        };
        refused(&other, &ends, "another history");
        // A copy holding a backup_label on an older timeline: its pages' end is unknown.
        let copy = TargetPoint {
            own_pages: false,
            ..crashed
        };
        refused(&copy, &ends, "backup_label");
    }
}
