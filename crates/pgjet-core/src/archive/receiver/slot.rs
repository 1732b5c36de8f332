//! The physical slot `archive-stream` ([`super`]) holds on the server, and what it does when
//! the server no longer has the WAL the archive needs next (a slot that was dropped or
//! invalidated by `max_slot_wal_keep_size`, a receiver stopped longer than the server kept
//! its WAL): the missing segments are recorded as a gap, as archive-push records the WAL it
//! drops ([`crate::repo::wal::Gap`]: `info`, `check` and restore see it), and the stream goes
//! on from the oldest WAL the server still has.
use super::assemble::Stream;
use crate::error::{Error, Result};
use crate::pg::lsn::{self, Lsn};
use crate::remote::replication::ReplConn;
use crate::repo::wal;

/// The slot's restart position (None when it has lost its WAL), None when there is no
/// such slot.
///
/// Errors: a logical slot of that name; the server's refusal.
fn read_slot(conn: &mut ReplConn, slot: &str) -> Result<Option<Option<Lsn>>> {
    let logical = |kind: &str| {
        Error::Config(format!(
            "replication slot '{slot}' is a {kind} slot; archive-stream needs a physical one (name another with --archive-stream-slot)"
        ))
    };
    match conn.read_slot(slot) {
        Ok(None) => Ok(None),
        Ok(Some((kind, _))) if kind != "physical" => Err(logical(&kind)),
        Ok(Some((_, at))) => Ok(Some(at)),
        // The server refuses READ_REPLICATION_SLOT of a logical slot itself (walsender.c
        // ReadReplicationSlot: "cannot use READ_REPLICATION_SLOT with a logical replication
        // slot", SQLSTATE 0A000).
        Err(Error::Replication { error, .. })
            if error.code == "0A000" && error.message.contains("logical replication slot") =>
        {
            Err(logical("logical"))
        }
        Err(e) => Err(e),
    }
}

/// The physical slot's restart position on the server, creating the slot when missing
/// (`RESERVE_WAL`: the server keeps WAL from then on). None for a slot just made or one
/// that has lost its WAL.
///
/// Errors: a logical slot of that name; the server's refusal (the role lacks REPLICATION,
/// `max_replication_slots` reached).
pub(super) fn ensure_slot(conn: &mut ReplConn, slot: &str) -> Result<Option<Lsn>> {
    match read_slot(conn, slot)? {
        Some(at) => Ok(at),
        None => {
            conn.create_physical_slot(slot, false)?;
            tracing::info!("created the physical replication slot '{slot}'");
            Ok(None)
        }
    }
}

/// True when `e` is the server saying the WAL asked for was removed (walsender.c: "requested
/// WAL segment ... has already been removed", SQLSTATE 58P01).
pub(super) fn removed(e: &Error) -> bool {
    matches!(e, Error::Replication { error, .. }
        if error.code == "58P01" || error.message.contains("has already been removed"))
}

/// The server no longer has the WAL at the stream's position: the slot (made again when it
/// has lost its WAL) says where the server's WAL starts now; the segments before it are
/// recorded as a gap in every repository, and the stream moves there.
///
/// Errors: the server's; a repository that cannot record the gap (the caller retries).
pub(super) fn skip_removed(s: &mut Stream, conn: &mut ReplConn) -> Result<()> {
    let slot = s.o.slot.clone();
    let mut at = read_slot(conn, &slot)?.flatten();
    if at.is_none_or(|l| l <= s.next) {
        tracing::warn!(
            "replication slot '{slot}' does not hold the WAL from {}: making it again",
            s.next
        );
        conn.drop_slot(&slot)?;
        ensure_slot(conn, &slot)?;
        at = read_slot(conn, &slot)?.flatten();
    }
    let at = at.ok_or_else(|| {
        Error::Other(format!(
            "replication slot '{slot}' holds no WAL even when made again"
        ))
    })?;
    let (seg, tli) = (s.seg_size, s.timeline);
    let (from, to) = (s.next.0 / seg, at.0 / seg);
    if to > from {
        let gap = wal::Gap {
            first: lsn::wal_segment_name(tli, from, seg),
            last: lsn::wal_segment_name(tli, to - 1, seg),
            segments: to - from,
            recorded: crate::repo::rfc3339(chrono::Utc::now()),
            reason: format!(
                "archive-stream: the server no longer had the WAL from {} (slot '{slot}' lost or missing); streaming went on from {}",
                s.next,
                Lsn(to * seg)
            ),
        };
        for st in s.a.repos() {
            wal::record_gap(st, &gap)?;
        }
        tracing::error!(
            "WAL {} to {} ({} segments) was removed on the server before it was received: recorded as a gap; a backup taken from now on restores past it",
            gap.first,
            gap.last,
            gap.segments
        );
    }
    s.switch_to(tli, Lsn(to * seg));
    Ok(())
}
