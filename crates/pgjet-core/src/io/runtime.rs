//! The one async runtime of the process. pgjet stays synchronous above this floor: the
//! clients that are async (tokio-postgres for the SQL session and the libpq source, OpenDAL
//! for the object stores) are driven with [`block_on`] from ordinary threads, while their
//! connection tasks and HTTP requests run on the runtime's workers.
//!
//! Worker threads: [`WORKERS`]. They only move bytes between sockets and the callers' buffers
//! (decompression, hashing and page checks run on the callers' threads), so a few suffice;
//! before this runtime was shared, the session, the libpq source and the object store each
//! started their own (1 + 2 + 2 workers), and [`WORKERS`] keeps that total for a command that
//! uses all three at once.
use crate::error::{Error, Result};
use std::future::Future;
use std::sync::{Arc, OnceLock};

/// Worker threads of the runtime (see the module's documentation).
pub const WORKERS: usize = 4;

static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, Arc<std::io::Error>>> =
    OnceLock::new();

/// The runtime, started on first use.
///
/// Errors: the runtime cannot be started (the operating system refused threads).
pub fn get() -> Result<&'static tokio::runtime::Runtime> {
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                .thread_name("pgjet-io")
                .enable_all()
                .build()
                .map_err(Arc::new)
        })
        .as_ref()
        .map_err(|e| Error::Other("cannot start the async runtime".into()).because(e.clone()))
}

/// Runs `f` to completion on the calling thread, its spawned tasks on the runtime's workers.
/// Must not be called from inside the runtime (an async task): pgjet calls it only from its
/// own threads.
///
/// Errors: the runtime cannot be started.
pub fn block_on<F: Future>(f: F) -> Result<F::Output> {
    Ok(get()?.block_on(f))
}

/// Lets the runtime's tasks finish before the process exits, for at most `limit`: tasks
/// that close a connection after its client is dropped run only while the process lives.
/// The SFTP store's ssh connection is one: its task runs `ssh -O exit` for the control
/// master OpenDAL's ssh session starts (`ControlPersist=yes`), which otherwise outlives
/// pgjet. Returns at once when the runtime was never started or has no task left.
pub fn drain(limit: std::time::Duration) {
    let Some(Ok(rt)) = RUNTIME.get() else {
        return;
    };
    let start = std::time::Instant::now();
    while rt.metrics().num_alive_tasks() > 0 && start.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
