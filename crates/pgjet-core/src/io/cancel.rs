//! Cancellation, one for the whole process: SIGTERM or SIGINT. Patroni cancels a replica
//! creation method with SIGTERM, waits 10 s, then kills it and its descendants with SIGKILL
//! (patroni/postgresql/cancellable.py); a DBA presses Ctrl-C (SIGINT); systemd stops a unit
//! with SIGTERM.
//!
//! On the first signal, [`cancelled`] turns true and a thread of its own:
//! 1. runs the interrupt hooks ([`on_cancel`] with [`Stage::Interrupt`]): each connection to
//!    the server sends PostgreSQL's cancel request, so a backend or WAL sender waiting on a
//!    checkpoint, or running `BASE_BACKUP`, stops at once (its backup aborted, its temporary
//!    slot dropped: ReplicationSlotCleanup on error), and an object store's requests end;
//! 2. waits up to [`GRACE`] for the command to end on its own: every worker of
//!    [`crate::io::parallel`] and the stream's decoder check [`check`] and return
//!    [`Error::Cancelled`], and the command's error path cleans up as for any failure (a
//!    permanent slot it made dropped, the repository lock released, the target left marked
//!    unfinished: a copy's marker, pg_control written last);
//! 3. if it has not, runs the release hooks ([`Stage::Release`]: the repository lock, child
//!    processes) and ends the process with status 128 + the signal's number, as a shell
//!    reports a process a signal ended. A second signal skips the wait.
//!
//! The library holds the state and the hooks ([`CancelHandle`]); listening for the signals
//! and ending the process are the binary's (crates/pgjet/signals.rs), so a program that
//! embeds pgjet cancels through [`handle`] and keeps its own process.
//!
//! Nothing of this is needed for safety (a pgjet killed with SIGKILL leaves nothing that looks
//! complete, and the server drops a temporary slot when its session ends), but it makes the
//! server side end at once, even a backend waiting on a spread checkpoint, which would only
//! notice its client is gone after the checkpoint.
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How long the command has to end on its own after the first signal (Patroni waits 10 s).
pub const GRACE: Duration = Duration::from_secs(5);

/// The signal that cancelled the process (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// At once: stop work in progress (a query, a stream, a request).
    Interrupt,
    /// After [`GRACE`], before the process ends: give back what others wait for.
    Release,
}

type HookFn = Box<dyn Fn() + Send + Sync>;

static HOOKS: Mutex<Vec<(u64, Stage, HookFn)>> = Mutex::new(Vec::new());
static NEXT_HOOK: AtomicU64 = AtomicU64::new(1);

/// A registered hook; dropping it unregisters it (the connection it cancels is closed).
#[must_use = "the hook is unregistered when this is dropped"]
pub struct Hook(u64);

impl Drop for Hook {
    fn drop(&mut self) {
        let mut hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
        hooks.retain(|(id, _, _)| *id != self.0);
    }
}

/// Registers `f` to run at `stage` when the process is cancelled, until the returned
/// [`Hook`] is dropped. `f` must not block for long (a cancel request, a removal).
pub fn on_cancel(stage: Stage, f: impl Fn() + Send + Sync + 'static) -> Hook {
    let id = NEXT_HOOK.fetch_add(1, Ordering::SeqCst);
    let mut hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    hooks.push((id, stage, Box::new(f)));
    Hook(id)
}

/// The signal that cancelled the process, if any (SIGTERM is 15, SIGINT 2).
pub fn cancelled() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Errors with [`Error::Cancelled`] once the process is cancelled: called by long loops
/// between items of work.
pub fn check() -> Result<()> {
    match cancelled() {
        None => Ok(()),
        Some(signal) => Err(Error::Cancelled { signal }),
    }
}

/// Runs the hooks of `stage`, each at most once per call, outside the registry's lock.
fn run_hooks(stage: Stage) {
    let hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    for (_, s, f) in hooks.iter() {
        if *s == stage {
            f();
        }
    }
}

/// The process's one cancellation handle: what SIGTERM and SIGINT set in the binary (its
/// signal listener calls [`CancelHandle::cancel`], then [`CancelHandle::release`] when the
/// command has not ended within [`GRACE`]), and what a program that embeds pgjet calls
/// itself. Every worker of [`crate::io::parallel`], the stream decoders, the connections to
/// the server (their cancel requests) and the repository lock see it. Copies are the same
/// handle: the state is the process's.
#[derive(Debug, Clone, Copy, Default)]
pub struct CancelHandle;

/// The process's cancellation handle (see [`CancelHandle`]).
pub fn handle() -> CancelHandle {
    CancelHandle
}

impl CancelHandle {
    /// Cancels the process's work as signal `signal` would (libc::SIGTERM, 15, for a plain
    /// cancel; the binary exits with 128 + it): [`cancelled`] turns true and the interrupt
    /// hooks run at once (cancel requests to the server, an object store's requests end).
    /// Returns false, and does nothing, when it was cancelled already.
    pub fn cancel(&self, signal: i32) -> bool {
        let signal = if signal > 0 { signal } else { libc::SIGTERM };
        if SIGNAL
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        run_hooks(Stage::Interrupt);
        true
    }

    /// Runs the release hooks (the repository lock given back, child processes ended): for a
    /// cancelled process about to end without waiting for its command to return.
    pub fn release(&self) {
        run_hooks(Stage::Release);
    }

    /// The signal the process was cancelled with, if any.
    pub fn cancelled(&self) -> Option<i32> {
        cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_run_by_stage_until_dropped() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let h = on_cancel(Stage::Interrupt, move || {
            m.fetch_add(1, Ordering::SeqCst);
        });
        run_hooks(Stage::Release);
        assert_eq!(n.load(Ordering::SeqCst), 0);
        run_hooks(Stage::Interrupt);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        drop(h);
        run_hooks(Stage::Interrupt);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert!(check().is_ok());
    }
}
