//! The stub's one route: record the call and answer it as an idempotent API
//! would.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::json;

use super::{EffectOwner, KeptAnswer, LedgerCall, Shared, MAX_BODY_BYTES};

/// The header a call's key comes in.
static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header on a replayed answer (as Stripe sends it).
static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Every method and path, answered by [`answer`].
pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .fallback(answer)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shared)
}

/// Record one call and answer it: an injected failure if one is due; the
/// first answer again if its key was seen (422 if that was another method or
/// path); otherwise a new effect, `{"id": "eff_<n>", "idempotency_key",
/// "path"}`. A body over [`MAX_BODY_BYTES`] is answered 413, unrecorded.
async fn answer(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let key = request
        .headers()
        .get(&IDEMPOTENCY_KEY)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    // Whose call it is, decided as it arrives, before its body is read.
    let running = shared.owner_now();
    let owner = owner_of(key.as_deref(), running.clone());
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    // A declared length over the cap is refused before reading any of it;
    // a chunked body is cut off at the cap as it is read.
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let body = match Bytes::from_request(request, &()).await {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return too_large();
        }
        Err(rejection) => return rejection.into_response(),
    };

    let mut guard = shared.record();
    // Borrowed whole, so its fields can be borrowed apart.
    let record = &mut *guard;
    let mut call = LedgerCall {
        method,
        path,
        idempotency_key: key,
        body,
        owner,
        running,
        replayed: false,
        applied: false,
        status: StatusCode::OK.as_u16(),
    };
    if let Some((left, status)) = record.failures {
        record.failures = (left > 1).then_some((left - 1, status));
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        call.status = status.as_u16();
        record.calls.push(call);
        let body = json!({"error": "injected failure (EffectLedger::fail_next)"});
        return (status, axum::Json(body)).into_response();
    }
    if let Some(kept) = call
        .idempotency_key
        .as_ref()
        .and_then(|key| record.answers.get(key))
    {
        if kept.method != call.method || kept.path != call.path {
            let body = json!({
                "error": "idempotency key reused on another request",
                "first_used_on": format!("{} {}", kept.method, kept.path),
            });
            call.status = StatusCode::UNPROCESSABLE_ENTITY.as_u16();
            record.calls.push(call);
            return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response();
        }
        let body = kept.body.clone();
        call.replayed = true;
        record.calls.push(call);
        return (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    IDEMPOTENT_REPLAYED.clone(),
                    HeaderValue::from_static("true"),
                ),
            ],
            body,
        )
            .into_response();
    }
    record.applied += 1;
    let body = Bytes::from(
        json!({
            "id": format!("eff_{}", record.applied),
            "idempotency_key": call.idempotency_key,
            "path": call.path,
        })
        .to_string(),
    );
    if let Some(key) = &call.idempotency_key {
        let kept = KeptAnswer {
            method: call.method.clone(),
            path: call.path.clone(),
            body: body.clone(),
        };
        record.answers.insert(key.clone(), kept);
    }
    call.applied = true;
    record.calls.push(call);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// Who made a call with `key` while `running` ran: the step a tickmark key
/// names; else the running step. A key that is the running step's key and
/// more (`{key}-{attempt}`, `{key}:{attempt}`, `retry-{key}`) is the
/// running step's, though it parses as another's (`send_receipt-2`): a
/// per-attempt key is the bug `check` reports, not a step of its own.
fn owner_of(key: Option<&str>, running: Option<EffectOwner>) -> Option<EffectOwner> {
    let Some(key) = key else {
        return running;
    };
    match (EffectOwner::from_key(key), running) {
        (Some(named), Some(running))
            if named != running && key.contains(&running.idempotency_key()) =>
        {
            Some(running)
        }
        (Some(named), _) => Some(named),
        (None, running) => running,
    }
}

/// The answer to a body over [`MAX_BODY_BYTES`].
fn too_large() -> Response {
    let body = json!({
        "error": format!("request body over the effect ledger's {MAX_BODY_BYTES} bytes"),
    });
    (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response()
}
