//! The service's own routes, as it had them before tickmark: create an
//! order, show one. Creating an order now also records its `order.created`
//! event in the same transaction (`Engine::accept_in`): the order and the
//! event commit together or not at all, and the confirmation runs in a
//! worker, once.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tickmark::{Accepted, NewEvent};

use super::handlers::{OrderCreated, APP_SOURCE};
use super::AppState;

/// The body of `POST /orders`.
#[derive(Debug, Deserialize)]
pub struct NewOrder {
    /// Who ordered.
    pub customer: String,
    /// How much, in cents.
    pub amount_cents: i64,
    /// The order's id in Shopify, when it came from there.
    pub shopify_order_id: Option<i64>,
}

/// `POST /orders` with an `Idempotency-Key` header: the key is the order's
/// id and its event's id, so a client that retries after a lost answer
/// creates nothing twice.
pub async fn create(
    State(app): State<AppState>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .filter(|key| !key.is_empty() && key.len() <= 128)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "send an Idempotency-Key header (1 to 128 characters)",
        );
    };
    let order_id = format!("ord_{key}");
    match record(&app, &order_id, &order).await {
        Ok(accepted) => {
            if app.crash_after_commit.as_deref() == Some(key) {
                // The test hook: die after the commit, before the answer,
                // as a process killed there would.
                tracing::warn!(order_id, "crashing after the commit, as asked");
                std::process::abort();
            }
            let created = accepted.is_new();
            Json(json!({ "order": order_id, "created": created })).into_response()
        }
        Err(failure) => {
            tracing::warn!(order_id, error = %failure, "order not recorded");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; retry with the same Idempotency-Key",
            )
        }
    }
}

/// The order and its event, in one transaction of the service's own pool.
async fn record(
    app: &AppState,
    order_id: &str,
    order: &NewOrder,
) -> Result<Accepted, Box<dyn std::error::Error + Send + Sync>> {
    let mut tx = app.pool.begin().await?;
    sqlx::query(
        "INSERT INTO orders (id, customer, amount_cents, shopify_order_id) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
    )
    .bind(order_id)
    .bind(&order.customer)
    .bind(order.amount_cents)
    .bind(order.shopify_order_id)
    .execute(&mut *tx)
    .await?;
    let event = NewEvent::with_id(
        APP_SOURCE,
        order_id,
        "order.created",
        serde_json::to_value(OrderCreated {
            order_id: order_id.to_owned(),
        })?,
    );
    let accepted = app.engine.accept_in(&mut tx, event).await?;
    tx.commit().await?;
    Ok(accepted)
}

/// `GET /orders/{id}`: the order, and its event's step-status table.
pub async fn show(State(app): State<AppState>, Path(order_id): Path<String>) -> Response {
    let order: Result<Option<(String, i64, bool)>, sqlx::Error> =
        sqlx::query_as("SELECT customer, amount_cents, paid FROM orders WHERE id = $1")
            .bind(&order_id)
            .fetch_optional(&app.pool)
            .await;
    let status = app.engine.event_status(APP_SOURCE, &order_id).await;
    match (order, status) {
        (Ok(Some((customer, amount_cents, paid))), Ok(status)) => Json(json!({
            "order": order_id,
            "customer": customer,
            "amount_cents": amount_cents,
            "paid": paid,
            "event": status.as_ref().map(|s| s.state().as_str()),
            "steps": status.map(|s| s.steps).unwrap_or_default(),
        }))
        .into_response(),
        (Ok(None), _) => error(StatusCode::NOT_FOUND, "no such order"),
        (Err(e), _) => {
            tracing::warn!(error = %e, "order not read");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable",
            )
        }
        (_, Err(e)) => {
            tracing::warn!(error = %e, "order's event not read");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable",
            )
        }
    }
}

/// The service's own answer for paths it does not have.
pub async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route in the shop service")
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}
