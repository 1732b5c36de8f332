//! The one way pgjet runs a list of independent work items on several threads: each thread
//! takes the next item as soon as it is free (an atomic cursor: no queue, no allocation per
//! item), keeps its own state (a reader, a buffer), and the first error stops every thread
//! from taking more and is the one returned.
//!
//! Why not rayon: the work here is mostly I/O (reads of files, a repository's objects,
//! requests over libpq), where the thread count is chosen per command (`--jobs`, a source's
//! connections) rather than by the cores, and each thread holds a resource (a connection, a
//! 8 MiB buffer) that must not be shared or duplicated per task. A scoped pool of exactly
//! `threads` threads does that in a few lines; the CPU-bound copy engine
//! (`crate::transfer`) adds its CPU tokens on top of [`Stop`].
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The first error of a group of threads, and whether they should stop.
#[derive(Default)]
pub struct Stop {
    stopped: AtomicBool,
    first: Mutex<Option<Error>>,
}

impl Stop {
    /// Records `e` (only the first error is kept) and tells every thread to stop.
    pub fn fail(&self, e: Error) {
        self.stopped.store(true, Ordering::SeqCst);
        let mut slot = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// Tells every thread to stop without an error (the caller reports why on its own).
    pub fn halt(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// True once a thread failed or [`Stop::halt`] was called.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The first error, if any.
    pub fn into_result(self) -> Result<()> {
        match self.first.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Runs `work(&mut state, i)` for every `i` in `0..n` on `threads` threads (at least one, at
/// most `n`), each with its own `state` made by `init`. Items are taken in order; which
/// thread runs which item is not fixed.
///
/// Errors: the first error of `init` or `work`; the other threads finish the item they hold
/// and take no more.
pub fn for_each_with<S, I, W>(n: usize, threads: usize, init: I, work: W) -> Result<()>
where
    I: Fn() -> Result<S> + Sync,
    W: Fn(&mut S, usize) -> Result<()> + Sync,
{
    let next = AtomicUsize::new(0);
    let stop = Stop::default();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            s.spawn(|| {
                let run = || -> Result<()> {
                    let mut state = init()?;
                    loop {
                        if stop.stopped() {
                            return Ok(());
                        }
                        crate::io::cancel::check()?;
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= n {
                            return Ok(());
                        }
                        work(&mut state, i)?;
                    }
                };
                if let Err(e) = run() {
                    stop.fail(e);
                }
            });
        }
    });
    stop.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_item_runs_once_and_the_first_error_stops_the_rest() {
        let sum = AtomicU64::new(0);
        for_each_with(
            1000,
            4,
            || Ok(()),
            |_, i| {
                sum.fetch_add(i as u64, Ordering::Relaxed);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(sum.into_inner(), 999 * 1000 / 2);
        let ran = AtomicUsize::new(0);
        let e = for_each_with(
            100_000,
            3,
            || Ok(()),
            |_, i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 10 {
                    return Err(Error::Other("item 10".into()));
                }
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "item 10");
        assert!(
            ran.into_inner() < 100_000,
            "the others stopped taking items"
        );
        let e = for_each_with(
            5,
            2,
            || -> Result<()> { Err(Error::Other("init".into())) },
            |_, _| Ok(()),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "init");
        // No items: nothing runs, no error.
        for_each_with(0, 4, || Ok(()), |_, _| -> Result<()> { unreachable!() }).unwrap();
    }
}
