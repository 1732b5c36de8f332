//! The one base-backup sequence that `backup` and `replica-create` share; they differ only
//! in where the bytes go (a [`BackupTarget`]).
//!
//! Order of work, as PostgreSQL's own base backup (src/backend/backup/basebackup.c):
//! 1. a temporary physical replication slot reserves WAL (it dies with the session, so a
//!    killed pgjet leaks nothing);
//! 2. `pg_backup_start`;
//! 3. the source lists the data directory and tablespaces;
//! 4. every file but pg_control is copied in parallel;
//! 5. pg_control is read (until its CRC matches) while the backup is still running;
//! 6. `pg_backup_stop`;
//! 7. the WAL from the start to the stop LSN is copied (never past the server's flush LSN),
//!    while the slot still protects it;
//! 8. the slot is checked: had it lost its WAL, the copy could hold recycled segments.
//!
//! The target then finishes on its own terms (a manifest written last, or pg_control written
//! last into a data directory).
use crate::error::{Error, Result};
use crate::pg::datadir::Listing;
use crate::pg::lsn::Lsn;
use crate::pg::lsn::{parse_backup_label, BackupLabel};
use crate::pg::session::BackupStop;
use crate::pg::session::{ServerInfo, Session};
use crate::remote::control::Control;
use crate::transfer::source::{read_control, wal_files};
use crate::transfer::{BackupTarget, CopyOutcome, Progress, ReadOptions, Source, SourceFile};

/// How to run the sequence.
pub struct BaseBackupOptions<'a> {
    /// Label passed to pg_backup_start (shows in backup_label and the server log).
    pub label: &'a str,
    /// Ask for an immediate checkpoint.
    pub start_fast: bool,
    /// Parallel workers.
    pub jobs: usize,
    /// Name of the first progress phase ("backup", "replica-create").
    pub phase: &'a str,
}

/// What the sequence produced.
pub struct BaseBackup {
    /// The temporary slot that protected the WAL; it lives as long as the session.
    pub slot: String,
    pub start_lsn: Lsn,
    pub stop: BackupStop,
    /// pg_backup_stop's backup_label, parsed.
    pub label: BackupLabel,
    pub listing: Listing,
    /// Every listed file but pg_control, as copied.
    pub files: Vec<SourceFile>,
    pub out: CopyOutcome,
    /// global/pg_control as listed, and its bytes (CRC checked), read before the stop.
    pub control: SourceFile,
    pub control_bytes: Vec<u8>,
    /// The WAL files from the start to the stop LSN (and the timeline history file).
    pub wal: Vec<SourceFile>,
    pub wal_out: CopyOutcome,
}

impl BaseBackup {
    /// Logical bytes copied: data files, pg_control and WAL.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum::<u64>()
            + self.control_bytes.len() as u64
            + self.wal.iter().map(|f| f.size).sum::<u64>()
    }
}

/// The files of a listing as the engine wants them: everything but pg_control, and
/// pg_control on its own (it is copied last). Takes the files out of the listing (nothing
/// is copied: one path per file in memory at a million files).
pub fn source_files(listing: &mut Listing) -> (Vec<SourceFile>, Option<SourceFile>) {
    let mut files = std::mem::take(&mut listing.files);
    let control = files
        .iter()
        .position(|f| &*f.path == "global/pg_control")
        .map(|i| files.remove(i));
    (files, control)
}

/// Fails when any of `files` vanished during the copy: for the backup's WAL that means the
/// backup cannot be restored (a WAL segment was removed or recycled).
pub fn require_all(files: &[SourceFile], vanished: &[bool]) -> Result<()> {
    match files.iter().zip(vanished).find(|(_, gone)| **gone) {
        Some((f, _)) => Err(Error::Unsafe(format!(
            "{} disappeared while it was being copied; the backup would not be restorable",
            f.path
        ))),
        None => Ok(()),
    }
}

/// Says, before a backup starts, that it waits for PostgreSQL's next checkpoint unless
/// `fast`: a spread checkpoint takes up to checkpoint_completion_target × checkpoint_timeout
/// (PostgreSQL doc/src/sgml/wal.sgml, "WAL Configuration"; both settings readable by every
/// role), and nothing else is printed meanwhile.
pub fn announce_checkpoint(ctl: &dyn Control, fast: bool) {
    if fast {
        tracing::info!("asking PostgreSQL for an immediate checkpoint (start-fast)");
        return;
    }
    let setting = |name: &str| ctl.show(name).ok().flatten();
    let within = match (
        setting("checkpoint_timeout").as_deref().and_then(seconds),
        setting("checkpoint_completion_target").and_then(|c| c.trim().parse::<f64>().ok()),
    ) {
        (Some(t), Some(c)) => format!(
            ", up to {:.0} s (checkpoint_timeout {t:.0} s × checkpoint_completion_target {c})",
            t * c
        ),
        _ => String::new(),
    };
    tracing::info!(
        "waiting for the next checkpoint, which PostgreSQL spreads out{within}; --start-fast (start-fast=y in the config file) asks for an immediate one"
    );
}

