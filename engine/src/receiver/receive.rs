//! One delivery, start to answer: check the declared length and the
//! signature header's shape, read the raw body within the limit and the
//! deadline, verify it on those exact bytes, derive the dedup key (and the
//! replay key), accept it into the inbox, and answer at once. Steps never run
//! here; a worker runs them later.

use std::time::{Duration, Instant};

use axum::extract::{OriginalUri, Request};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::body_limit::{declared_too_large, discard, read_limited};
use super::limits::OVERLOAD_RETRY_AFTER;
use super::providers::{Delivery, Provider, Verdict};
use super::public_url::public_url;
use super::response::{Answer, DedupMatch, ReceiverRejection};
use super::Shared;
use crate::event::NewEvent;
use crate::inbox::Accepted;
use crate::store::StoreError;

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
    let (outcome, body_read) = verify_and_accept(shared, source, provider, request).await;
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
            let mut response = rejection.into_response();
            if !body_read {
                // The rest of the body is drained in the background or not at
                // all: this connection cannot carry another request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }
    }
}

/// The answer, and whether the body was read to its end (when it was not,
/// the connection is closed after the answer).
async fn verify_and_accept(
    shared: &Shared,
    source: &str,
    provider: &dyn Provider,
    request: Request,
) -> (Result<Answer, ReceiverRejection>, bool) {
    let (parts, body) = request.into_parts();
    // Refusals that need no body come first, so that an oversized or
    // unsigned body is never buffered.
    let before_body = declared_too_large(&parts.headers, shared.body_limit).or_else(|| {
        provider
            .check_headers(&parts.headers)
            .err()
            .map(ReceiverRejection::from)
    });
    if let Some(rejection) = before_body {
        discard(&parts.headers, body);
        return (Err(rejection), false);
    }
    let raw = match read_limited(
        &parts.headers,
        body,
        shared.body_limit,
        shared.limits.body_read_timeout,
    )
    .await
    {
        Ok(raw) => raw,
        Err(rejection) => return (Err(rejection), false),
    };
    // Behind `Router::nest`, the original URI still has the prefix the
    // provider used; Twilio signs the full URL.
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map(|original| &original.0)
        .unwrap_or(&parts.uri);
    let url = public_url(shared.public_base_url.as_ref(), uri, &parts.headers);
    let delivery = Delivery {
        headers: &parts.headers,
        body: &raw,
        public_url: &url,
        now: chrono::Utc::now(),
    };
    (
        verify_then_accept(shared, source, provider, &delivery).await,
        true,
    )
}

async fn verify_then_accept(
    shared: &Shared,
    source: &str,
    provider: &dyn Provider,
    delivery: &Delivery<'_>,
) -> Result<Answer, ReceiverRejection> {
    let verified = match provider.verify(delivery)? {
        Verdict::Handshake(answer) => {
            tracing::info!("handshake answered; nothing recorded");
            return Ok(Answer::Handshake(answer));
        }
        Verdict::Event(event) => event,
    };

    let mut event = match verified.id {
        Some(id) => NewEvent::with_id(source, id, verified.kind, verified.payload),
        None => NewEvent::from_body(source, verified.kind, delivery.body, verified.payload),
    };
    event.replay_key = verified.replay_key;
    let span = tracing::Span::current();
    span.record("event_id", event.dedup_key.as_str());
    span.record("kind", event.kind.as_str());

    let event_id = event.dedup_key.clone();
    let kind = event.kind.clone();
    let replay_key = event.replay_key.clone();
    match shared.engine.accept(event).await {
        Ok(Accepted::New { .. }) => Ok(Answer::New { event_id, kind }),
        Ok(Accepted::Ignored { .. }) => Ok(Answer::Ignored { event_id, kind }),
        Ok(Accepted::Duplicate) => {
            let matched = if replay_key.is_some() && is_replay(shared, source, &event_id).await {
                tracing::warn!(
                    "replayed delivery: its signed content was recorded before under another event id; nothing recorded"
                );
                DedupMatch::ReplayKey
            } else {
                DedupMatch::EventId
            };
            Ok(Answer::Duplicate {
                event_id,
                kind,
                matched,
            })
        }
        Err(StoreError::Overloaded) => {
            tracing::warn!("the inbox's queue is full; answering 503 so the provider retries");
            Err(ReceiverRejection::Overloaded {
                retry_after: OVERLOAD_RETRY_AFTER,
            })
        }
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

/// Whether a duplicate matched on its replay key rather than its event id:
/// no event has this id, so another id carried the same signed bytes (or the
/// event was pruned and a tombstone answered: which of its keys matched, a
/// tombstone does not say). One read, on duplicates of sources with a replay
/// key only.
async fn is_replay(shared: &Shared, source: &str, event_id: &str) -> bool {
    matches!(
        shared.engine.store().event_find(source, event_id).await,
        Ok(None)
    )
}
