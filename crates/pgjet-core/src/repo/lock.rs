//! The stanza's backup lock, on any store, built on one primitive every store has: create an
//! object only if it is absent ([`Storage::create_new`]).
//!
//! The lock is a sequence of records `<stanza>/lock/backup-<epoch>.json`; the record of the
//! highest epoch is the lock's state. A process takes the lock by creating the record of the
//! next epoch: only one create of a name wins, so of two takers only one gets it. The holder
//! renews its lease every [`RENEW_EVERY`] by rewriting its own record, which no other process
//! ever writes, so a renewal never races another writer; before each renewal, and in
//! [`StanzaLock::check`], it lists the records, and a record of a higher epoch means the lock
//! was taken over (the backup then does not complete). It releases the lock by marking its
//! record `released`, so epochs only grow and an old record never becomes the state again.
//! A new holder removes the records of earlier epochs.
//!
//! A record that is not released holds until its lease runs out ([`LEASE`]), or until its
//! holder is seen gone (same host, no such process). Hosts' clocks must agree to well within
//! [`LEASE`]: a lease is a wall-clock time written by the holder and judged by the taker, who
//! first watches a lease that looks expired for one renewal period and refuses, naming the
//! skew, when its holder renews it meanwhile.
//!
//! Because it needs no conditional replace or delete, the protocol is the same on posix, S3,
//! GCS, Azure and SFTP, and holds when one repository is reached through two of them (a
//! directory used as a posix repository on one host and over SFTP from another).
use crate::error::{Error, Result};
use crate::storage::Storage;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a lock stays valid without renewal.
pub const LEASE: Duration = Duration::from_secs(60);
/// How often the holder renews its lease (a quarter of [`LEASE`]: three renewals may fail in
/// a row before the lease runs out).
pub const RENEW_EVERY: Duration = Duration::from_secs(15);

/// What a lock record holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockRecord {
    /// Host name of the holder.
    pub host: String,
    pub pid: u32,
    /// The command holding it, e.g. "backup".
    pub command: String,
    /// Random token telling this holder from a later one with the same host and pid.
    pub token: String,
    /// RFC 3339 UTC time the lock was taken.
    pub acquired: String,
    /// Unix seconds until which the lease holds.
    pub lease_until: i64,
    /// True once the holder let the lock go: the next taker need not wait for the lease.
    #[serde(default)]
    pub released: bool,
}

/// The directory of `stanza`'s lock records.
fn lock_dir(stanza: &str) -> String {
    format!("{stanza}/lock")
}

/// Name of `stanza`'s lock record of `epoch` (1, 2, ...): `<stanza>/lock/backup-<epoch, ten
/// digits or more>.json`.
pub fn record_name(stanza: &str, epoch: u64) -> String {
    format!("{}/backup-{epoch:010}.json", lock_dir(stanza))
}

/// The epoch of a lock record's base name, or None for any other name (a temporary file).
fn parse_epoch(base: &str) -> Option<u64> {
    let digits = base.strip_prefix("backup-")?.strip_suffix(".json")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The highest epoch among `stanza`'s lock records, or None when there is none.
///
/// Errors: the store's listing error.
fn top_epoch(store: &dyn Storage, stanza: &str) -> Result<Option<u64>> {
    let mut top = None;
    for n in store.list(&lock_dir(stanza))? {
        top = top.max(parse_epoch(&n?));
    }
    Ok(top)
}

/// `stanza`'s current lock record: its epoch and, when it reads as a record, its contents.
/// None when the stanza has no lock record.
///
/// Errors: the store's.
pub fn current(store: &dyn Storage, stanza: &str) -> Result<Option<(u64, Option<LockRecord>)>> {
    let Some(epoch) = top_epoch(store, stanza)? else {
        return Ok(None);
    };
    let rec = match store.get(&record_name(stanza, epoch)) {
        Ok(b) => serde_json::from_slice(&b).ok(),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e),
    };
    Ok(Some((epoch, rec)))
}

