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
//! - a re-sync onto another `--slot` drops the standby's former slot once the copy is good,
//!   if nothing uses it.
use crate::error::{Error, Result};
use crate::pg::lsn::Lsn;
use crate::pg::session::Session;

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
    sess: &Session,
    wanted: Option<&str>,
    own: Option<&str>,
) -> Result<Option<StandbySlot>> {
    let Some(name) = wanted.or(own) else {
        return Ok(None);
    };
    let reuse = match sess.slot_state(name)? {
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
    if reuse {
        tracing::info!(
            "replication slot {name} exists on the primary and is not in use: it is reused"
        );
    }
    let abandoned = match (wanted, own) {
        (Some(w), Some(o)) if w != o => match sess.slot_state(o)? {
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

/// After a good copy whose WAL from `start` on the temporary slot `temporary` protects:
/// makes the standby's slot (or keeps the reused one when it still holds WAL from `start`),
/// then drops the abandoned one. Returns true when this run made the slot (the caller drops
/// it should a later step fail).
///
/// Errors: a query error (the slot could not be made).
pub fn settle_slot(
    sess: &Session,
    slot: &StandbySlot,
    temporary: &str,
    start: Lsn,
) -> Result<bool> {
    let name = &slot.name;
    let made = match sess.slot_state(name)? {
        Some(st) if slot.reuse && holds_from(&st, start) => false,
        Some(st) => {
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
        None => {
            sess.copy_slot_permanent(temporary, name)?;
            true
        }
    };
    if let Some(old) = &slot.abandoned {
        match sess.slot_state(old)? {
            Some(st) if st.active_pid.is_none() => match sess.drop_slot(old) {
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
