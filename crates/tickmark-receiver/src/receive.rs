//! One delivery, start to answer: check the declared length and the
//! signature header's shape, read the raw body within the limit and the
//! deadline, verify it on those exact bytes, derive the dedup key (and the
//! replay key, scoped by the handlers: `replay_scope`), accept it into the
//! inbox, and answer at once. Steps never run here; a worker runs them later.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{OriginalUri, Request};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::body_limit::{declared_too_large, discard, read_limited};
use super::providers::{Delivery, Provider, Verdict, VerifiedEvent};
use super::public_url::public_url;
use super::replay_scope::{replay_key_for, Replay};
use super::response::{Answer, DedupMatch, ReceiverRejection};
use super::Shared;
use tickmark_core::inbox::Accepted;
use tickmark_core::tenant::tenant_from_header;
use tickmark_driver::event::NewEvent;
use tickmark_driver::store::StoreError;
use tickmark_serve::OVERLOAD_RETRY_AFTER;

/// What `Retry-After` says when the store is unavailable.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Bodies of this many bytes or more are verified on tokio's blocking pool
/// ([`verify`]); smaller ones, most deliveries, inline.
const VERIFY_ELSEWHERE_BYTES: usize = 64 * 1024;

/// Handle one delivery to `source` (already known to be mounted) inside the
/// request's span, and log its outcome.
pub(crate) async fn receive(
    shared: &Shared,
    source: &str,
    provider: &Arc<dyn Provider>,
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
    provider: &Arc<dyn Provider>,
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
    // A handler may name its tenant by a header; which handler is known
    // only once the provider has read the kind.
    let kept_headers = shared
        .engine
        .registry()
        .has_tenant_headers()
        .then(|| parts.headers.clone());
    let answer = match verify(provider, parts.headers, raw.clone(), url).await {
        Ok(Verdict::Handshake(answer)) => {
            tracing::info!("handshake answered; nothing recorded");
            Ok(Answer::Handshake(answer))
        }
        Ok(Verdict::Event(event)) => {
            let answer = accept(shared, source, event, &raw, kept_headers.as_ref()).await;
            if let Ok(answer) = &answer {
                tracing::Span::current().record("verdict", answer.verdict());
            }
            answer
        }
        Err(rejection) => Err(rejection),
    };
    (answer, true)
}

/// The provider's verdict on the delivery. A body of
/// [`VERIFY_ELSEWHERE_BYTES`] or more is verified on tokio's blocking pool:
/// hashing and parsing a megabyte takes milliseconds, and a burst of such
/// bodies (signed or not) must not hold the runtime threads that read the
/// next requests and answer other deliveries. The in-flight cap bounds how
/// many run at once.
async fn verify(
    provider: &Arc<dyn Provider>,
    headers: HeaderMap,
    body: Bytes,
    public_url: String,
) -> Result<Verdict, ReceiverRejection> {
    let inline = body.len() < VERIFY_ELSEWHERE_BYTES;
    let run = move |provider: &dyn Provider| {
        provider.verify(&Delivery {
            headers: &headers,
            body: &body,
            public_url: &public_url,
            now: chrono::Utc::now(),
        })
    };
    if inline {
        return Ok(run(provider.as_ref())?);
    }
    let provider = Arc::clone(provider);
    match tokio::task::spawn_blocking(move || run(provider.as_ref())).await {
        Ok(verdict) => Ok(verdict?),
        // A panic in a provider is a bug: let it surface as it would have
        // inline (hyper drops the connection; nothing was recorded).
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The runtime is shutting down: the provider retries.
        Err(_) => Err(ReceiverRejection::Overloaded {
            retry_after: OVERLOAD_RETRY_AFTER,
        }),
    }
}
/// Record a verified event in the inbox and say how it went.
async fn accept(
    shared: &Shared,
    source: &str,
    verified: VerifiedEvent,
    body: &[u8],
    headers: Option<&HeaderMap>,
) -> Result<Answer, ReceiverRejection> {
    let replay = replay_key_for(&shared.engine, source, &verified).await;
    let mut event = match verified.id {
        Some(id) => NewEvent::with_id(source, id, verified.kind, verified.payload),
        None => NewEvent::from_body(source, verified.kind, body, verified.payload),
    };
    if let Some(headers) = headers {
        event.tenant = tenant_of_delivery(shared, &event, headers);
    }
    let span = tracing::Span::current();
    span.record("event_id", event.dedup_key.as_str());
    span.record("kind", event.kind.as_str());

    let event_id = event.dedup_key.clone();
    let kind = event.kind.clone();
    match replay.map_err(store_rejection)? {
        Replay::Key(key) => event.replay_key = key,
        Replay::Known(recorded) => {
            tracing::warn!(
                recorded_kind = %recorded.event.kind,
                recorded_event_id = %recorded.event.id,
                "delivery under a kind no handler takes, of signed content recorded before \
                 under a kind one takes (the kind is not signed); nothing recorded"
            );
            return Ok(Answer::Duplicate {
                event_id,
                kind,
                matched: DedupMatch::ReplayKey,
            });
        }
    }
    let replay_key = event.replay_key.clone();
    match shared.engine.accept(event).await {
        Ok(Accepted::New { .. }) => Ok(Answer::New { event_id, kind }),
        Ok(Accepted::Ignored { .. }) => Ok(Answer::Ignored { event_id, kind }),
        Ok(Accepted::Duplicate) => {
            let matched = match replay_key {
                Some(replay_key) => {
                    which_key_matched(shared, source, &event_id, &replay_key, &kind).await
                }
                None => DedupMatch::EventId,
            };
            Ok(Answer::Duplicate {
                event_id,
                kind,
                matched,
            })
        }
        Err(error) => Err(store_rejection(error)),
    }
}