/// This host's name (`/proc/sys/kernel/hostname`), or "unknown".
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Why a record no longer holds.
enum Stale {
    /// Its holder ran on this host and its process is gone: stale for certain.
    Gone(String),
    /// Its lease ran out by this host's clock: stale unless the clocks disagree.
    LeaseRanOut(String),
}

/// Why a record no longer holds, or None while it does.
fn stale_reason(rec: &LockRecord, host: &str) -> Option<Stale> {
    if rec.host == host && rec.pid != std::process::id() && !crate::io::pid_alive(rec.pid) {
        return Some(Stale::Gone(format!(
            "process {} on this host is gone",
            rec.pid
        )));
    }
    let late = now_unix() - rec.lease_until;
    if late > 0 {
        return Some(Stale::LeaseRanOut(format!(
            "its lease ran out {late} s ago"
        )));
    }
    None
}

/// Before a lease that ran out by this host's clock is taken for stale: watches the record
/// `name` (read as `bytes`) for one renewal period (`renew_every` and a third more). A holder
/// that renews it meanwhile is alive, so the clocks disagree: the error says by about how
/// much (the holder wrote its own clock's time plus `lease` into `lease_until`). Ok(true)
/// when the record stayed as it was (stale), Ok(false) when it went away or changed
/// otherwise (look again).
fn confirm_stale(
    store: &dyn Storage,
    name: &str,
    held: &LockRecord,
    bytes: &[u8],
    lease: Duration,
    renew_every: Duration,
) -> Result<bool> {
    let wait = renew_every + renew_every / 3;
    tracing::info!(
        "the lock of pgjet {} (pid {} on host {}) is past its lease by this host's clock; watching it for {} s before taking it over",
        held.command,
        held.pid,
        held.host,
        wait.as_secs()
    );
    std::thread::sleep(wait);
    let b = match store.get(name) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e),
    };
    if b == bytes {
        return Ok(true);
    }
    match serde_json::from_slice::<LockRecord>(&b) {
        Ok(now) if now.token == held.token && !now.released => {
            let skew = now_unix() - (now.lease_until - lease.as_secs() as i64);
            Err(Error::Unsafe(format!(
                "the lock {name} of pgjet {} (pid {} on host {}) looks expired by this host's clock, but its holder renewed it within the last {} s: the hosts' clocks disagree (this one is about {skew} s ahead of {}); pgjet needs them within {} s of each other (NTP)",
                now.command,
                now.pid,
                now.host,
                wait.as_secs().max(1),
                now.host,
                lease.as_secs()
            )))
        }
        _ => Ok(false),
    }
}

struct Renewal {
    stop: Mutex<bool>,
    wake: Condvar,
    lost: AtomicBool,
    /// Unix seconds until which the last lease written holds: past it, another process may
    /// have taken the lock for stale even if no renewal has failed yet (a paused process).
    lease_until: AtomicI64,
}

/// An exclusive lock on a stanza's backups, released when dropped.
pub struct StanzaLock {
    store: Arc<dyn Storage>,
    stanza: String,
    epoch: u64,
    record: LockRecord,
    renewal: Arc<Renewal>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Releases the lock when the process is cancelled and does not end on its own
    /// ([`crate::io::cancel`]).
    _cancel: crate::io::cancel::Hook,
}

impl StanzaLock {
    /// Takes the backup lock of `stanza` for `command`, without waiting for a live holder.
    ///
    /// Errors: [`Error::Unsafe`] naming the holder (host, pid, command, since when) when
    /// another pgjet holds it, or naming the hosts' clocks when a lease that looks expired
    /// here is still being renewed; [`Error::Repo`] for a lock record that stays unreadable;
    /// storage errors.
    pub fn acquire(store: Arc<dyn Storage>, stanza: &str, command: &str) -> Result<StanzaLock> {
        Self::acquire_timed(store, stanza, command, LEASE, RENEW_EVERY)
    }