/// Seconds from a time setting as `SHOW` prints it: a number and `ms`, `s`, `min`, `h` or
/// `d` (guc.c's time units), or a bare number of seconds.
fn seconds(v: &str) -> Option<f64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: f64 = v[..digits].parse().ok()?;
    let unit = match v[digits..].trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return None,
    };
    Some(n * unit)
}

/// Runs the sequence on the primary or standby behind `sess` (whose facts are `info`),
/// reading files from `source` into `target`. `tablespaces`: (oid, name, location) from pg_tablespace.
///
/// Errors: any step's; the session's temporary slot and the backup in progress end with the
/// session.
pub fn run_base_backup<T: BackupTarget>(
    sess: &Session,
    info: &ServerInfo,
    source: &dyn Source,
    tablespaces: &[(u32, String, String)],
    target: &mut T,
    opts: &BaseBackupOptions,
    progress: &dyn Progress,
) -> Result<BaseBackup> {
    // A standby works as PostgreSQL's own base backup of a standby: the same session calls,
    // backup_label says "BACKUP FROM: standby", and recovery ends the backup at the minimum
    // recovery point of the pg_control copied last (src/backend/access/transam/xlog.c,
    // do_pg_backup_stop and the backup end in xlogrecovery.c).
    let slot = format!("pgjet_{}", std::process::id());
    // Before the slot: a failed query would end the session's temporary slot.
    announce_checkpoint(sess, opts.start_fast);
    sess.create_physical_slot(&slot, true)?;
    let start_lsn = sess.backup_start(opts.label, opts.start_fast)?;
    tracing::info!(
        "{} started at LSN {start_lsn} ({})",
        opts.phase,
        source.describe()
    );

    let mut listing = source.list(info, tablespaces)?;
    tracing::debug!(
        "{} files listed; memory: {}",
        listing.files.len(),
        crate::io::mem::memory_note()
    );
    if !listing
        .files
        .iter()
        .any(|f| &*f.path == "global/pg_control")
    {
        return Err(Error::Unsafe(format!(
            "{} has no global/pg_control",
            source.describe()
        )));
    }
    // The target sees the whole listing (a delta cleans by it), then the files move out.
    target.prepare(&listing, start_lsn)?;
    // The WAL the backup adds gets the cluster's file mode (0600, or 0640 with group access).
    let wal_mode = crate::pg::datadir::DataDirModes::of_listing(&listing.dirs).file;
    let (files, control) = source_files(&mut listing);
    // Listing a large directory leaves its entries' memory free but held by the allocator
    // (a million entries: about 50 MiB); give it back before the copy adds its buffers.
    crate::io::mem::release_free_memory();
    let control = control
        .ok_or_else(|| Error::Unsafe(format!("{} has no global/pg_control", source.describe())))?;
    let read_opts = ReadOptions {
        jobs: opts.jobs,
        verify_checksums: info.data_checksums,
        backup_start_lsn: start_lsn.0,
    };
    let total: u64 = files.iter().map(|f| f.size).sum::<u64>() + control.size;
    progress.begin(opts.phase, total);
    let out = target.copy(source, &files, &read_opts, progress)?;
    // The units and copy buffers of a million files are gone: hand their memory back before
    // the WAL is copied with buffers of its own.
    crate::io::mem::release_free_memory();
    let bad = out.page_error_count;
    if bad > 0 {
        tracing::warn!(
            "{bad} page(s) of {} failed checksum validation (see the warnings above)",
            source.describe()
        );
    }
    // pg_control is read before the backup stops, as basebackup.c sends it last.
    let control_bytes = read_control(source)?;
    progress.advance(control.size);
    let stop = sess.backup_stop()?;
    let label = parse_backup_label(&stop.backup_label).map_err(|e| {
        Error::Other("pg_backup_stop returned a backup_label pgjet cannot read".into()).because(e)
    })?;
    tracing::info!("{} stopped at LSN {}", opts.phase, stop.lsn);
    progress.finish();

    // pg_backup_stop switches to a new segment, which flushes the stop LSN; check it anyway,
    // so no byte past what the server made durable is ever copied.
    sess.wait_wal_flushed(stop.lsn)?;
    let mut wal = wal_files(
        source,
        label.start_timeline,
        start_lsn,
        stop.lsn,
        info.wal_segment_size,
        info.system_identifier,
    )?;
    wal.iter_mut().for_each(|f| f.mode = wal_mode);
    let wal_opts = ReadOptions {
        verify_checksums: false,
        ..read_opts
    };
    // The WAL's size is known only after pg_backup_stop: a phase of its own.
    progress.begin("WAL", wal.iter().map(|f| f.size).sum());
    let wal_out = target.copy(source, &wal, &wal_opts, progress)?;
    require_all(&wal, &wal_out.vanished)?;
    Control::check_slot_holds(sess, &slot)?;
    progress.finish();
    Ok(BaseBackup {
        slot,
        start_lsn,
        stop,
        label,
        listing,
        files,
        out,
        control,
        control_bytes,
        wal,
        wal_out,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_settings_as_show_prints_them() {
        assert_eq!(super::seconds("5min"), Some(300.0));
        assert_eq!(super::seconds("30s"), Some(30.0));
        assert_eq!(super::seconds("1h"), Some(3600.0));
        assert_eq!(super::seconds("300"), Some(300.0));
        assert_eq!(super::seconds("0.9"), None);
    }
}
