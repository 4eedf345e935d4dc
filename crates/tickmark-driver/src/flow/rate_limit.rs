//! Fleet-wide rate limits: a token bucket per (limit, key), kept in the
//! database as one number per bucket.
//!
//! The bucket is GCRA (the generic cell rate algorithm): instead of a token
//! count and a refill time it stores the *theoretical arrival time* (TAT) of
//! the next request. A take at time `t` moves the TAT to `max(TAT, t) + T`
//! (`T`: the time one token takes to refill) unless that would put it more
//! than `B·T` ahead of `t` (`B`: the burst). The two are the same bucket —
//! at most `B + t/T` takes in any window of length `t` — but GCRA is one
//! column and one conditional upsert, so a take is one statement that the
//! row lock serialises across every process, with no background refill.
//! (A well-kept crate, `governor`, implements GCRA in memory; the state here
//! must live in the database to be shared, so the arithmetic is in SQL.)

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::key::FlowKey;

/// A token bucket shared by every worker on the database: `burst` tokens
/// when full, refilled at `tokens` per `per`.
///
/// ```
/// use std::time::Duration;
/// use tickmark::flow::RateLimit;
/// // Shopify's Admin API: a bucket of 40 calls, refilling at 2 per second, per store.
/// let limit = RateLimit::new("shopify_admin", 2, Duration::from_secs(1)).burst(40);
/// assert_eq!(limit.refill_every(), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    name: String,
    refill_every: Duration,
    burst: u32,
    problem: Option<RateLimitError>,
}

/// A rate limit that cannot work. Raised when the engine is built (its name
/// is checked there too, by the rules of every name a handler uses).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    /// Zero tokens, a zero period, or a zero burst.
    #[error("rate limit `{name}` must allow at least one token per non-zero period, with a burst of at least 1 (RateLimit::new(name, tokens, per).burst(n))")]
    Empty {
        /// The limit's name.
        name: String,
    },
}

impl RateLimit {
    /// `tokens` per `per`, with a burst of `tokens` (change it with [`burst`](Self::burst)).
    pub fn new(name: impl Into<String>, tokens: u32, per: Duration) -> Self {
        let name = name.into();
        let problem =
            (tokens == 0 || per.is_zero()).then(|| RateLimitError::Empty { name: name.clone() });
        Self {
            refill_every: per.checked_div(tokens).unwrap_or(Duration::ZERO),
            burst: tokens,
            name,
            problem,
        }
    }

    /// How many tokens the full bucket holds: calls that may go at once
    /// after a quiet period.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        if burst == 0 {
            self.problem = Some(RateLimitError::Empty {
                name: self.name.clone(),
            });
        }
        self
    }

    /// The limit's name (steps refer to it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The time one token takes to refill.
    pub fn refill_every(&self) -> Duration {
        self.refill_every
    }

    /// The bucket's capacity.
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    #[doc(hidden)]
    pub fn check(&self) -> Result<(), RateLimitError> {
        match &self.problem {
            Some(problem) => Err(problem.clone()),
            None => Ok(()),
        }
    }

    /// The bucket of one key: `{name}:{key}`, or `{name}` for events that
    /// have no value at the key (they share one bucket: a limit is never
    /// skipped).
    pub fn bucket(&self, key: Option<&str>) -> String {
        match key {
            Some(key) => format!("{}:{key}", self.name),
            None => self.name.clone(),
        }
    }
}

/// A step's use of a rate limit, stored in the event's plan: which limit
/// (by name: its rate and burst are this build's, so a change applies to
/// queued events too) and which key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitUse {
    /// The [`RateLimit`]'s name.
    pub limit: String,
    /// Where the key is in the payload.
    pub key: FlowKey,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refill_interval_is_the_period_over_the_tokens() {
        let limit = RateLimit::new("api", 4, Duration::from_secs(2));
        assert_eq!(limit.refill_every(), Duration::from_millis(500));
        assert_eq!(limit.burst_size(), 4);
        assert!(limit.check().is_ok());
    }

    #[test]
    fn empty_limits_are_refused() {
        assert!(RateLimit::new("api", 0, Duration::from_secs(1))
            .check()
            .is_err());
        assert!(RateLimit::new("api", 1, Duration::ZERO).check().is_err());
        assert!(RateLimit::new("api", 1, Duration::from_secs(1))
            .burst(0)
            .check()
            .is_err());
    }

    #[test]
    fn buckets_are_per_key_and_keyless_events_share_one() {
        let limit = RateLimit::new("api", 1, Duration::from_secs(1));
        assert_eq!(limit.bucket(Some("shop-a")), "api:shop-a");
        assert_eq!(limit.bucket(None), "api");
    }
}
