//! The stanza's backup lock, on any store: an object `<stanza>/lock/backup.json` created only
//! if absent ([`Storage::create_new`]), holding who took it and a lease the holder renews
//! every [`RENEW_EVERY`]. A holder that crashed loses the lock when its lease runs out
//! ([`LEASE`]), or at once when it ran on this host and its process is gone.
//!
//! Every change of an existing record is conditional on the version last read
//! ([`Storage::replace_if`], [`Storage::delete_if`]: `If-Match` on S3 and Azure, an flock of
//! the lock's directory on posix, compare-then-write on GCS and SFTP): a renewal never
//! writes over a record another process put there after the holder read its own, and a
//! taker removes a stale record only if it is still the one it judged stale. Two takers of
//! a stale lock: only one removal and one create win. A holder whose renewal finds the
//! record changed stops the backup (see [`StanzaLock::check`]). Hosts' clocks must agree to
//! well within [`LEASE`] (a lease is a wall-clock time written by the holder and judged by
//! the taker).
use crate::error::{Error, Result};
use crate::storage::{Storage, Version};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a lock stays valid without renewal.
pub const LEASE: Duration = Duration::from_secs(60);
/// How often the holder renews its lease (a quarter of [`LEASE`]: three renewals may fail in
/// a row before the lease runs out).
pub const RENEW_EVERY: Duration = Duration::from_secs(15);

/// What the lock object holds.
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
}

/// Name of the backup lock object of `stanza`.
pub fn lock_name(stanza: &str) -> String {
    format!("{stanza}/lock/backup.json")
}

/// This host's name (`/proc/sys/kernel/hostname`), or "unknown".
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// True when process `pid` exists on this host.
fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The record of lock `name`, or None when it is absent, unreadable or not a record.
fn read_record(store: &dyn Storage, name: &str) -> Option<LockRecord> {
    // A plain read: no version is needed, and an object store's versioned read is two
    // requests.
    store
        .get(name)
        .ok()
        .and_then(|b| serde_json::from_slice::<LockRecord>(&b).ok())
}

