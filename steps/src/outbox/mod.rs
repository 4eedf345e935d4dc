//! The outbox: outbound webhooks with the engine's own durable retries and
//! dead letters.
//!
//! A handler step [`EnqueueWebhook`] puts the message in the inbox as an
//! event of source [`SOURCE`] and kind [`KIND`], with the step's own
//! idempotency key as the event id: a re-run of the step is a duplicate,
//! never a second message. The event's handler, [`handler()`], runs
//! [`DeliverWebhook`], which POSTs the message to its endpoint signed per
//! [Standard Webhooks](https://www.standardwebhooks.com/) (`webhook-id` is
//! the outbox event's id, the same on every attempt, so receivers
//! deduplicate). Every delivery attempt, retry and dead letter shows in the
//! step-status table like any other event's, under source `outbox`.
//!
//! Endpoints (name → URL and `whsec_` secret) are the [`OutboxEndpoints`]
//! resource; the plan stores only the endpoint's name.
//!
//! ```
//! use tickmark::{Engine, Handler, Handlers};
//! use tickmark_steps::outbox::{self, EnqueueWebhook, OutboxEndpoints};
//! use tickmark_steps::ValueFrom;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("o.db").display());
//! let handlers = Handlers::new()
//!     .on(
//!         "shop",
//!         "order.paid",
//!         Handler::new().step(EnqueueWebhook::new(
//!             "partner",
//!             "order.confirmed",
//!             ValueFrom::event_at("/order"),
//!         )),
//!     )
//!     .on(outbox::SOURCE, outbox::KIND, outbox::handler());
//! let endpoints = OutboxEndpoints::new().endpoint(
//!     "partner",
//!     "http://partner.internal/webhooks",
//!     "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
//! )?;
//! let engine = Engine::new(tickmark::connect(&url).await?, handlers)?.with_resource(endpoints);
//! # let _ = engine;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use tickmark::{Handler, RetryPolicy, StepOptions};

mod deliver;
mod endpoints;
mod enqueue;
mod message;
mod signature;

pub use deliver::{DeliverWebhook, DEFAULT_DELIVERY_TIMEOUT};
pub use endpoints::{Endpoint, OutboxEndpoints};
pub use enqueue::EnqueueWebhook;
pub use message::{OutboxMessage, OutboxOrigin};

/// The source of outbox events.
pub const SOURCE: &str = "outbox";

/// The kind of outbox events.
pub const KIND: &str = "webhook.deliver";

/// The handler of outbox events: [`DeliverWebhook`] with [`retry_policy`].
/// Register it in every process that enqueues or delivers:
/// `Handlers::new().on(outbox::SOURCE, outbox::KIND, outbox::handler())`.
pub fn handler() -> Handler {
    Handler::new()
        .step_with(
            DeliverWebhook::default(),
            // Past the request timeout: a step that hangs anyway is cut here.
            StepOptions::timeout(DEFAULT_DELIVERY_TIMEOUT * 2),
        )
        .retry(retry_policy())
}

/// How deliveries are retried: 16 attempts, from 5 s doubling up to 2 h,
/// 20% jitter — about 11 hours before the outbox event is dead-lettered, in
/// the spirit of the schedules webhook senders publish.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 16,
        initial_delay: Duration::from_secs(5),
        max_delay: Duration::from_secs(2 * 60 * 60),
        multiplier: 2.0,
        jitter: 0.2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_policy_spans_hours_not_days() {
        let policy = retry_policy();
        let total: Duration = (1..policy.max_attempts)
            .map(|attempt| policy.delay_after(attempt, 0.0))
            .sum();
        assert!(
            total > Duration::from_secs(10 * 3600) && total < Duration::from_secs(13 * 3600),
            "{total:?}"
        );
        assert_eq!(handler().step_names(), ["tickmark.deliver_webhook"]);
    }
}
