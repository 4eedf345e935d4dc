//! Faults to inject, consumed in order by the next API requests: a 429 with
//! `Retry-After` (Stripe's rate limiter,
//! <https://docs.stripe.com/rate-limits>), a 5xx `api_error`
//! (<https://docs.stripe.com/api/errors>: "API errors cover any other type
//! of problem (for example, a temporary problem with Stripe's servers)"),
//! or a 200 with a body of the test's choosing: a broken or hostile API (a
//! page that repeats, an empty page with `has_more: true`), or a
//! `Retry-After` no real Stripe sends.

use std::time::Duration;

use serde_json::Value;

use super::errors::ApiError;

/// One injected answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// 429, code `rate_limit`, `Retry-After: <secs>`.
    RateLimit {
        /// How long the client is told to wait.
        retry_after: Duration,
    },
    /// A 5xx `api_error` with this status.
    Status(u16),
    /// 200 with this body, whatever was asked.
    Body(Value),
    /// 429 with this `Retry-After` text, as sent.
    RetryAfterText(String),
}

impl Fault {
    /// The answer this fault gives: a body, or an error.
    pub fn answer(&self) -> Result<Value, ApiError> {
        match self {
            Self::Body(body) => Ok(body.clone()),
            other => Err(other.to_error()),
        }
    }

    /// The error answer this fault gives (a [`Fault::Body`] is answered as
    /// it is, not as an error: see [`Fault::answer`]).
    pub fn to_error(&self) -> ApiError {
        match self {
            Self::Body(_) => ApiError::Server { status: 500 },
            Self::RetryAfterText(text) => ApiError::RateLimitedSaying { text: text.clone() },
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
