//! Faults a test queues for the next REST requests: rate limits and server
//! errors, each answered once, in order, before anything else is checked.

use std::time::Duration;

use super::error::ApiError;

/// One queued fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// 429 with `Retry-After` (a secondary rate limit).
    TooManyRequests(Duration),
    /// 403 with `Retry-After` (GitHub also answers secondary limits so).
    SecondaryForbidden(Duration),
    /// 403 with `x-ratelimit-remaining: 0`, resetting this many seconds from now.
    PrimaryExhausted(Duration),
    /// This status (a 5xx, typically).
    Status(u16),
}

/// The queue of faults still to answer.
pub(crate) type Faults = crate::fault_queue::FaultQueue<Fault>;

impl Fault {
    /// The answer this fault gives (`now`: the fake's clock, for
    /// `x-ratelimit-reset`).
    pub fn answer(self, now: i64) -> ApiError {
        match self {
            Fault::TooManyRequests(retry_after) => ApiError::SecondaryRateLimit {
                status: 429,
                retry_after,
            },
            Fault::SecondaryForbidden(retry_after) => ApiError::SecondaryRateLimit {
                status: 403,
                retry_after,
            },
            Fault::PrimaryExhausted(reset_in) => ApiError::PrimaryRateLimit {
                reset: now.saturating_add(i64::try_from(reset_in.as_secs()).unwrap_or(i64::MAX)),
            },
            Fault::Status(status) => ApiError::Server(status),
        }
    }
}
