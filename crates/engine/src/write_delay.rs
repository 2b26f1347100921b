//! The write-rate limiter applied while L0 is at the slowdown trigger: writes are let
//! through at `delayed_write_rate` bytes per second on average (RocksDB's delayed write),
//! so compaction can catch up without the hard stop.
//!
//! A debt clock: each write group moves `due` forward by its bytes' share of a second,
//! starting from now when the clock had fallen behind (no credit is saved while idle).
//! The writer sleeps only once the debt reaches `min_sleep`, since short sleeps are
//! dominated by the timer's granularity; the debt carries over, so the average holds.

use std::time::{Duration, Instant};

/// Sleep no shorter than this: smaller debts accumulate first.
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// The limiter's state (owned by the write leader).
#[derive(Debug, Default)]
pub(crate) struct WriteDelay {
    due: Option<Instant>,
}

impl WriteDelay {
    /// Accounts a write group of `bytes` at `now` under `rate` bytes per second and
    /// returns how long the writer must sleep before going on.
    pub(crate) fn charge(&mut self, now: Instant, bytes: u64, rate: u64) -> Duration {
        let start = self.due.filter(|d| *d > now).unwrap_or(now);
        let cost = Duration::from_secs_f64(bytes as f64 / rate.max(1) as f64);
        let due = start + cost;
        self.due = Some(due);
        let debt = due.saturating_duration_since(now);
        if debt >= MIN_SLEEP {
            debt
        } else {
            Duration::ZERO
        }
    }

    /// Forgets the debt (L0 fell below the trigger).
    pub(crate) fn reset(&mut self) {
        self.due = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_rate_holds_with_sleeps_of_at_least_a_millisecond() {
        let mut d = WriteDelay::default();
        let rate = 1 << 20; // 1 MiB/s
        let mut now = Instant::now();
        let t0 = now;
        let mut slept = Duration::ZERO;
        // 4 MiB in 100-byte writes, with the writer otherwise infinitely fast.
        for _ in 0..(4 << 20) / 100 {
            let s = d.charge(now, 100, rate);
            assert!(s.is_zero() || s >= MIN_SLEEP, "slept {s:?}");
            slept += s;
            now += s;
        }
        let elapsed = (now - t0).as_secs_f64();
        assert!(
            (elapsed - 4.0).abs() < 0.01,
            "4 MiB at 1 MiB/s took {elapsed} s"
        );
        assert_eq!(slept, now - t0);
    }

    #[test]
    fn no_credit_is_saved_while_idle_and_reset_forgets_the_debt() {
        let mut d = WriteDelay::default();
        let t = Instant::now();
        assert_eq!(d.charge(t, 10_000, 1_000_000), Duration::from_millis(10));
        // A second later the debt is paid; a new write pays only for itself.
        let later = t + Duration::from_secs(1);
        assert_eq!(d.charge(later, 2_000, 1_000_000), Duration::from_millis(2));
        // A small write under a millisecond of debt goes through at once.
        let mut d = WriteDelay::default();
        assert_eq!(d.charge(t, 500, 1_000_000), Duration::ZERO);
        assert_eq!(d.charge(t, 600, 1_000_000), Duration::from_micros(1100));
        d.charge(t, 1_000_000, 1_000_000);
        d.reset();
        assert_eq!(d.charge(t, 100, 1_000_000), Duration::ZERO);
    }
}
