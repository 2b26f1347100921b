//! Retry pacing: exponential backoff with full jitter, bounded by the request deadline.
//!
//! Seed 001 (PolarFS, §3.2.1): on a timeout the router keeps retrying with exponential
//! backoff while it watches for a leader change; when a new leader is known it switches
//! and retransmits at once. So a *redirect* (NotLeader with a hint) retries immediately,
//! and only failures that carry no new information (unavailable, transport errors,
//! elections in progress) wait here. Pure: the random source and "now" come from the
//! caller, so the policy is testable without a clock.

use std::time::Duration;

use rand::Rng;

/// How retries are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Ceiling of the first wait.
    pub initial: Duration,
    /// Largest ceiling any wait may have.
    pub max: Duration,
    /// Growth of the ceiling per attempt (2 = doubling).
    pub multiplier: u32,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        // An election takes ~1 s of ticks: the ceiling reaches that within 6 attempts,
        // so a request riding out a leader failover polls a few times per second.
        BackoffPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(500),
            multiplier: 2,
        }
    }
}

impl BackoffPolicy {
    /// The wait ceiling before retry number `attempt` (0 = first retry).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let mut ceiling = self.initial;
        for _ in 0..attempt {
            if ceiling >= self.max {
                break;
            }
            ceiling = ceiling.saturating_mul(self.multiplier.max(1));
        }
        ceiling.min(self.max)
    }

    /// The wait before retry number `attempt`: uniform in `[ceiling/2, ceiling]` (jitter
    /// keeps many clients that failed together from retrying together), never past
    /// `remaining` (the time left before the request's deadline). `None` when no time
    /// is left to wait and retry.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        remaining: Duration,
        rng: &mut R,
    ) -> Option<Duration> {
        if remaining.is_zero() {
            return None;
        }
        let ceiling = self.ceiling(attempt);
        let low = ceiling / 2;
        let wait = if ceiling > low {
            rng.gen_range(low..=ceiling)
        } else {
            ceiling
        };
        Some(wait.min(remaining))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn ceiling_doubles_up_to_max() {
        let p = BackoffPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
            multiplier: 2,
        };
        assert_eq!(p.ceiling(0), Duration::from_millis(10));
        assert_eq!(p.ceiling(1), Duration::from_millis(20));
        assert_eq!(p.ceiling(3), Duration::from_millis(80));
        assert_eq!(p.ceiling(4), Duration::from_millis(100));
        assert_eq!(p.ceiling(1_000), Duration::from_millis(100));
    }

    #[test]
    fn delay_is_jittered_within_half_to_full_ceiling_and_deadline() {
        let seed: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(7);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let p = BackoffPolicy::default();
        let mut distinct = std::collections::BTreeSet::new();
        for attempt in 0..20 {
            let c = p.ceiling(attempt);
            let d = p.delay(attempt, Duration::from_secs(10), &mut rng).unwrap();
            assert!(
                d >= c / 2 && d <= c,
                "seed {seed}: attempt {attempt}: {d:?} vs {c:?}"
            );
            distinct.insert(d);
        }
        assert!(
            distinct.len() > 5,
            "seed {seed}: jitter produced {distinct:?}"
        );
        // The deadline caps the wait, and no time left means no retry.
        let d = p.delay(10, Duration::from_millis(3), &mut rng).unwrap();
        assert_eq!(d, Duration::from_millis(3));
        assert_eq!(p.delay(0, Duration::ZERO, &mut rng), None);
    }
}
