//! The durable retry schedule: a policy stored with each event's plan, and a
//! pure function from the stored attempt count to the next delay.
//!
//! Nothing about the schedule lives in memory: the attempt count is a column,
//! the next run time is a column (`due_at`), and the delay is recomputed from
//! them, so a restart never resets it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a handler's failed steps are retried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts per step before the event is dead-lettered (at least 1).
    pub max_attempts: u32,
    /// Delay after the first failed attempt.
    #[serde(with = "millis")]
    pub initial_delay: Duration,
    /// Upper bound of any delay.
    #[serde(with = "millis")]
    pub max_delay: Duration,
    /// Each retry waits `multiplier` times longer than the previous one.
    pub multiplier: f64,
    /// Fraction of each delay that is randomised away (0 = none, 1 = all), so
    /// that events failing together do not retry together.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    /// 10 attempts, from 1 s doubling up to 1 h, 20% jitter: about 8.5 min of
    /// retrying before the last attempt.
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(3600),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// A policy with `max_attempts` attempts and the default delays.
    pub fn attempts(max_attempts: u32) -> Self {
        Self {
            max_attempts,
            ..Self::default()
        }
    }

    /// Set the first delay and the cap.
    pub fn delays(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_delay = initial;
        self.max_delay = max;
        self
    }

    /// Whether a step that has failed on attempt `attempt` (1-based) may run again.
    pub fn allows_another_attempt(&self, attempt: u32) -> bool {
        attempt < self.max_attempts.max(1)
    }

    /// The delay before the retry that follows failed attempt `attempt`
    /// (1-based), given a uniform random sample `unit` in `[0, 1)`.
    ///
    /// Pure and total: exponential from `initial_delay` by `multiplier`, capped
    /// at `max_delay`, then shortened by up to `jitter` of itself.
    pub fn delay_after(&self, attempt: u32, unit: f64) -> Duration {
        let initial = self.initial_delay.as_secs_f64();
        let cap = self.max_delay.as_secs_f64().max(0.0);
        let multiplier = if self.multiplier.is_finite() {
            self.multiplier.max(1.0)
        } else {
            1.0
        };
        let exponent = attempt.saturating_sub(1).min(1024) as i32;
        let raw = initial * multiplier.powi(exponent);
        let capped = if raw.is_finite() { raw.min(cap) } else { cap };
        let jitter = if self.jitter.is_finite() {
            self.jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let seconds = capped * (1.0 - jitter * unit);
        Duration::from_secs_f64(seconds.clamp(0.0, cap))
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy() -> impl Strategy<Value = RetryPolicy> {
        (
            1u32..50,
            0u64..100_000,
            0u64..10_000_000,
            0.5f64..10.0,
            0.0f64..1.0,
        )
            .prop_map(
                |(max_attempts, initial, max, multiplier, jitter)| RetryPolicy {
                    max_attempts,
                    initial_delay: Duration::from_millis(initial),
                    max_delay: Duration::from_millis(max),
                    multiplier,
                    jitter,
                },
            )
    }

    proptest! {
        #[test]
        fn never_exceeds_the_cap(p in policy(), attempt in any::<u32>(), unit in 0.0f64..1.0) {
            prop_assert!(p.delay_after(attempt, unit) <= p.max_delay);
        }

        #[test]
        fn jitter_only_shortens_within_its_fraction(p in policy(), attempt in 1u32..200, unit in 0.0f64..1.0) {
            let full = p.delay_after(attempt, 0.0).as_secs_f64();
            let jittered = p.delay_after(attempt, unit).as_secs_f64();
            prop_assert!(jittered <= full + 1e-9);
            prop_assert!(jittered + 1e-6 >= full * (1.0 - p.jitter));
        }

        #[test]
        fn grows_with_attempts_until_capped(p in policy(), attempt in 1u32..200) {
            let this = p.delay_after(attempt, 0.0);
            let next = p.delay_after(attempt + 1, 0.0);
            prop_assert!(next >= this);
        }

        #[test]
        fn is_a_function_of_its_inputs(p in policy(), attempt in any::<u32>(), unit in 0.0f64..1.0) {
            prop_assert_eq!(p.delay_after(attempt, unit), p.delay_after(attempt, unit));
        }

        #[test]
        fn survives_nonsense(attempt in any::<u32>(), unit in any::<f64>(), multiplier in any::<f64>(), jitter in any::<f64>()) {
            let p = RetryPolicy { multiplier, jitter, ..RetryPolicy::default() };
            prop_assert!(p.delay_after(attempt, unit) <= p.max_delay);
        }
    }

    #[test]
    fn default_schedule_doubles_from_one_second() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_after(1, 0.0), Duration::from_secs(1));
        assert_eq!(p.delay_after(2, 0.0), Duration::from_secs(2));
        assert_eq!(p.delay_after(4, 0.0), Duration::from_secs(8));
        assert_eq!(p.delay_after(40, 0.0), Duration::from_secs(3600));
        assert!(p.allows_another_attempt(9));
        assert!(!p.allows_another_attempt(10));
    }

    #[test]
    fn policy_round_trips_through_json() {
        let p =
            RetryPolicy::attempts(3).delays(Duration::from_millis(250), Duration::from_secs(60));
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<RetryPolicy>(&json).unwrap(), p);
    }
}
