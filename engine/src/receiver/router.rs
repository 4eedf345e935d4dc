//! The routes: `POST /hooks/{source}`, `GET /healthz`, and JSON answers for
//! every path or method that is not one of them.
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
use crate::serve::OVERLOAD_RETRY_AFTER;

/// The receiver's routes over `shared`.
pub(crate) fn routes(shared: Arc<Shared>) -> Router {
    let limits = shared.limits;
    Router::new()
        .route("/hooks/{source}", post(deliver))
        .route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(shed))
                .load_shed()
                .concurrency_limit(limits.max_in_flight)
                .layer(RequestBodyDeadlineLayer::new(limits.body_read_timeout)),
        )
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared)
}

/// `POST /hooks/{source}`: find the source, then handle the delivery in a
/// span that names it (and, once verified, the event id and kind).
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
        kind = Empty
    );
    receive(&shared, &name, &provider, request)
        .instrument(span)
        .await
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
