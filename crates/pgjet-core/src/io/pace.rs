//! [`Pacer`]: holds several threads together to at most a given rate of bytes per second
//! (`--max-rate` on the libpq ranges transport, where many connections share one limit).
//!
//! Each request reserves its bytes before it is sent and waits until the bytes reserved so
//! far, its own included, would have passed at the rate since the first request. So the
//! average rate from the first request on stays at or under the limit, never one request
//! ahead of it. A shared counter under a mutex is all it takes; a rate-limiting crate such
//! as governor counts cells of a fixed size against a burst, which fits requests of 8 MiB
//! and 8 KiB alike less simply than this does.
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A shared byte-rate limit (see the module's documentation).
#[derive(Debug)]
pub struct Pacer {
    /// Bytes per second.
    rate: u64,
    /// When the first request was reserved, and the bytes reserved since.
    state: Mutex<Option<(Instant, u64)>>,
}

impl Pacer {
    /// A pacer of `rate` bytes per second (at least 1).
    pub fn new(rate: u64) -> Pacer {
        Pacer {
            rate: rate.max(1),
            state: Mutex::new(None),
        }
    }

    /// How long a request of `bytes` must wait before it is sent, reserving its bytes.
    pub fn reserve(&self, bytes: u64) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (start, before) = *st.get_or_insert((now, 0));
        let reserved = before + bytes;
        *st = Some((start, reserved));
        let due = start + Duration::from_secs_f64(reserved as f64 / self.rate as f64);
        due.saturating_duration_since(now)
    }

    /// [`Pacer::reserve`], then waits.
    pub fn take(&self, bytes: u64) {
        let wait = self.reserve(bytes);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

/// Pauses between two looks at something that usually comes within milliseconds (the WAL
/// summarizer's progress, a segment reaching the archive): 5 ms first, doubling up to `max`.
#[derive(Debug)]
pub struct Backoff {
    pause: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at 5 ms (or `max` when that is less).
    pub fn new(max: Duration) -> Backoff {
        Backoff {
            pause: Duration::from_millis(5).min(max),
            max,
        }
    }

    /// Sleeps for the current pause, then doubles it (at most `max`).
    pub fn sleep(&mut self) {
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_wait_for_the_bytes_reserved_so_far() {
        let p = Pacer::new(1000);
        let w = p.reserve(500);
        assert!(
            w > Duration::from_millis(450) && w <= Duration::from_millis(500),
            "{w:?}"
        );
        let w = p.reserve(500);
        assert!(
            w > Duration::from_millis(950) && w <= Duration::from_millis(1000),
            "{w:?}"
        );
        let w = p.reserve(10);
        assert!(
            w > Duration::from_millis(960) && w <= Duration::from_millis(1010),
            "{w:?}"
        );
    }

    #[test]
    fn threads_share_the_rate() {
        let p = Pacer::new(4 << 20);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..4 {
                        p.take(256 << 10);
                    }
                });
            }
        });
        // 16 requests of 256 KiB at 4 MiB/s: the last waits for all 4 MiB, 1 s.
        let e = t.elapsed().as_secs_f64();
        assert!((0.95..1.3).contains(&e), "{e}");
    }
}
