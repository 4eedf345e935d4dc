//! One delivery, start to answer: read the raw body within the limit, verify
//! it on those exact bytes, derive the dedup key, accept it into the inbox,
//! and answer at once. Steps never run here; a worker runs them later.

use std::time::{Duration, Instant};

use axum::extract::{OriginalUri, Request};
use axum::response::{IntoResponse, Response};

use super::body_limit::read_limited;
use super::providers::{Delivery, Provider, Verdict};
use super::public_url::public_url;
use super::response::{Answer, ReceiverRejection};
use super::Shared;
use crate::event::NewEvent;
use crate::inbox::Accepted;

/// What `Retry-After` says when the store is unavailable.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Handle one delivery to `source` (already known to be mounted) inside the
/// request's span, and log its outcome.
pub(crate) async fn receive(
    shared: &Shared,
    source: &str,
    provider: &dyn Provider,
    request: Request,
) -> Response {
    let started = Instant::now();
    let outcome = verify_and_accept(shared, source, provider, request).await;
    let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    match outcome {
        Ok(answer) => {
            if let Some(outcome) = answer.received_outcome() {
                shared.engine.metrics().event_received(source, outcome);
            }
            tracing::info!(
                status = 200,
                outcome = answer.status_word(),
                elapsed_us,
                "delivery answered"
            );
            answer.into_response()
        }
        Err(rejection) => {
            let status = rejection.status().as_u16();
            let code = rejection.code();
            shared.engine.metrics().delivery_rejected(source, code);
            if status >= 500 {
                tracing::warn!(status, error = code, elapsed_us, "delivery not recorded");
            } else {
                tracing::info!(status, error = code, elapsed_us, "delivery refused");
            }
            rejection.into_response()
        }
    }
}

async fn verify_and_accept(
    shared: &Shared,
    source: &str,
    provider: &dyn Provider,
    request: Request,
) -> Result<Answer, ReceiverRejection> {
    let (parts, body) = request.into_parts();
    // Behind `Router::nest`, the original URI still has the prefix the
    // provider used; Twilio signs the full URL.
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map(|original| &original.0)
        .unwrap_or(&parts.uri);
    let raw = read_limited(&parts.headers, body, shared.body_limit).await?;
    let url = public_url(shared.public_base_url.as_ref(), uri, &parts.headers);
    let delivery = Delivery {
        headers: &parts.headers,
        body: &raw,
        public_url: &url,
        now: chrono::Utc::now(),
    };
    let verified = match provider.verify(&delivery)? {
        Verdict::Handshake(answer) => {
            tracing::info!("handshake answered; nothing recorded");
            return Ok(Answer::Handshake(answer));
        }
        Verdict::Event(event) => event,
    };

    let event = match verified.id {
        Some(id) => NewEvent::with_id(source, id, verified.kind, verified.payload),
        None => NewEvent::from_body(source, verified.kind, &raw, verified.payload),
    };
    let span = tracing::Span::current();
    span.record("event_id", event.dedup_key.as_str());
    span.record("kind", event.kind.as_str());

    let event_id = event.dedup_key.clone();
    let kind = event.kind.clone();
    match shared.engine.accept(event).await {
        Ok(Accepted::New { .. }) => Ok(Answer::New { event_id, kind }),
        Ok(Accepted::Ignored { .. }) => Ok(Answer::Ignored { event_id, kind }),
        Ok(Accepted::Duplicate) => Ok(Answer::Duplicate { event_id, kind }),
        Err(error) if error.is_transient() => {
            tracing::warn!(%error, "event store unavailable; answering 503 so the provider retries");
            Err(ReceiverRejection::StoreUnavailable {
                retry_after: RETRY_AFTER,
            })
        }
        Err(error) => {
            tracing::error!(%error, "event store failed; answering 500 so the provider retries");
            Err(ReceiverRejection::StoreFailed)
        }
    }
}