    /// [`StanzaLock::acquire`] with a lease of `lease` (whole seconds) renewed every
    /// `renew_every` (tests shorten both).
    #[doc(hidden)]
    pub fn acquire_timed(
        store: Arc<dyn Storage>,
        stanza: &str,
        command: &str,
        lease: Duration,
        renew_every: Duration,
    ) -> Result<StanzaLock> {
        let host = host_name();
        let token = format!("{:032x}", rand_u128());
        let mut unreadable = 0;
        for _ in 0..8 {
            let next = match top_epoch(&*store, stanza)? {
                None => 1,
                Some(top) => {
                    let name = record_name(stanza, top);
                    let bytes = match store.get(&name) {
                        Ok(b) => b,
                        // Removed since the listing: a newer record exists, look again.
                        Err(e) if e.is_not_found() => continue,
                        Err(e) => return Err(e),
                    };
                    let held: LockRecord = match serde_json::from_slice(&bytes) {
                        Ok(r) => r,
                        Err(_) => {
                            // A store that streams writes (SFTP) can show a record being
                            // rewritten.
                            unreadable += 1;
                            if unreadable >= 3 {
                                return Err(Error::Repo(format!(
                                    "the lock record {name} in {} is unreadable; if no pgjet backup of stanza '{stanza}' runs, delete it",
                                    store.describe()
                                )));
                            }
                            std::thread::sleep(Duration::from_millis(500));
                            continue;
                        }
                    };
                    if !held.released {
                        match stale_reason(&held, &host) {
                            Some(Stale::LeaseRanOut(_))
                                if !confirm_stale(
                                    &*store,
                                    &name,
                                    &held,
                                    &bytes,
                                    lease,
                                    renew_every,
                                )? =>
                            {
                                continue
                            }
                            Some(Stale::Gone(why) | Stale::LeaseRanOut(why)) => {
                                tracing::warn!(
                                    "taking over the stale lock of {} (pid {} on {}, taken {}): {why}",
                                    held.command,
                                    held.pid,
                                    held.host,
                                    held.acquired
                                );
                            }
                            None => {
                                return Err(Error::Unsafe(format!(
                                    "another pgjet {} of stanza '{stanza}' is running: pid {} on host {}, since {} (lock {} in {}, lease until {})",
                                    held.command,
                                    held.pid,
                                    held.host,
                                    held.acquired,
                                    name,
                                    store.describe(),
                                    chrono::DateTime::from_timestamp(held.lease_until, 0)
                                        .map(super::label::rfc3339)
                                        .unwrap_or_default()
                                )))
                            }
                        }
                    }
                    top + 1
                }
            };
            let rec = LockRecord {
                host: host.clone(),
                pid: std::process::id(),
                command: command.to_string(),
                token: token.clone(),
                acquired: super::label::rfc3339(chrono::Utc::now()),
                lease_until: now_unix() + lease.as_secs() as i64,
                released: false,
            };
            let name = record_name(stanza, next);
            let json = serde_json::to_vec(&rec)
                .map_err(|e| Error::Other("cannot encode the lock record".into()).because(e))?;
            // Only one create of the next epoch wins; a loser looks again.
            if !store.create_new(&name, &json)? {
                continue;
            }
            remove_earlier(&*store, stanza, next);
            let renewal = Arc::new(Renewal {
                stop: Mutex::new(false),
                wake: Condvar::new(),
                lost: AtomicBool::new(false),
                lease_until: AtomicI64::new(rec.lease_until),
            });
            let thread = {
                let (store, stanza, renewal, rec) = (
                    store.clone(),
                    stanza.to_string(),
                    renewal.clone(),
                    rec.clone(),
                );
                std::thread::Builder::new()
                    .name("pgjet-lock".into())
                    .spawn(move || renew(&*store, &stanza, next, rec, &renewal, lease, renew_every))
                    .map_err(|e| Error::Other("cannot start the lock renewal".into()).because(e))?
            };
            let cancel = {
                let (store, stanza, rec) = (store.clone(), stanza.to_string(), rec.clone());
                crate::io::cancel::on_cancel(crate::io::cancel::Stage::Release, move || {
                    release(&*store, &stanza, next, &rec)
                })
            };
            return Ok(StanzaLock {
                store,
                stanza: stanza.to_string(),
                epoch: next,
                record: rec,
                renewal,
                thread: Some(thread),
                _cancel: cancel,
            });
        }
        Err(Error::Unsafe(format!(
            "could not take the lock of stanza '{stanza}' in {}: other processes keep taking it",
            store.describe()
        )))
    }

