//! The REST routes, and the gate every request passes first: queued faults,
//! then the token, then `X-GitHub-Api-Version`; every request is recorded
//! with the status it got.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::error::ApiError;
use super::model::{ApiRequest, HookRef};
use super::pagination::{self, ListQuery};
use super::{Attempt, Shared};

/// The REST API version the fake implements
/// (<https://docs.github.com/en/rest/about-the-rest-api/api-versions>).
pub const API_VERSION: &str = "2022-11-28";

type Shard = State<Arc<Shared>>;
type Answer = Result<Response, ApiError>;

/// The fake's router.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/repos/{owner}/{repo}/hooks/{hook_id}/deliveries",
            get(repo_list),
        )
        .route(
            "/repos/{owner}/{repo}/hooks/{hook_id}/deliveries/{delivery_id}",
            get(repo_get),
        )
        .route(
            "/repos/{owner}/{repo}/hooks/{hook_id}/deliveries/{delivery_id}/attempts",
            post(repo_redeliver),
        )
        .route("/orgs/{org}/hooks/{hook_id}/deliveries", get(org_list))
        .route(
            "/orgs/{org}/hooks/{hook_id}/deliveries/{delivery_id}",
            get(org_get),
        )
        .route(
            "/orgs/{org}/hooks/{hook_id}/deliveries/{delivery_id}/attempts",
            post(org_redeliver),
        )
        .route("/app/hook/deliveries", get(app_list))
        .route("/app/hook/deliveries/{delivery_id}", get(app_get))
        .route(
            "/app/hook/deliveries/{delivery_id}/attempts",
            post(app_redeliver),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), gate))
        .with_state(shared)
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// Whether `Authorization` carries the fake's token, as `Bearer <token>` or
/// `token <token>` (<https://docs.github.com/en/rest/authentication/authenticating-to-the-rest-api>).
fn authorised(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some((scheme, credentials)) = value.trim().split_once(' ') else {
        return false;
    };
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
        && credentials.trim() == token
}

async fn gate(State(shared): Shard, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().map(str::to_owned);
    let fault = {
        let mut state = shared.state();
        let now = state.now;
        state.faults.take_next().map(|fault| fault.respond(now))
    };
    let version = request
        .headers()
        .get("x-github-api-version")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut response = if let Some(fault) = fault {
        fault
    } else if !authorised(request.headers(), &shared.token) {
        ApiError::BadCredentials.into_response()
    } else if let Some(version) = version.filter(|v| v != API_VERSION) {
        ApiError::UnsupportedVersion(version).into_response()
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert(
        "x-github-api-version-selected",
        HeaderValue::from_static(API_VERSION),
    );
    headers.insert(
        "x-github-media-type",
        HeaderValue::from_static("github.v3; format=json"),
    );
    shared.state().requests.push(ApiRequest {
        method,
        path,
        query,
        status: response.status().as_u16(),
    });
    response
}

/// A hook or delivery id: a decimal number, else the resource is not found.
fn id(text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| ApiError::NotFound)
}

