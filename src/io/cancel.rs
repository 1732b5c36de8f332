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
//! Nothing of this is needed for safety (a pgjet killed with SIGKILL leaves nothing that looks
//! complete, and the server drops a temporary slot when its session ends), but it makes the
//! server side end at once, even a backend waiting on a spread checkpoint, which would only
//! notice its client is gone after the checkpoint.
use crate::error::{signal_name, Error, Result};
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

/// Starts listening for SIGTERM and SIGINT (see the module's documentation). `last` runs
/// just before a process that did not end on its own within [`GRACE`] exits (the binary's
/// own exit: its runtime drained, its ssh masters ended). Call once, early in `main`, after
/// anything that sets the environment. Errors: the runtime cannot start, or the handlers
/// cannot be installed.
pub fn install(last: fn()) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = crate::io::runtime::get()?;
    let (mut term, mut int) = rt
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
            ))
        })
        .map_err(|e| Error::Other(format!("cannot handle SIGTERM and SIGINT: {e}")))?;
    // The signals are awaited by this thread itself (block_on), not by a task on the
    // runtime: a task would keep the runtime from ever draining (runtime::drain). Returns
    // the signal, or 0 when `limit` passed first.
    let mut wait = move |limit: Option<Duration>| -> i32 {
        rt.block_on(async {
            let sig = async {
                tokio::select! {
                    Some(()) = term.recv() => libc::SIGTERM,
                    Some(()) = int.recv() => libc::SIGINT,
                    else => 0,
                }
            };
            match limit {
                None => sig.await,
                Some(d) => tokio::time::timeout(d, sig).await.unwrap_or(0),
            }
        })
    };
    std::thread::Builder::new()
        .name("pgjet-cancel".into())
        .spawn(move || {
            let sig = wait(None);
            if sig == 0 {
                return;
            }
            SIGNAL.store(sig, Ordering::SeqCst);
            tracing::warn!(
                "{}: stopping (the server's backup and temporary slots are cancelled; a target being written stays marked unfinished)",
                signal_name(sig)
            );
            run_hooks(Stage::Interrupt);
            let again = wait(Some(GRACE)) != 0;
            tracing::warn!(
                "{}: ending now{}",
                signal_name(sig),
                if again { " (signalled again)" } else { "" }
            );
            run_hooks(Stage::Release);
            last();
            std::process::exit(128 + sig);
        })
        .map_err(|e| Error::Other(format!("cannot start the cancellation thread: {e}")))?;
    Ok(())
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
