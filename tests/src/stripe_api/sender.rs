//! The webhook sender: posts each due delivery, signed as Stripe signs, and
//! schedules retries.
//!
//! - Signature: `Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of
//!   "<t>.<body>" keyed with the whole whsec_… secret>`
//!   (<https://docs.stripe.com/webhooks#verify-manually>). `t` is the REAL
//!   wall clock, not the fake's: receivers check it against their own clock
//!   (five minutes' tolerance by default).
//! - Success is any 2xx; anything else (a refused connection, no answer
//!   within [`ATTEMPT_TIMEOUT`], another status) fails the attempt.
//! - Retries: "In live mode, Stripe attempts to deliver a given event to your
//!   webhook endpoint for up to 3 days with an exponential back off"
//!   (<https://docs.stripe.com/webhooks#automatic-retries>; "Stripe
//!   automatically resends the undelivered events to your endpoint for up to
//!   three days", <https://docs.stripe.com/webhooks/process-undelivered-events>).
//!   Stripe does not
//!   publish the intervals; the fake uses [`retry_delay`]. A delivery still
//!   failing when [`RETRY_WINDOW_SECS`] have passed since the event was
//!   created (fake clock) is given up.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Request, Uri};
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How long the fake waits for a receiver's answer before failing the attempt.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long after an event's creation its deliveries are retried: 3 days.
pub const RETRY_WINDOW_SECS: i64 = 3 * 24 * 60 * 60;

/// The first retry's delay; each later one doubles, up to [`MAX_RETRY_DELAY`].
pub const FIRST_RETRY_DELAY: Duration = Duration::from_secs(5 * 60);

/// The longest delay between two attempts.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(12 * 60 * 60);

/// The delay before the next attempt after `failed_attempts` (≥ 1) failed
/// ones: 5 min, 10 min, 20 min, … doubling, at most 12 h.
pub fn retry_delay(failed_attempts: u32) -> Duration {
    let doublings = failed_attempts.saturating_sub(1).min(16);
    FIRST_RETRY_DELAY
        .saturating_mul(1u32 << doublings)
        .min(MAX_RETRY_DELAY)
}

/// What one [`FakeStripe::deliver_due`](super::FakeStripe::deliver_due) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryRound {
    /// Deliveries posted.
    pub attempted: usize,
    /// Posts answered 2xx.
    pub delivered: usize,
    /// Posts that failed (and were rescheduled).
    pub failed: usize,
    /// Deliveries given up this round: due, but past the 3-day window.
    pub given_up: usize,
}

/// One event's delivery state over all its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventDelivery {
    /// Every subscribed endpoint answered 2xx (true when none subscribed).
    pub delivered: bool,
    /// Attempts made, over all endpoints.
    pub attempts: u32,
    /// Some endpoint's delivery was given up.
    pub given_up: bool,
    /// Endpoints not (yet) delivered to: the event's `pending_webhooks`.
    pub pending_webhooks: usize,
    /// When the next attempt is due (fake clock), if one is.
    pub next_attempt_at: Option<i64>,
}

/// `t=<timestamp>,v1=<hex HMAC-SHA256("<timestamp>.<body>")>`.
pub fn stripe_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length: `new_from_slice` cannot fail here.
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC-SHA256 takes a key of any length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// A POST to make: which delivery, where, what.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub event: usize,
    pub delivery: usize,
    pub url: String,
    pub secret: String,
    pub body: Vec<u8>,
}

/// Posts deliveries over plain HTTP.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Sender {
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Post `attempt`, signed now; true on a 2xx within the timeout.
    pub async fn post(&self, attempt: &Attempt) -> bool {
        let Ok(uri) = attempt.url.parse::<Uri>() else {
            return false;
        };
        let timestamp = chrono::Utc::now().timestamp();
        let request = Request::post(uri)
            .header("content-type", "application/json; charset=utf-8")
            .header(
                "user-agent",
                "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
            )
            .header(
                "stripe-signature",
                stripe_signature(&attempt.secret, timestamp, &attempt.body),
            )
            .body(Full::new(Bytes::from(attempt.body.clone())));
        let Ok(request) = request else {
            return false;
        };
        let exchange = async {
            let response = self.client.request(request).await.ok()?;
            let status = response.status();
            // Read the answer through, as a sender does before closing.
            response.into_body().collect().await.ok()?;
            Some(status.is_success())
        };
        matches!(
            tokio::time::timeout(ATTEMPT_TIMEOUT, exchange).await,
            Ok(Some(true))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        assert_eq!(retry_delay(1), Duration::from_secs(300));
        assert_eq!(retry_delay(2), Duration::from_secs(600));
        assert_eq!(retry_delay(3), Duration::from_secs(1200));
        assert_eq!(retry_delay(40), MAX_RETRY_DELAY);
        assert!((1..60).all(|n| retry_delay(n) <= retry_delay(n + 1)));
    }
}
