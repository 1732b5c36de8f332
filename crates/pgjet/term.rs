//! Progress on the terminal: a bar (bytes, rate, ETA) when stderr is a terminal, a quiet
//! line every 10 seconds otherwise.
use indicatif::{ProgressBar, ProgressStyle};
use pgjet_core::transfer::Progress;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Interval of the progress lines written when stderr is not a terminal.
const LINE_INTERVAL: Duration = Duration::from_secs(10);

pub struct TermProgress {
    bar: Option<ProgressBar>,
    phase: Mutex<(String, Instant, Instant)>,
    total: AtomicU64,
    done: AtomicU64,
}

impl TermProgress {
    pub fn new() -> Self {
        let now = Instant::now();
        TermProgress {
            bar: None,
            phase: Mutex::new((String::new(), now, now)),
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }

    /// A bar on a terminal, unless `quiet`.
    pub fn for_stderr(quiet: bool) -> Self {
        let mut p = Self::new();
        if !quiet && std::io::stderr().is_terminal() {
            let bar = ProgressBar::hidden();
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg:>14} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            p.bar = Some(bar);
        }
        p
    }
}

impl Progress for TermProgress {
    fn begin(&self, phase: &str, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        let now = Instant::now();
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = (phase.to_string(), now, now);
        if let Some(b) = &self.bar {
            b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            b.reset();
            b.set_length(total);
            b.set_position(0);
            b.set_message(phase.to_string());
        }
    }

    fn advance(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(b) = &self.bar {
            b.set_position(done);
            return;
        }
        let mut ph = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if ph.2.elapsed() >= LINE_INTERVAL {
            ph.2 = Instant::now();
            let total = self.total.load(Ordering::Relaxed).max(1);
            let secs = ph.1.elapsed().as_secs_f64().max(1e-3);
            eprintln!(
                "{}: {:.0}% {:.0}/{:.0} MiB, {:.0} MiB/s",
                ph.0,
                done as f64 * 100.0 / total as f64,
                done as f64 / 1048576.0,
                total as f64 / 1048576.0,
                done as f64 / 1048576.0 / secs
            );
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
