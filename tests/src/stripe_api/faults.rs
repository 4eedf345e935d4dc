//! Faults to inject, consumed in order by the next API requests: a 429 with
//! `Retry-After` (Stripe's rate limiter,
//! <https://docs.stripe.com/rate-limits>), or a 5xx `api_error`
//! (<https://docs.stripe.com/api/errors>: "API errors cover any other type
//! of problem (for example, a temporary problem with Stripe's servers)").

use std::time::Duration;

use super::errors::ApiError;

/// One injected answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 429, code `rate_limit`, `Retry-After: <secs>`.
    RateLimit {
        /// How long the client is told to wait.
        retry_after: Duration,
    },
    /// A 5xx `api_error` with this status.
    Status(u16),
}

impl Fault {
    /// The error answer this fault gives.
    pub fn to_error(&self) -> ApiError {
        match self {
            Self::RateLimit { retry_after } => ApiError::RateLimited {
                // Retry-After carries whole seconds; round a fraction up.
                retry_after_secs: retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0),
            },
            Self::Status(status) => ApiError::Server { status: *status },
        }
    }
}

/// The queue of faults still to serve.
pub(crate) type Faults = crate::fault_queue::FaultQueue<Fault>;