    /// Errors when the lock was lost (the lease could not be renewed, or another process
    /// took it) or its last lease has run out (the process was paused past it, so another
    /// may take it for stale at any moment): the backup must not be declared complete then.
    /// Lists the records too, so a takeover since the last renewal is seen at once.
    pub fn check(&self) -> Result<()> {
        let taken = top_epoch(&*self.store, &self.stanza).is_ok_and(|t| t != Some(self.epoch));
        let expired = now_unix() > self.renewal.lease_until.load(Ordering::SeqCst);
        if taken || expired || self.renewal.lost.load(Ordering::SeqCst) {
            return Err(Error::Unsafe(format!(
                "lost the lock {} (its lease could not be renewed or another process took it); the backup is not complete",
                record_name(&self.stanza, self.epoch)
            )));
        }
        Ok(())
    }
}

/// Removes `stanza`'s lock records of epochs before `epoch` (history once `epoch` is
/// taken); a failure only leaves them for the next taker.
fn remove_earlier(store: &dyn Storage, stanza: &str, epoch: u64) {
    let names = match store.list(&lock_dir(stanza)) {
        Ok(n) => n.filter_map(|n| n.ok()).collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!("could not list the earlier lock records of stanza '{stanza}': {e}");
            return;
        }
    };
    for e in names
        .iter()
        .filter_map(|n| parse_epoch(n))
        .filter(|&e| e < epoch)
    {
        if let Err(err) = store.delete(&record_name(stanza, e)) {
            tracing::warn!(
                "could not remove the earlier lock record {}: {err}",
                record_name(stanza, e)
            );
        }
    }
}