/// The record of lock `name` with the version it was read at, or None when it is absent,
/// unreadable or not a record.
fn read_versioned(store: &dyn Storage, name: &str) -> Option<(LockRecord, Version)> {
    let (b, v) = store.get_versioned(name).ok()??;
    serde_json::from_slice::<LockRecord>(&b)
        .ok()
        .map(|r| (r, v))
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
    if rec.host == host && rec.pid != std::process::id() && !pid_alive(rec.pid) {
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
/// for one renewal period (`renew_every` and a third more). A holder that renews it meanwhile
/// is alive, so the clocks disagree: the error says by about how much (the holder wrote its
/// own clock's time plus `lease` into `lease_until`). Ok(true) when the record stayed as it
/// was (stale), Ok(false) when it went away or another taker replaced it (look again).
fn confirm_stale(
    store: &dyn Storage,
    name: &str,
    held: &LockRecord,
    version: &Version,
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
    let Some((b, v)) = store.get_versioned(name)? else {
        return Ok(false);
    };
    if v == *version {
        return Ok(true);
    }
    match serde_json::from_slice::<LockRecord>(&b) {
        Ok(now) if now.token == held.token => {
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

/// An exclusive lock on a stanza's backups, released (deleted) when dropped.
pub struct StanzaLock {
    store: Arc<dyn Storage>,
    name: String,
    token: String,
    renewal: Arc<Renewal>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StanzaLock {
    /// Takes the backup lock of `stanza` for `command`, without waiting for a live holder.
    ///
    /// Errors: [`Error::Unsafe`] naming the holder (host, pid, command, since when) when
    /// another pgjet holds it; storage errors.
    pub fn acquire(store: Arc<dyn Storage>, stanza: &str, command: &str) -> Result<StanzaLock> {
        Self::acquire_timed(store, stanza, command, LEASE, RENEW_EVERY)
    }

    /// [`StanzaLock::acquire`] with a lease of `lease` (whole seconds) renewed every
    /// `renew_every` (tests shorten both).
    fn acquire_timed(
        store: Arc<dyn Storage>,
        stanza: &str,
        command: &str,
        lease: Duration,
        renew_every: Duration,
    ) -> Result<StanzaLock> {
        let name = lock_name(stanza);
        let host = host_name();
        let token = format!("{:032x}", rand_u128());
        let record = |lease_until: i64| LockRecord {
            host: host.clone(),
            pid: std::process::id(),
            command: command.to_string(),
            token: token.clone(),
            acquired: super::label::rfc3339(chrono::Utc::now()),
            lease_until,
        };
        let mut unreadable = 0;
        for _ in 0..8 {
            let rec = record(now_unix() + lease.as_secs() as i64);
            let json = serde_json::to_vec(&rec).map_err(|e| Error::Other(e.to_string()))?;
            if store.create_new(&name, &json)? {
                let renewal = Arc::new(Renewal {
                    stop: Mutex::new(false),
                    wake: Condvar::new(),
                    lost: AtomicBool::new(false),
                    lease_until: AtomicI64::new(rec.lease_until),
                });
                let thread = {
                    let (store, name, renewal) = (store.clone(), name.clone(), renewal.clone());
                    std::thread::Builder::new()
                        .name("pgjet-lock".into())
                        .spawn(move || renew(&*store, &name, rec, &renewal, lease, renew_every))
                        .map_err(|e| Error::Other(format!("cannot start the lock renewal: {e}")))?
                };
                return Ok(StanzaLock {
                    store,
                    name,
                    token,
                    renewal,
                    thread: Some(thread),
                });
            }
            let (held, version) = match store.get_versioned(&name)? {
                Some(h) => h,
                // Deleted between our create and our read: try again.
                None => continue,
            };
            let held: LockRecord = match serde_json::from_slice(&held) {
                Ok(r) => r,
                Err(_) => {
                    // A store that streams writes (SFTP) can show a record being written.
                    unreadable += 1;
                    if unreadable >= 3 {
                        return Err(Error::Repo(format!(
                            "the lock {name} in {} is unreadable; if no pgjet backup of stanza '{stanza}' runs, delete it",
                            store.describe()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
            };
            match stale_reason(&held, &host) {
                Some(Stale::LeaseRanOut(_))
                    if !confirm_stale(&*store, &name, &held, &version, lease, renew_every)? =>
                {
                    continue
                }
                Some(Stale::Gone(why) | Stale::LeaseRanOut(why)) => {
                    tracing::warn!(
                        "removing the stale lock of {} (pid {} on {}, taken {}): {why}",
                        held.command,
                        held.pid,
                        held.host,
                        held.acquired
                    );
                    // Only that record: one renewed or taken since stays.
                    store.delete_if(&name, &version)?;
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
        Err(Error::Unsafe(format!(
            "could not take the lock {name} of stanza '{stanza}': other processes keep taking it"
        )))
    }

    /// Errors when the lock was lost (the lease could not be renewed, or another process
    /// took it) or its last lease has run out (the process was paused past it, so another
    /// may take it for stale at any moment): the backup must not be declared complete then.
    /// Reads the record too, so a takeover since the last renewal is seen at once (a
    /// renewal never writes over another process's record: it is conditional on the
    /// holder's own, see the module's documentation).
    pub fn check(&self) -> Result<()> {
        let taken = read_record(&*self.store, &self.name).is_some_and(|h| h.token != self.token);
        let expired = now_unix() > self.renewal.lease_until.load(Ordering::SeqCst);
        if taken || expired || self.renewal.lost.load(Ordering::SeqCst) {
            return Err(Error::Unsafe(format!(
                "lost the lock {} (its lease could not be renewed or another process took it); the backup is not complete",
                self.name
            )));
        }
        Ok(())
    }
}

/// Renews `rec`'s lease (`lease` from now) every `every` until told to stop; marks the lock
/// lost when the record is no longer ours or the lease ran out without a successful renewal.
fn renew(
    store: &dyn Storage,
    name: &str,
    mut rec: LockRecord,
    r: &Renewal,
    lease: Duration,
    every: Duration,
) {
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
        let version = match read_versioned(store, name) {
            Some((h, _)) if h.token != rec.token => {
                tracing::error!("the lock {name} was taken by another process");
                r.lost.store(true, Ordering::SeqCst);
                return;
            }
            Some((_, v)) => Some(v),
            None if now_unix() > rec.lease_until => {
                tracing::error!("the lock {name} could not be read before its lease ran out");
                r.lost.store(true, Ordering::SeqCst);
                return;
            }
            None => None,
        };
        let next = LockRecord {
            lease_until: now_unix() + lease.as_secs() as i64,
            ..rec.clone()
        };
        // Written only over the record just read as ours: a takeover in between fails it.
        let written = match &version {
            None => Err(Error::Other("the lock could not be read".into())),
            Some(v) => serde_json::to_vec(&next)
                .map_err(|e| Error::Other(e.to_string()))
                .and_then(|j| store.replace_if(name, &j, v)),
        };
        match written {
            Ok(false) => {
                tracing::error!("the lock {name} was taken by another process during its renewal");
                r.lost.store(true, Ordering::SeqCst);
                return;
            }
            Ok(true) => {
                r.lease_until.store(next.lease_until, Ordering::SeqCst);
                rec = next;
            }
            Err(e) => {
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
}

impl Drop for StanzaLock {
    fn drop(&mut self) {
        *self.renewal.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.renewal.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((h, v)) = read_versioned(&*self.store, &self.name) {
            if h.token == self.token {
                if let Err(e) = self.store.delete_if(&self.name, &v) {
                    tracing::warn!("could not release the lock {}: {e}", self.name);
                }
            }
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

    #[test]
    fn a_second_taker_is_refused_by_name_and_a_dead_holder_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Storage> = Arc::new(PosixStorage::open(dir.path()).unwrap());
        let l = StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
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
        assert!(!store.exists(&lock_name("main")).unwrap());
        // A record left by a process that is gone (pid beyond pid_max) is stale at once.
        let dead = LockRecord {
            host: host_name(),
            pid: 4_194_305,
            command: "backup".into(),
            token: "x".into(),
            acquired: "2026-01-01T00:00:00Z".into(),
            lease_until: now_unix() + 3600,
        };
        store
            .put_durable(&lock_name("main"), &serde_json::to_vec(&dead).unwrap())
            .unwrap();
        let l = StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
        drop(l);
        // Another host's record with a lease that ran out is stale too.
        let expired = LockRecord {
            host: "elsewhere".into(),
            lease_until: now_unix() - 5,
            ..dead
        };
        store
            .put_durable(&lock_name("main"), &serde_json::to_vec(&expired).unwrap())
            .unwrap();
        let (lease, every) = (Duration::from_secs(2), Duration::from_millis(300));
        let t = std::time::Instant::now();
        StanzaLock::acquire_timed(store, "main", "backup", lease, every).unwrap();
        // Taken only after watching it for a renewal period.
        assert!(t.elapsed() >= every, "{:?}", t.elapsed());
    }

    /// A holder on another host whose clock is behind: its lease looks expired here, but it
    /// keeps renewing it, so the taker refuses, naming the clocks, and the holder keeps it.
    #[test]
    fn a_live_holder_behind_this_clock_is_not_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Storage> = Arc::new(PosixStorage::open(dir.path()).unwrap());
        let name = lock_name("main");
        let behind = 300;
        let record = move |t: i64| LockRecord {
            host: "elsewhere".into(),
            pid: 4242,
            command: "backup".into(),
            token: "theirs".into(),
            acquired: "2026-01-01T00:00:00Z".into(),
            lease_until: t - behind + 2,
        };
        store
            .put_durable(&name, &serde_json::to_vec(&record(now_unix())).unwrap())
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let holder = {
            let (store, stop, name) = (store.clone(), stop.clone(), name.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                    let j = serde_json::to_vec(&record(now_unix())).unwrap();
                    store.put_durable(&name, &j).unwrap();
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
        let left: LockRecord = serde_json::from_slice(&store.get(&name).unwrap()).unwrap();
        assert_eq!(left.token, "theirs");
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
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Storage> = Arc::new(PosixStorage::open(dir.path()).unwrap());
        let (lease, every) = (Duration::from_secs(2), Duration::from_millis(100));
        // Another process takes the lock over (say, after our lease looked expired to it).
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", lease, every).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        l.check().unwrap();
        let other = LockRecord {
            host: "elsewhere".into(),
            pid: 1,
            command: "backup".into(),
            token: "theirs".into(),
            acquired: "2026-01-01T00:00:00Z".into(),
            lease_until: now_unix() + 3600,
        };
        store
            .put_durable(&lock_name("main"), &serde_json::to_vec(&other).unwrap())
            .unwrap();
        // Seen by the renewal, which stops renewing, and never written over: each renewal
        // is conditional on the record it read (written once here, while renewals run
        // every 100 ms).
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
            e.contains("lost the lock") && e.contains("not complete"),
            "{e}"
        );
        drop(l);
        // The other holder's record is left alone.
        let left: LockRecord =
            serde_json::from_slice(&store.get(&lock_name("main")).unwrap()).unwrap();
        assert_eq!(left.token, "theirs");

        // With no renewal due, check() sees a takeover at once: it reads the record.
        store.delete(&lock_name("main")).unwrap();
        let hour = Duration::from_secs(3600);
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", hour, hour).unwrap();
        l.check().unwrap();
        store
            .put_durable(&lock_name("main"), &serde_json::to_vec(&other).unwrap())
            .unwrap();
        let e = l.check().unwrap_err().to_string();
        assert!(e.contains("lost the lock"), "{e}");
        drop(l);

        // The lock can be neither read nor renewed until its lease runs out: lost too.
        store.delete(&lock_name("main")).unwrap();
        let l = StanzaLock::acquire_timed(store.clone(), "main", "backup", lease, every).unwrap();
        let path = dir.path().join(lock_name("main"));
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
}