async fn repo_list(
    state: Shard,
    Path((owner, repo, hook_id)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Answer {
    let hook = HookRef::repo(&owner, &repo, id(&hook_id)?);
    list(&state.0, hook, query.as_deref())
}

async fn repo_get(
    state: Shard,
    Path((owner, repo, hook_id, delivery_id)): Path<(String, String, String, String)>,
) -> Answer {
    let hook = HookRef::repo(&owner, &repo, id(&hook_id)?);
    one(&state.0, &hook, id(&delivery_id)?)
}

async fn repo_redeliver(
    state: Shard,
    Path((owner, repo, hook_id, delivery_id)): Path<(String, String, String, String)>,
) -> Answer {
    let hook = HookRef::repo(&owner, &repo, id(&hook_id)?);
    redeliver(&state.0, &hook, id(&delivery_id)?)
}

async fn org_list(
    state: Shard,
    Path((org, hook_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Answer {
    list(
        &state.0,
        HookRef::org(&org, id(&hook_id)?),
        query.as_deref(),
    )
}

async fn org_get(
    state: Shard,
    Path((org, hook_id, delivery_id)): Path<(String, String, String)>,
) -> Answer {
    one(
        &state.0,
        &HookRef::org(&org, id(&hook_id)?),
        id(&delivery_id)?,
    )
}

async fn org_redeliver(
    state: Shard,
    Path((org, hook_id, delivery_id)): Path<(String, String, String)>,
) -> Answer {
    redeliver(
        &state.0,
        &HookRef::org(&org, id(&hook_id)?),
        id(&delivery_id)?,
    )
}

async fn app_list(state: Shard, RawQuery(query): RawQuery) -> Answer {
    list(&state.0, HookRef::App, query.as_deref())
}

async fn app_get(state: Shard, Path(delivery_id): Path<String>) -> Answer {
    one(&state.0, &HookRef::App, id(&delivery_id)?)
}

async fn app_redeliver(state: Shard, Path(delivery_id): Path<String>) -> Answer {
    redeliver(&state.0, &HookRef::App, id(&delivery_id)?)
}

/// A page of the hook's retained deliveries, newest first, with `Link`.
fn list(shared: &Shared, hook: HookRef, raw_query: Option<&str>) -> Answer {
    let hook = shared.hook(&hook).ok_or(ApiError::NotFound)?.reference;
    let query = ListQuery::parse(raw_query)?;
    let state = shared.state();
    let mut kept: Vec<_> = state
        .deliveries
        .iter()
        .filter(|d| {
            d.hook.same_as(&hook) && state.retained(d.delivered_at) && d.matches(query.status)
        })
        .collect();
    kept.sort_by_key(|d| std::cmp::Reverse(d.id));
    let ids: Vec<u64> = kept.iter().map(|d| d.id).collect();
    let page = pagination::page(&ids, &query);
    let items: Vec<Value> = page
        .ids
        .iter()
        .filter_map(|id| kept.iter().find(|d| d.id == *id))
        .map(|d| d.item_json())
        .collect();
    let link = pagination::link_header(&shared.base_url, &hook.deliveries_path(), &query, &page);
    drop(state);
    let mut response = Json(Value::Array(items)).into_response();
    if let Some(link) = link.and_then(|l| HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert("link", link);
    }
    Ok(response)
}

/// One retained delivery of the hook, with its request and response.
fn one(shared: &Shared, hook: &HookRef, delivery_id: u64) -> Answer {
    shared.hook(hook).ok_or(ApiError::NotFound)?;
    let state = shared.state();
    let delivery = state
        .deliveries
        .iter()
        .find(|d| d.id == delivery_id && d.hook.same_as(hook) && state.retained(d.delivered_at))
        .ok_or(ApiError::NotFound)?;
    Ok(Json(delivery.full_json()).into_response())
}

/// 202 `{}` (the documented `accepted` response), and the delivery posted
/// again to the hook's current URL, in the background.
fn redeliver(shared: &Arc<Shared>, hook: &HookRef, delivery_id: u64) -> Answer {
    let hook = shared.hook(hook).ok_or(ApiError::NotFound)?;
    let attempt = {
        let state = shared.state();
        let delivery = state
            .deliveries
            .iter()
            .find(|d| {
                d.id == delivery_id
                    && d.hook.same_as(&hook.reference)
                    && state.retained(d.delivered_at)
            })
            .ok_or(ApiError::NotFound)?;
        Attempt {
            guid: delivery.guid.clone(),
            event: delivery.event.clone(),
            payload: delivery.payload.clone(),
            body: delivery.request_body.clone(),
            redelivery: true,
        }
    };
    shared.spawn_delivery(hook, attempt);
    Ok((StatusCode::ACCEPTED, Json(json!({}))).into_response())
}
