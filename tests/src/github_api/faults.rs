//! Faults a test queues for the next REST requests: rate limits, server
//! errors, and answers of the test's choosing (a broken or hostile API: a
//! page that repeats, an empty page with a next link), each answered once,
//! in order, before anything else is checked.

use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::error::ApiError;

/// One queued fault.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fault {
    /// 429 with `Retry-After` (a secondary rate limit).
    TooManyRequests(Duration),
    /// 403 with `Retry-After` (GitHub also answers secondary limits so).
    SecondaryForbidden(Duration),
    /// 403 with `x-ratelimit-remaining: 0`, resetting this many seconds from now.
    PrimaryExhausted(Duration),
    /// This status (a 5xx, typically).
    Status(u16),
    /// 200 with this JSON body and, when given, this `Link` header.
    Listing {
        /// The body.
        body: Value,
        /// The `Link` header's value.
        link: Option<String>,
    },
}

/// The queue of faults still to answer.
pub(crate) type Faults = crate::fault_queue::FaultQueue<Fault>;

impl Fault {
    /// The response this fault gives (`now`: the fake's clock, for
    /// `x-ratelimit-reset`).
    pub fn respond(self, now: i64) -> Response {
        match self {
            Fault::Listing { body, link } => {
                let mut response = Json(body).into_response();
                if let Some(link) = link.and_then(|link| HeaderValue::from_str(&link).ok()) {
                    response.headers_mut().insert("link", link);
                }
                response
            }
            error => error.answer(now).into_response(),
        }
    }

    /// The error answer this fault gives (`now`: the fake's clock, for
    /// `x-ratelimit-reset`); a listing is answered by [`Fault::respond`].
    fn answer(self, now: i64) -> ApiError {
        match self {
            Fault::Listing { .. } => ApiError::Server(500),
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
