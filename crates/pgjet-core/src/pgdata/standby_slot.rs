//! The permanent replication slot a standby made by `replica-create` streams from: which
//! one, whether it is made or reused, and the slot a re-sync leaves behind.
//!
//! The rules (a slot holds WAL on the primary for as long as it exists, so none may be left
//! that no standby uses):
//! - the slot is `--slot`, else, on a re-sync (`--delta`), the standby's own
//!   `primary_slot_name`;
//! - a physical slot of that name that no process uses is reused (a stopped standby's
//!   slot), one that a walsender uses is refused (another standby streams from it), a
//!   logical one is refused;
//! - a reused slot that lost its WAL, or whose restart LSN is past the copy's start, is
//!   replaced by a copy of the copy's temporary slot; a missing one is made that way;
//! - a slot made by this run is dropped when the run fails; a reused one is left as it was;
//! - over a replication connection in the SQL session's place ([`crate::remote::control`]:
//!   a role let in for replication only) a slot cannot be copied: a missing or lost one is
//!   made before the copy, reserving WAL from before the copy's start
//!   (`CREATE_REPLICATION_SLOT ... RESERVE_WAL`), and whether a walsender uses one cannot
//!   be seen (a slot that advanced past the copy's start is refused after it);
//! - a re-sync onto another `--slot` drops the standby's former slot once the copy is good,
//!   if nothing uses it.
use crate::error::{Error, Result};
use crate::pg::lsn::Lsn;
use crate::remote::control::Control;

/// The standby's slot for one run of replica-create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlot {
    /// The slot's name.
    pub name: String,
    /// It exists on the primary and no one uses it: kept if it still holds the WAL needed.
    pub reuse: bool,
    /// The standby's former slot, dropped after a good copy (a re-sync onto another slot).
    pub abandoned: Option<String>,
}

/// Chooses the slot (see the module's rules) before anything is copied: `wanted` is
/// `--slot`, `own` the standby's `primary_slot_name` on a re-sync.
///
/// Errors: [`Error::Unsafe`] when the slot is in use or logical; a query error.
pub fn plan_slot(
    ctl: &dyn Control,
    wanted: Option<&str>,
    own: Option<&str>,
) -> Result<Option<StandbySlot>> {
    let Some(name) = wanted.or(own) else {
        return Ok(None);
    };
    let reuse = match ctl.slot_state(name)? {
        None => false,
        Some(st) if !st.physical => {
            return Err(Error::Unsafe(format!(
                "replication slot {name} on the primary is a logical slot; a standby streams from a physical one: choose another --slot"
            )))
        }
        Some(st) if st.active_pid.is_some() => {
            return Err(Error::Unsafe(format!(
                "replication slot {name} is in use on the primary (walsender PID {}): another standby streams from it; stop that standby or choose another --slot",
                st.active_pid.unwrap_or_default()
            )))
        }
        Some(_) => true,
    };
    if reuse && ctl.session().is_none() {
        tracing::info!(
            "replication slot {name} exists on the primary: it is reused (whether a standby streams from it cannot be read over a replication connection; if one does, the copy is refused once it ends)"
        );
    } else if reuse {
        tracing::info!(
            "replication slot {name} exists on the primary and is not in use: it is reused"
        );
    }
    let abandoned = match (wanted, own) {
        (Some(w), Some(o)) if w != o => match ctl.slot_state(o)? {
            Some(st) if st.physical && st.active_pid.is_none() => Some(o.to_string()),
            _ => None,
        },
        _ => None,
    };
    Ok(Some(StandbySlot {
        name: name.to_string(),
        reuse,
        abandoned,
    }))
}

/// Before the copy, over a replication connection in the SQL session's place (which cannot
/// copy a slot afterwards): makes the standby's slot now, reserving WAL from before the
/// copy's start, unless a reused one still holds WAL; a lost one is made again. Returns
/// true when this run made the slot (the caller drops it should a later step fail). Over
/// the SQL session nothing is done here ([`settle_slot`] copies the temporary slot).
///
/// Errors: the server's (the slot could not be made or dropped).
pub fn reserve_before_copy(ctl: &dyn Control, slot: &StandbySlot) -> Result<bool> {
    if ctl.session().is_some() {
        return Ok(false);
    }
    let name = &slot.name;
    match ctl.slot_state(name)? {
        Some(st) if st.restart_lsn.is_some() => return Ok(false),
        Some(_) => {
            tracing::info!("replication slot {name} has lost its WAL: it is made again");
            ctl.drop_slot(name)?;
        }
        None => {}
    }
    ctl.create_slot(name, false)?;
    tracing::info!("replication slot {name} made on the primary, holding WAL from now on");
    Ok(true)
}

