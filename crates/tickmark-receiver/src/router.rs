//! The routes: `POST /hooks/{source}` (the path template), answering an
//! unknown source and another method on it in JSON; and, for a receiver
//! served alone, `GET /healthz` and JSON answers for every other path or
//! method.
//!
//! The plain router sets no router-wide fallback: axum refuses to merge two
//! routers that both have one, and the application's own fallback should
//! answer the application's paths. The 405 of the delivery route is that
//! route's own fallback, so it holds wherever the router is merged or nested.
//!
//! Deliveries go through tower's in-flight cap, which sheds load instead of
//! queueing (`ConcurrencyLimit` under `LoadShed`: beyond the cap, 503 at
//! once), and tower-http's body deadline (`DeadlineBody`: the whole body
//! within the body-read timeout). `/healthz` is outside both.

use std::sync::Arc;

use axum::error_handling::HandleErrorLayer;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tower::ServiceBuilder;
use tower_http::timeout::RequestBodyDeadlineLayer;
use tracing::field::Empty;
use tracing::Instrument;

use super::receive::receive;
use super::response::ReceiverRejection;
use super::Shared;
use tickmark_driver::trace_context::TraceContext;
use tickmark_serve::{Limits, OVERLOAD_RETRY_AFTER};

/// The delivery route at `path` (a checked template) over `shared`.
pub(crate) fn routes(shared: Arc<Shared>, path: &str) -> Router {
    delivery(path, shared.limits).with_state(shared)
}

/// The delivery route, `GET /healthz`, and JSON answers for every other
/// path and method: a receiver served alone.
pub(crate) fn standalone(shared: Arc<Shared>, path: &str) -> Router {
    delivery(path, shared.limits)
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared)
}

/// `POST path` with its own 405, behind the in-flight cap and the body
/// deadline.
fn delivery(path: &str, limits: Limits) -> Router<Arc<Shared>> {
    Router::new()
        .route(path, post(deliver).fallback(other_method))
        .route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(shed))
                .load_shed()
                .concurrency_limit(limits.max_in_flight)
                .layer(RequestBodyDeadlineLayer::new(limits.body_read_timeout)),
        )
}

/// `POST /hooks/{source}` (or the template's path): find the source, then
/// handle the delivery in a span that names it (and, once verified, the
/// event id and kind).
async fn deliver(
    State(shared): State<Arc<Shared>>,
    source: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let Some((name, provider)) = source
        .ok()
        .and_then(|Path(name)| shared.sources.get_key_value(&name))
        .map(|(name, provider)| (name.clone(), Arc::clone(provider)))
    else {
        // The path segment is the sender's text: it is not logged.
        tracing::debug!("delivery to an unknown source refused");
        return ReceiverRejection::UnknownSource.into_response();
    };
    let span = tracing::info_span!(
        "webhook",
        source = %name,
        provider = provider.name(),
        event_id = Empty,
        kind = Empty,
        verdict = Empty,
    );
    // A sender that traces its deliveries (a service of the team's own,
    // through a generic source) starts the event's trace under its span.
    // Unsigned and untrusted: it only names a parent, checked for shape.
    tickmark_core::trace::continue_under(&span, sender_trace(request.headers()).as_ref());
    receive(&shared, &name, &provider, request)
        .instrument(span)
        .await
}

/// The W3C trace context a delivery carries, when it is well formed: one
/// `traceparent` (and at most one `tracestate`).
fn sender_trace(headers: &http::HeaderMap) -> Option<TraceContext> {
    let one = |name| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok(),
            _ => None,
        }
    };
    TraceContext::parse(one("traceparent")?, one("tracestate"))
}

/// `GET /healthz`: the process is up and serving. It does not touch the
/// database: a store outage is reported per delivery, with 503.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// A delivery beyond the in-flight cap (the only error the layers raise):
/// 503 with `Retry-After`, its body unread.
async fn shed(error: tower::BoxError) -> ReceiverRejection {
    tracing::debug!(%error, "delivery shed: the in-flight cap is full");
    ReceiverRejection::Overloaded {
        retry_after: OVERLOAD_RETRY_AFTER,
    }
}

async fn not_found() -> ReceiverRejection {
    ReceiverRejection::NotFound
}

async fn method_not_allowed() -> ReceiverRejection {
    ReceiverRejection::MethodNotAllowed
}

/// Another method than `POST` on the delivery path: 404 for a source that
/// is not mounted (as a `POST` to it is answered: a `GET` must not tell an
/// unknown source from a known one by its 405), 405 for a mounted one.
async fn other_method(
    State(shared): State<Arc<Shared>>,
    source: Result<Path<String>, PathRejection>,
) -> ReceiverRejection {
    match source {
        Ok(Path(name)) if shared.sources.contains_key(&name) => ReceiverRejection::MethodNotAllowed,
        _ => ReceiverRejection::UnknownSource,
    }
}
