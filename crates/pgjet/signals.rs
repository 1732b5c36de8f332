//! SIGTERM and SIGINT for the binary: the first one cancels the command through the
//! library's one handle (`pgjet_core::io::cancel`, whose documentation tells the sequence),
//! and a command that has not ended within its grace ends the process here, with 128 + the
//! signal's number.
use pgjet_core::error::{signal_name, Error, Result};
use pgjet_core::io::cancel::{self, GRACE};
use std::time::Duration;

/// Starts listening for SIGTERM and SIGINT. `last` runs just before a process that did not
/// end on its own within [`GRACE`] exits (the binary's own exit: its runtime drained, its ssh
/// masters ended). Call once, early in `main`, after anything that sets the environment.
/// `stopping` says, in the warning a signal logs, what the command does on its way out.
///
/// Errors: the runtime cannot start, or the handlers cannot be installed.
pub fn install(last: fn(), stopping: &'static str) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = pgjet_core::io::runtime::get()?;
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
            tracing::warn!("{}: stopping ({stopping})", signal_name(sig));
            let handle = cancel::handle();
            handle.cancel(sig);
            let again = wait(Some(GRACE)) != 0;
            tracing::warn!(
                "{}: ending now{}",
                signal_name(sig),
                if again { " (signalled again)" } else { "" }
            );
            handle.release();
            last();
            std::process::exit(128 + sig);
        })
        .map_err(|e| Error::Other(format!("cannot start the cancellation thread: {e}")))?;
    Ok(())
}