/// After a good copy whose WAL from `start` on the temporary slot `temporary` protects:
/// makes the standby's slot (or keeps the reused one when it still holds WAL from `start`),
/// then drops the abandoned one. Returns true when this run made the slot (the caller drops
/// it should a later step fail). Over a replication connection the slot was made before
/// the copy ([`reserve_before_copy`]): it must hold WAL from `start`, else the copy is
/// refused (a standby streamed from it meanwhile).
///
/// Errors: a query error (the slot could not be made); the slot in use.
pub fn settle_slot(
    ctl: &dyn Control,
    slot: &StandbySlot,
    temporary: &str,
    start: Lsn,
) -> Result<bool> {
    let name = &slot.name;
    let made = match (ctl.session(), ctl.slot_state(name)?) {
        (None, Some(st)) if holds_from(&st, start) => false,
        (None, st) => {
            return Err(Error::Unsafe(format!(
                "replication slot {name} no longer holds the WAL from the copy's start {start} (restart LSN {}): a standby streamed from it during the copy; stop that standby or choose another --slot",
                st.and_then(|s| s.restart_lsn)
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "none".into())
            )))
        }
        (Some(_), Some(st)) if slot.reuse && holds_from(&st, start) => false,
        (Some(sess), Some(st)) => {
            tracing::info!(
                "replication slot {name} no longer holds the WAL from {start} (wal_status {}, restart LSN {}): it is made again",
                st.wal_status,
                st.restart_lsn.map(|l| l.to_string()).unwrap_or_else(|| "none".into())
            );
            if st.active_pid.is_some() {
                return Err(Error::Unsafe(format!(
                    "replication slot {name} came into use on the primary during the copy; choose another --slot"
                )));
            }
            sess.drop_slot(name)?;
            sess.copy_slot_permanent(temporary, name)?;
            true
        }
        (Some(sess), None) => {
            sess.copy_slot_permanent(temporary, name)?;
            true
        }
    };
    if let Some(old) = &slot.abandoned {
        match ctl.slot_state(old)? {
            Some(st) if st.active_pid.is_none() => match ctl.drop_slot(old) {
                Ok(()) => tracing::info!(
                    "replication slot {old}, the standby's former slot, was dropped: it streams from {name} now"
                ),
                Err(e) => tracing::warn!(
                    "could not drop the standby's former slot {old} (it holds WAL on the primary; drop it by hand): {}",
                    e.with_causes()
                ),
            },
            Some(st) => tracing::warn!(
                "the standby's former slot {old} is in use (PID {}); left on the primary",
                st.active_pid.unwrap_or_default()
            ),
            None => {}
        }
    }
    Ok(made)
}

/// True when slot `st` still holds every WAL segment from `start` on.
fn holds_from(st: &crate::pg::session::SlotState, start: Lsn) -> bool {
    matches!(st.wal_status.as_str(), "reserved" | "extended")
        && st.restart_lsn.is_some_and(|r| r <= start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::session::SlotState;

    #[test]
    fn a_reused_slot_must_hold_the_copys_wal() {
        let st = |wal: &str, lsn: Option<&str>| SlotState {
            physical: true,
            active_pid: None,
            wal_status: wal.into(),
            restart_lsn: lsn.map(|l| l.parse().unwrap()),
        };
        let start: Lsn = "0/5000028".parse().unwrap();
        assert!(holds_from(&st("reserved", Some("0/4000000")), start));
        assert!(holds_from(&st("extended", Some("0/5000028")), start));
        assert!(!holds_from(&st("reserved", Some("0/6000000")), start));
        assert!(!holds_from(&st("lost", None), start));
        assert!(!holds_from(&st("unreserved", Some("0/4000000")), start));
    }
}