/// Renews the lease of `rec` (`stanza`'s record of `epoch`) to `lease` from now every
/// `every` until told to stop; marks the lock lost when the record is no longer the
/// current one or the lease ran out without a successful renewal.
fn renew(
    store: &dyn Storage,
    stanza: &str,
    epoch: u64,
    mut rec: LockRecord,
    r: &Renewal,
    lease: Duration,
    every: Duration,
) {
    let name = record_name(stanza, epoch);
    let mut stop = r.stop.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // The predicate is checked before waiting: a stop set before this thread first took
        // the mutex is not missed.
        let (s, _) = r
            .wake
            .wait_timeout_while(stop, every, |stop| !*stop)
            .unwrap_or_else(|e| e.into_inner());
        stop = s;
        if *stop {
            return;
        }
        let failed = match top_epoch(store, stanza) {
            Ok(top) if top != Some(epoch) => {
                tracing::error!(
                    "the lock {name} was taken by another process (the current record is {})",
                    top.map(|t| record_name(stanza, t))
                        .unwrap_or_else(|| "gone".into())
                );
                r.lost.store(true, Ordering::SeqCst);
                return;
            }
            Ok(_) => {
                let next = LockRecord {
                    lease_until: now_unix() + lease.as_secs() as i64,
                    ..rec.clone()
                };
                // Our own record: no other process writes it.
                match serde_json::to_vec(&next)
                    .map_err(|e| Error::Other("cannot encode the lock record".into()).because(e))
                    .and_then(|j| store.put_durable(&name, &j))
                {
                    Ok(()) => {
                        r.lease_until.store(next.lease_until, Ordering::SeqCst);
                        rec = next;
                        None
                    }
                    Err(e) => Some(e),
                }
            }
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            tracing::warn!("could not renew the lock {name}: {e}");
            if now_unix() > rec.lease_until {
                tracing::error!(
                    "could not renew the lock {name} before its lease ran out: the lock is lost"
                );
                r.lost.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
}

impl Drop for StanzaLock {
    fn drop(&mut self) {
        *self.renewal.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.renewal.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        release(&*self.store, &self.stanza, self.epoch, &self.record);
    }
}

/// Marks the lock record `epoch` of `stanza` released, only while it is still the current
/// record (one taken over stays history). A failure is logged: the lease then runs out.
fn release(store: &dyn Storage, stanza: &str, epoch: u64, record: &LockRecord) {
    if top_epoch(store, stanza).is_ok_and(|t| t == Some(epoch)) {
        let released = LockRecord {
            released: true,
            lease_until: now_unix(),
            ..record.clone()
        };
        let name = record_name(stanza, epoch);
        let written = serde_json::to_vec(&released)
            .map_err(|e| Error::Other("cannot encode the lock record".into()).because(e))
            .and_then(|j| store.put_durable(&name, &j));
        if let Err(e) = written {
            tracing::warn!("could not release the lock {name}: {e}");
        }
    }
}

/// 128 random bits from the kernel (getrandom(2)); falls back to time and pid.
fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        u128::from_le_bytes(b)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        t ^ ((std::process::id() as u128) << 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::posix::PosixStorage;

    fn posix() -> (tempfile::TempDir, Arc<dyn Storage>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Storage> = Arc::new(PosixStorage::open(dir.path()).unwrap());
        (dir, store)
    }

    fn record(host: &str, pid: u32, token: &str, lease_until: i64) -> LockRecord {
        LockRecord {
            host: host.into(),
            pid,
            command: "backup".into(),
            token: token.into(),
            acquired: "2026-01-01T00:00:00Z".into(),
            lease_until,
            released: false,
        }
    }

    fn put(store: &dyn Storage, epoch: u64, rec: &LockRecord) {
        store
            .put_durable(
                &record_name("main", epoch),
                &serde_json::to_vec(rec).unwrap(),
            )
            .unwrap();
    }

    /// The epochs of the records present.
    fn epochs(store: &dyn Storage) -> Vec<u64> {
        let mut e: Vec<u64> = store
            .list("main/lock")
            .unwrap()
            .filter_map(|n| parse_epoch(&n.unwrap()))
            .collect();
        e.sort();
        e
    }

    #[test]
    fn record_names_parse_back_and_others_are_ignored() {
        assert_eq!(record_name("main", 7), "main/lock/backup-0000000007.json");
        assert_eq!(parse_epoch("backup-0000000007.json"), Some(7));
        assert_eq!(parse_epoch("backup-12345678901.json"), Some(12_345_678_901));
        for other in [
            "backup.json",
            "backup-.json",
            "backup-+1.json",
            "backup-0001.json.tmp",
            ".backup-0001.json.x",
        ] {
            assert_eq!(parse_epoch(other), None, "{other}");
        }
    }

    #[test]
    fn a_second_taker_is_refused_by_name_and_a_dead_holder_is_replaced() {
        let (_dir, store) = posix();
        let l = StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
        assert_eq!(l.epoch, 1);
        // Same process: a live holder (our own pid is never taken for dead).
        let e = StanzaLock::acquire(store.clone(), "main", "backup")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("another pgjet backup") && e.contains(&host_name()),
            "{e}"
        );
        l.check().unwrap();
        drop(l);
        // Released: the record stays, marked, and the next taker takes the next epoch at once
        // and removes the earlier record.
        let (epoch, rec) = current(&*store, "main").unwrap().unwrap();
        assert!(epoch == 1 && rec.unwrap().released);
        let t = std::time::Instant::now();
        let l = StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(epochs(&*store), vec![2]);
        drop(l);
        // A record left by a process that is gone (pid beyond pid_max) is stale at once.
        put(
            &*store,
            3,
            &record(&host_name(), 4_194_305, "x", now_unix() + 3600),
        );
        let l = StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
        assert_eq!(epochs(&*store), vec![4]);
        drop(l);
        // Another host's record with a lease that ran out is stale too.
        put(&*store, 5, &record("elsewhere", 4242, "x", now_unix() - 5));
        let (lease, every) = (Duration::from_secs(2), Duration::from_millis(300));
        let t = std::time::Instant::now();
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", lease, every).unwrap();
        // Taken only after watching it for a renewal period.
        assert!(t.elapsed() >= every, "{:?}", t.elapsed());
        assert_eq!(l.epoch, 6);
    }

    /// Many takers of a released lock at once: exactly one gets it; the others are refused
    /// naming it, and the winner's record is the current one.
    #[test]
    fn of_racing_takers_exactly_one_wins() {
        let (_dir, store) = posix();
        racing_takers_leave_one_holder(store);
    }

    /// Eight takers of `store`'s released lock at once: one wins, the others are refused
    /// naming it, and the winner's record is the current one.
    fn racing_takers_leave_one_holder(store: Arc<dyn Storage>) {
        drop(StanzaLock::acquire(store.clone(), "main", "backup").unwrap());
        let go = Arc::new(std::sync::Barrier::new(8));
        let takers: Vec<_> = (0..8)
            .map(|_| {
                let (store, go) = (store.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    StanzaLock::acquire(store, "main", "backup")
                })
            })
            .collect();
        let results: Vec<_> = takers.into_iter().map(|t| t.join().unwrap()).collect();
        let won: Vec<&StanzaLock> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "winners: {}", won.len());
        for r in &results {
            if let Err(e) = r {
                assert!(e.to_string().contains("another pgjet backup"), "{e}");
            }
        }
        let (epoch, rec) = current(&*store, "main").unwrap().unwrap();
        assert_eq!(epoch, won[0].epoch);
        assert_eq!(rec.unwrap().token, won[0].record.token);
        won[0].check().unwrap();
    }

    /// A holder on another host whose clock is behind: its lease looks expired here, but it
    /// keeps renewing it, so the taker refuses, naming the clocks, and the holder keeps it.
    #[test]
    fn a_live_holder_behind_this_clock_is_not_taken_over() {
        let (_dir, store) = posix();
        let behind = 300;
        let theirs = move |t: i64| record("elsewhere", 4242, "theirs", t - behind + 2);
        put(&*store, 1, &theirs(now_unix()));
        let stop = Arc::new(AtomicBool::new(false));
        let holder = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                    put(&*store, 1, &theirs(now_unix()));
                }
            })
        };
        // The taker watches for 1.33 s: the holder's lease_until (whole seconds) changes.
        let e = StanzaLock::acquire_timed(
            store.clone(),
            "main",
            "backup",
            Duration::from_secs(2),
            Duration::from_secs(1),
        )
        .err()
        .unwrap()
        .to_string();
        stop.store(true, Ordering::SeqCst);
        holder.join().unwrap();
        assert!(
            e.contains("clocks disagree") && e.contains("elsewhere"),
            "{e}"
        );
        assert!(e.contains("about 30"), "the skew is named: {e}");
        assert_eq!(epochs(&*store), vec![1]);
        let (_, left) = current(&*store, "main").unwrap().unwrap();
        assert_eq!(left.unwrap().token, "theirs");
    }

    /// Waits up to 10 s for `l` to notice it lost its lock.
    fn lost_within_10s(l: &StanzaLock) -> String {
        let t = std::time::Instant::now();
        loop {
            if let Err(e) = l.check() {
                return e.to_string();
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the lock was never found lost"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn a_lock_taken_over_or_not_renewable_is_lost_and_the_holder_is_told() {
        let (dir, store) = posix();
        let (lease, every) = (Duration::from_secs(2), Duration::from_millis(100));
        // Another process takes the lock over (say, after our lease looked expired to it):
        // it creates the next epoch's record.
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", lease, every).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        l.check().unwrap();
        let other = record("elsewhere", 1, "theirs", now_unix() + 3600);
        let json = serde_json::to_vec(&other).unwrap();
        assert!(store
            .create_new(&record_name("main", l.epoch + 1), &json)
            .unwrap());
        // Seen by the renewal, which stops renewing.
        let t = std::time::Instant::now();
        while !l.renewal.lost.load(Ordering::SeqCst) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the renewal never found the lock lost"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let e = lost_within_10s(&l);
        assert!(
            e.contains("lost the lock main/lock/backup-0000000001.json")
                && e.contains("not complete"),
            "{e}"
        );
        drop(l);
        // The other holder's record is the lock, untouched; ours is history, not released.
        let (epoch, left) = current(&*store, "main").unwrap().unwrap();
        assert_eq!(epoch, 2);
        assert_eq!(store.get(&record_name("main", 2)).unwrap(), json);
        let ours: LockRecord =
            serde_json::from_slice(&store.get(&record_name("main", 1)).unwrap()).unwrap();
        assert!(!ours.released && left.unwrap().token == "theirs");

        // With no renewal due, check() sees a takeover at once: it lists the records.
        put(
            &*store,
            2,
            &LockRecord {
                released: true,
                ..other.clone()
            },
        );
        let hour = Duration::from_secs(3600);
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", hour, hour).unwrap();
        assert_eq!(l.epoch, 3);
        l.check().unwrap();
        put(&*store, 4, &other);
        let e = l.check().unwrap_err().to_string();
        assert!(e.contains("lost the lock"), "{e}");
        drop(l);

        // Its record can be listed but not rewritten until its lease runs out: lost too.
        put(
            &*store,
            4,
            &LockRecord {
                released: true,
                ..other.clone()
            },
        );
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", lease, every).unwrap();
        let path = dir.path().join(record_name("main", l.epoch));
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        lost_within_10s(&l);
        drop(l);

        // A holder paused past its lease (no renewal ran, none failed) is told at once: the
        // record still names it, but another process may take the lock for stale.
        std::fs::remove_dir(&path).unwrap();
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", hour, hour).unwrap();
        l.check().unwrap();
        l.renewal
            .lease_until
            .store(now_unix() - 1, Ordering::SeqCst);
        let e = l.check().unwrap_err().to_string();
        assert!(e.contains("lost the lock"), "{e}");
        drop(l);
    }

    /// The lock on an object store's conditional create (the in-memory store: OpenDAL's
    /// `if_not_exists`, as S3's `If-None-Match: *`): of eight racing takers exactly one wins.
    #[test]
    fn on_an_object_store_racing_takers_leave_one_holder() {
        let store = crate::storage::object::ObjectStorage::in_memory("lock").unwrap();
        racing_takers_leave_one_holder(Arc::new(store));
    }

    /// A store that refuses every renewal: the lock is lost once its lease runs out (check
    /// says so, the backup must not complete); when the store is back the loser still
    /// releases its record on drop (it is still the current one), so the next taker gets
    /// the lock at once instead of waiting out a lease.
    #[test]
    fn renewals_refused_by_the_store_lose_the_lock_and_the_release_still_lands() {
        use crate::error::StorageFault;
        use crate::storage::fault::{Fault, FaultyStorage, Op};
        let mem: Arc<dyn Storage> =
            Arc::new(crate::storage::object::ObjectStorage::in_memory("lease").unwrap());
        let faulty = Arc::new(FaultyStorage::new(mem.clone()));
        let (lease, every) = (Duration::from_secs(2), Duration::from_millis(300));
        let l = StanzaLock::acquire_timed(faulty.clone(), "main", "backup", lease, every).unwrap();
        faulty.inject(
            Op::Put,
            "main/lock/",
            1,
            u32::MAX,
            Fault::Fail(StorageFault::Transient),
        );
        let t = std::time::Instant::now();
        while l.check().is_ok() {
            assert!(t.elapsed() < Duration::from_secs(10), "never lost");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            l.renewal.lost.load(Ordering::SeqCst)
                || now_unix() > l.renewal.lease_until.load(Ordering::SeqCst)
        );
        assert!(faulty.calls(Op::Put, "main/lock/") >= 2);
        faulty.heal();
        drop(l);
        assert!(current(&*mem, "main").unwrap().unwrap().1.unwrap().released);
        let t = std::time::Instant::now();
        drop(StanzaLock::acquire(mem.clone(), "main", "backup").unwrap());
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
