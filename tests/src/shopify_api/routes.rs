//! `POST /admin/api/{version}/graphql.json`: faults first, then the token,
//! the version, the body, and the query.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};

use super::graphql::{GraphqlError, GraphqlRequest};
use super::{Fault, Shared, ShopifyRequest};

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/admin/api/{version}/graphql.json", post(graphql))
        .fallback(|| async { (StatusCode::NOT_FOUND, Json(json!({"errors": "Not Found"}))) })
        .with_state(shared)
}

/// A stable version (`YYYY-01|04|07|10`) or `unstable`
/// (<https://shopify.dev/docs/api/usage/versioning>).
fn valid_version(version: &str) -> bool {
    if version == "unstable" {
        return true;
    }
    let Some((year, month)) = version.split_once('-') else {
        return false;
    };
    year.len() == 4
        && year.bytes().all(|b| b.is_ascii_digit())
        && ["01", "04", "07", "10"].contains(&month)
}

/// A cursor: base64 of `{"last_id":N,"last_value":"N"}`, in Shopify's manner
/// (opaque to clients).
fn cursor(id: u64) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(format!("{{\"last_id\":{id},\"last_value\":\"{id}\"}}"))
}

fn cursor_id(cursor: &str) -> Option<u64> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(cursor)
        .ok()?;
    let value: Value = serde_json::from_slice(&bytes).ok()?;
    value.get("last_id")?.as_u64()
}

fn graphql_error(message: &str) -> Response {
    Json(json!({ "errors": [{ "message": message, "locations": [], "path": [] }] })).into_response()
}

async fn graphql(
    State(shared): State<Arc<Shared>>,
    Path(version): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = GraphqlRequest::parse(&body);
    let response = answer(&shared, &version, &headers, &parsed);
    shared.state().requests.push(ShopifyRequest {
        version,
        query: parsed.ok().map(|r| r.query),
        status: response.status().as_u16(),
    });
    response
}

fn answer(
    shared: &Shared,
    version: &str,
    headers: &HeaderMap,
    parsed: &Result<GraphqlRequest, GraphqlError>,
) -> Response {
    let fault = shared.state().faults.take_next();
    match fault {
        Some(Fault::TooManyRequests(retry_after)) => {
            let mut response = (
                StatusCode::TOO_MANY_REQUESTS,
                Json(json!({"errors": "Exceeded 2 calls per second for api client. Reduce request rates to resume uninterrupted service."})),
            )
                .into_response();
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from(retry_after.as_secs()));
            return response;
        }
        Some(Fault::Throttled) => {
            return Json(json!({
                "errors": [{
                    "message": "Throttled",
                    "extensions": { "code": "THROTTLED", "documentation": "https://shopify.dev/api/usage/rate-limits" }
                }],
                "extensions": { "cost": {
                    "requestedQueryCost": 12, "actualQueryCost": null,
                    "throttleStatus": { "maximumAvailable": 2000.0, "currentlyAvailable": 0, "restoreRate": 100.0 }
                }}
            }))
            .into_response()
        }
        Some(Fault::Status(status)) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (code, Json(json!({"errors": code.canonical_reason().unwrap_or("Error")}))).into_response();
        }
        None => {}
    }
    let token_ok = headers
        .get("x-shopify-access-token")
        .is_some_and(|v| v.as_bytes() == shared.token.as_bytes());
    if !token_ok {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"})),
        )
            .into_response();
    }
    if !valid_version(version) {
        return (StatusCode::NOT_FOUND, Json(json!({"errors": "Not Found"}))).into_response();
    }
    let request = match parsed {
        Ok(request) => request,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"errors": {"query": "Required parameter missing or invalid"}})),
            )
                .into_response()
        }
    };
    let mut response = if request.names("webhookSubscriptions") {
        match subscriptions(shared, version, request) {
            Ok(data) => Json(json!({ "data": data })).into_response(),
            Err(error) => graphql_error(&error.to_string()),
        }
    } else {
        graphql_error("This fake Shopify answers only the webhookSubscriptions query")
    };
    if let Ok(value) = HeaderValue::from_str(version) {
        response
            .headers_mut()
            .insert("x-shopify-api-version", value);
    }
    response
}

/// `{"webhookSubscriptions": {edges, nodes?, pageInfo}}` for the page asked.
fn subscriptions(
    shared: &Shared,
    version: &str,
    request: &GraphqlRequest,
) -> Result<Value, GraphqlError> {
    let (first, after) = request.subscriptions_args()?;
    let after_id = match after {
        None => None,
        Some(cursor) => Some(cursor_id(&cursor).ok_or_else(|| {
            GraphqlError::Query("Invalid cursor for current pagination sort.".into())
        })?),
    };
    let mut all = shared.state().subscriptions.clone();
    all.sort_by_key(|s| s.id);
    let start = after_id.map_or(0, |after| {
        all.iter().position(|s| s.id > after).unwrap_or(all.len())
    });
    let page_len = usize::try_from(first).unwrap_or(usize::MAX);
    let end = start.saturating_add(page_len).min(all.len());
    let page = &all[start..end];
    let wanted = |field: &str| request.names(field);
    let nodes: Vec<Value> = page.iter().map(|s| s.node(version, wanted)).collect();
    let edges: Vec<Value> = page
        .iter()
        .zip(&nodes)
        .map(|(s, node)| json!({ "cursor": cursor(s.id), "node": node }))
        .collect();
    let mut connection = json!({
        "edges": edges,
        "pageInfo": {
            "hasNextPage": end < all.len(),
            "hasPreviousPage": start > 0,
            "startCursor": page.first().map(|s| cursor(s.id)),
            "endCursor": page.last().map(|s| cursor(s.id)),
        }
    });
    if request.names("nodes") {
        connection["nodes"] = Value::Array(nodes);
    }
    Ok(json!({ "webhookSubscriptions": connection }))
}
