//! The operations router: what monitoring and operators reach, kept apart
//! from the webhook receiver so it can listen on a private address.
//!
//! | route | answer |
//! |---|---|
//! | `GET /metrics` | this process's counters and the database's queue gauges in the OpenMetrics text format ([`metrics::render`]); 503 with a text body when the database is unavailable, 500 on another store error |
//! | the [`Dashboard`]'s routes | when one is given: `/`, `/events`, `/events/{seq}`, `POST /events/{seq}/retry`, `/login`, `/logout` |
//!
//! With a dashboard that has a token, `/metrics` needs that token too
//! (`Authorization: Bearer <token>`, Prometheus's `authorization` setting, or
//! a signed-in browser's session), unless the dashboard says
//! [`metrics_public`](Dashboard::metrics_public). Without a dashboard, or
//! with one that has no token, there is no token to ask for and `/metrics`
//! is open: serve the router on a private address. It shows counts, source
//! and step names, never payloads.
//!
//! ```
//! use tickmark::{Engine, Handlers, Receiver};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("ops.db").display());
//! let engine = Engine::new(tickmark::connect(&url).await?, Handlers::new())?;
//! let webhooks = Receiver::new(engine.clone()).standalone_router(); // the public address
//! let ops = tickmark::ops::router(engine, None); // a private one: just /metrics, open
//! # let _ = (webhooks, ops);
//! # Ok(())
//! # }
//! ```

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Router};

use crate::{guard_metrics, Dashboard};
use tickmark_core::metrics;
use tickmark_core::Engine;

/// The content type `/metrics` answers with: the OpenMetrics text format,
/// which `prometheus-client` writes and Prometheus asks for first.
pub const METRICS_CONTENT_TYPE: &str = metrics::CONTENT_TYPE;

/// `GET /metrics` for `engine`, and `dashboard`'s pages when given.
pub fn router(engine: Engine, dashboard: Option<Dashboard>) -> Router {
    let mut metrics = Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(engine);
    if let Some(auth) = dashboard.as_ref().and_then(Dashboard::metrics_auth) {
        metrics = metrics.layer(middleware::from_fn_with_state(auth, guard_metrics));
    }
    match dashboard {
        Some(dashboard) => metrics.merge(dashboard.router()),
        None => metrics,
    }
}

/// `GET /metrics`.
async fn serve_metrics(State(engine): State<Engine>) -> Response {
    match metrics::render(engine.metrics(), engine.store().as_ref()).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(METRICS_CONTENT_TYPE),
            )],
            text,
        )
            .into_response(),
        Err(error) if error.is_transient() => {
            tracing::warn!(%error, "/metrics: database unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, HeaderValue::from_static("5"))],
                "tickmark: the database is unavailable; the queue gauges cannot be read. Try again shortly.\n",
            )
                .into_response()
        }
        Err(error) => {
            tracing::error!(%error, "/metrics: store error");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "tickmark: the store could not answer; the server's log has the details.\n",
            )
                .into_response()
        }
    }
}