/// The tenant a delivery's header names, when the handler of its kind
/// reads its tenant from a header (`Handler::tenant_header`). A delivery
/// without a usable value is still recorded, outside any tenant's share:
/// refusing it would only make the provider send it again.
fn tenant_of_delivery(shared: &Shared, event: &NewEvent, headers: &HeaderMap) -> Option<String> {
    let name = shared
        .engine
        .registry()
        .find(&event.source, &event.kind)?
        .tenant_header()?;
    let tenant = tenant_from_header(headers.get_all(name).iter().map(HeaderValue::as_bytes));
    if tenant.is_none() {
        tracing::info!(
            header = name,
            "the tenant header is missing, repeated or not visible text: the event is claimed \
             outside any tenant's share"
        );
    }
    tenant
}

/// The answer to a store error while accepting: the provider retries.
fn store_rejection(error: StoreError) -> ReceiverRejection {
    match error {
        StoreError::Overloaded => {
            tracing::warn!("the inbox's queue is full; answering 503 so the provider retries");
            ReceiverRejection::Overloaded {
                retry_after: OVERLOAD_RETRY_AFTER,
            }
        }
        StoreError::AcceptInProgress => {
            tracing::warn!(
                "the event is being accepted in an application's transaction that is still \
                 open; answering 503 so the provider retries once it ends"
            );
            ReceiverRejection::AcceptInProgress {
                retry_after: RETRY_AFTER,
            }
        }
        error if error.is_transient() => {
            tracing::warn!(%error, "event store unavailable; answering 503 so the provider retries");
            ReceiverRejection::StoreUnavailable {
                retry_after: RETRY_AFTER,
            }
        }
        error => {
            tracing::error!(%error, "event store failed; answering 500 so the provider retries");
            ReceiverRejection::StoreFailed
        }
    }
}

/// For a duplicate of a source with a replay key: whether it matched on its
/// event id or on its replay key (the same signed bytes recorded before under
/// another id: a replay, logged). Either way, when the kind it came with (an
/// unsigned header, for Shopify's topic or a generic source's kind header)
/// differs from the recorded event's, that is logged too: the kind is not
/// signed, so it never makes a captured body a new event (Shopify's key is
/// scoped by the kinds a handler names, `replay_scope`: a duplicate under
/// another kind is one of the kinds no handler names). One read, on
/// duplicates of such sources only. An event pruned to a tombstone answers
/// neither: the tombstone keeps no kind and does not say which key matched,
/// so it counts as the event id.
async fn which_key_matched(
    shared: &Shared,
    source: &str,
    event_id: &str,
    replay_key: &str,
    kind: &str,
) -> DedupMatch {
    let store = shared.engine.store();
    let (matched, recorded) = match store.event_find(source, event_id).await {
        Ok(Some(record)) => (DedupMatch::EventId, Some(record)),
        Ok(None) => match store.event_find_by_replay_key(source, replay_key).await {
            Ok(record) => (DedupMatch::ReplayKey, record),
            Err(_) => (DedupMatch::ReplayKey, None),
        },
        Err(_) => (DedupMatch::EventId, None),
    };
    if matched == DedupMatch::ReplayKey {
        tracing::warn!(
            "replayed delivery: its signed content was recorded before under another event id; nothing recorded"
        );
    }
    if let Some(record) = recorded.filter(|record| record.event.kind != kind) {
        tracing::warn!(
            recorded_kind = %record.event.kind,
            recorded_event_id = %record.event.id,
            "duplicate delivery under another kind: the kind is not signed, so the signed content \
             is the event recorded before; nothing recorded"
        );
    }
    matched
}
