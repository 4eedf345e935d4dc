//! What the receiver answers. Always a JSON body that says what happened:
//! accepted deliveries are [`Answer`]s (200), refused ones are
//! [`ReceiverRejection`]s (4xx/5xx). Bodies name the problem with a stable
//! machine code and a sentence for the person reading the provider's delivery
//! log; they never contain SQL, secrets, stack traces or echoed request bytes.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::providers::Rejection;

/// What an accepted delivery was answered with (always 200).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The first delivery of this event: recorded, and its handler's steps will
    /// run in a worker. `{"status":"new","event_id":…,"kind":…}`
    New {
        /// The dedup key: the provider's event id, or `sha256:` of the body.
        event_id: String,
        /// The event type.
        kind: String,
    },
    /// Recorded earlier: nothing was written and nothing runs again. A
    /// duplicate is never an error, so the provider stops retrying.
    /// `{"status":"duplicate","matched":"event_id"|"replay_key",…}`
    Duplicate {
        /// The dedup key.
        event_id: String,
        /// The event type.
        kind: String,
        /// Which key was seen before.
        matched: DedupMatch,
    },
    /// The first delivery of a kind that has no handler: recorded (so
    /// redeliveries are duplicates and the provider stops retrying), nothing
    /// runs. `{"status":"ignored",…}`
    Ignored {
        /// The dedup key.
        event_id: String,
        /// The event type.
        kind: String,
    },
    /// A provider's verified handshake (Slack's `url_verification`), answered
    /// with this JSON; nothing is recorded.
    Handshake(serde_json::Value),
}

impl Answer {
    /// The dedup decision in a word, as the delivery's span names it:
    /// `new`, `ignored`, `duplicate` (its event id was seen), `replay` (its
    /// signed content was seen under another id), `handshake`.
    pub fn verdict(&self) -> &'static str {
        match self {
            Answer::New { .. } => "new",
            Answer::Ignored { .. } => "ignored",
            Answer::Duplicate {
                matched: DedupMatch::EventId,
                ..
            } => "duplicate",
            Answer::Duplicate {
                matched: DedupMatch::ReplayKey,
                ..
            } => "replay",
            Answer::Handshake(_) => "handshake",
        }
    }
}

/// Which key made a delivery a [duplicate](Answer::Duplicate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupMatch {
    /// Its event id was recorded before: a redelivery. `"event_id"`
    EventId,
    /// Another event id carried the same signed content before: a captured
    /// delivery sent again with a new id (docs/receiver.md, "Replays").
    /// `"replay_key"`
    ReplayKey,
}

impl DedupMatch {
    /// The `matched` word of the JSON body.
    pub fn as_str(self) -> &'static str {
        match self {
            DedupMatch::EventId => "event_id",
            DedupMatch::ReplayKey => "replay_key",
        }
    }
}

impl Answer {
    /// The `status` word of the JSON body (`new`, `duplicate`, `ignored`,
    /// `handshake`).
    pub fn status_word(&self) -> &'static str {
        match self {
            Answer::New { .. } => "new",
            Answer::Duplicate { .. } => "duplicate",
            Answer::Ignored { .. } => "ignored",
            Answer::Handshake(_) => "handshake",
        }
    }

    /// The `outcome` label of `tickmark_events_received_total`, for answers
    /// that recorded (or found) an event.
    pub fn received_outcome(&self) -> Option<&'static str> {
        match self {
            Answer::Handshake(_) => None,
            _ => Some(self.status_word()),
        }
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let status = self.status_word();
        match self {
            Answer::New { event_id, kind } | Answer::Ignored { event_id, kind } => (
                StatusCode::OK,
                Json(json!({ "status": status, "event_id": event_id, "kind": kind })),
            )
                .into_response(),
            Answer::Duplicate {
                event_id,
                kind,
                matched,
            } => (
                StatusCode::OK,
                Json(json!({
                    "status": status,
                    "event_id": event_id,
                    "kind": kind,
                    "matched": matched.as_str(),
                })),
            )
                .into_response(),
            Answer::Handshake(body) => (StatusCode::OK, Json(body)).into_response(),
        }
    }
}

/// Why a request was refused. Nothing is written for a refused request.
///
/// The JSON body is `{"status":"rejected","error":<code>,"message":<why>}`
/// for 4xx answers and `{"status":"error",…}` for 5xx answers.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ReceiverRejection {
    /// No source is mounted under this name (404).
    #[error("no webhook source is configured at this path: check the URL set up at the provider")]
    UnknownSource,
    /// No route matches the path (404; only from
    /// [`Receiver::standalone_router`](super::Receiver::standalone_router):
    /// the plain router leaves other paths to the application).
    #[error(
        "not found: webhooks are POSTed to the source's path (by default /hooks/<source>), \
         health is at GET /healthz"
    )]
    NotFound,
    /// The path exists but not for this method (405).
    #[error("method not allowed: webhook deliveries are POSTed")]
    MethodNotAllowed,
    /// The body is over the configured limit, by its Content-Length or as it
    /// was read (413).
    #[error("body is larger than this receiver's limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit in force, in bytes.
        limit: usize,
    },
    /// The connection failed while the body was read (400).
    #[error("the request body could not be read completely")]
    UnreadableBody,
    /// The body did not arrive within the body-read timeout (408); the
    /// connection is closed.
    #[error("the request body did not arrive within {limit_ms} ms: send the whole body at once")]
    BodyTimeout {
        /// The timeout in force, in milliseconds.
        limit_ms: u64,
    },
    /// Too many deliveries are being handled, or waiting to be recorded,
    /// right now (503, with `Retry-After`): the provider retries and nothing
    /// is lost.
    #[error("the receiver is handling too many deliveries right now: retry in a moment")]
    Overloaded {
        /// What `Retry-After` says.
        retry_after: Duration,
    },
    /// The provider's verification refused the delivery: 401 for a missing
    /// or wrong signature or a timestamp out of tolerance, 400 for a body,
    /// id or kind that cannot be used.
    #[error(transparent)]
    Verification(#[from] Rejection),
    /// The event store is unreachable or refused for now (503, with
    /// `Retry-After`): the provider retries and nothing is lost.
    #[error("the event store is unavailable, so the delivery was not recorded: retry later")]
    StoreUnavailable {
        /// What `Retry-After` says.
        retry_after: Duration,
    },
    /// The same event is being recorded right now by an application's
    /// transaction that is still open (`Engine::accept_in`), so whether
    /// this delivery is new is not known yet (503, with `Retry-After`): the
    /// provider retries, and the retry is a duplicate once that transaction
    /// commits, or recorded if it rolled back. Nothing is lost, and other
    /// deliveries do not wait for it.
    #[error("this event is being recorded by a transaction that is still open: retry later")]
    AcceptInProgress {
        /// What `Retry-After` says.
        retry_after: Duration,
    },
    /// The event store failed in a way a retry will not fix soon (500).
    #[error("internal error: the delivery was not recorded; the receiver's log has the details")]
    StoreFailed,
}

impl ReceiverRejection {
    /// The HTTP status answered.
    pub fn status(&self) -> StatusCode {
        match self {
            ReceiverRejection::UnknownSource | ReceiverRejection::NotFound => StatusCode::NOT_FOUND,
            ReceiverRejection::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ReceiverRejection::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ReceiverRejection::UnreadableBody => StatusCode::BAD_REQUEST,
            ReceiverRejection::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ReceiverRejection::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ReceiverRejection::Verification(rejection) => rejection.status(),
            ReceiverRejection::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ReceiverRejection::AcceptInProgress { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ReceiverRejection::StoreFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable snake_case machine code (the `error` field).
    pub fn code(&self) -> &'static str {
        match self {
            ReceiverRejection::UnknownSource => "unknown_source",
            ReceiverRejection::NotFound => "not_found",
            ReceiverRejection::MethodNotAllowed => "method_not_allowed",
            ReceiverRejection::PayloadTooLarge { .. } => "payload_too_large",
            ReceiverRejection::UnreadableBody => "unreadable_body",
            ReceiverRejection::BodyTimeout { .. } => "body_timeout",
            ReceiverRejection::Overloaded { .. } => "overloaded",
            ReceiverRejection::Verification(rejection) => rejection.code(),
            ReceiverRejection::StoreUnavailable { .. } => "store_unavailable",
            ReceiverRejection::AcceptInProgress { .. } => "accept_in_progress",
            ReceiverRejection::StoreFailed => "internal_error",
        }
    }
}

impl IntoResponse for ReceiverRejection {
    fn into_response(self) -> Response {
        let status = self.status();
        let word = if status.is_server_error() {
            "error"
        } else {
            "rejected"
        };
        let body = Json(json!({
            "status": word,
            "error": self.code(),
            "message": self.to_string(),
        }));
        let mut response = (status, body).into_response();
        if let ReceiverRejection::StoreUnavailable { retry_after }
        | ReceiverRejection::Overloaded { retry_after }
        | ReceiverRejection::AcceptInProgress { retry_after } = self
        {
            let seconds = retry_after.as_secs().max(1);
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_their_statuses_and_codes() {
        let cases = [
            (ReceiverRejection::UnknownSource, 404, "unknown_source"),
            (ReceiverRejection::NotFound, 404, "not_found"),
            (
                ReceiverRejection::MethodNotAllowed,
                405,
                "method_not_allowed",
            ),
            (
                ReceiverRejection::PayloadTooLarge { limit: 10 },
                413,
                "payload_too_large",
            ),
            (ReceiverRejection::UnreadableBody, 400, "unreadable_body"),
            (
                ReceiverRejection::BodyTimeout { limit_ms: 10 },
                408,
                "body_timeout",
            ),
            (
                ReceiverRejection::Overloaded {
                    retry_after: Duration::from_secs(1),
                },
                503,
                "overloaded",
            ),
            (
                ReceiverRejection::Verification(Rejection::BadSignature),
                401,
                "bad_signature",
            ),
            (
                ReceiverRejection::StoreUnavailable {
                    retry_after: Duration::from_secs(5),
                },
                503,
                "store_unavailable",
            ),
            (
                ReceiverRejection::AcceptInProgress {
                    retry_after: Duration::from_secs(5),
                },
                503,
                "accept_in_progress",
            ),
            (ReceiverRejection::StoreFailed, 500, "internal_error"),
        ];
        for (rejection, status, code) in cases {
            assert_eq!(rejection.status().as_u16(), status, "{rejection}");
            assert_eq!(rejection.code(), code);
            let retry = matches!(
                rejection,
                ReceiverRejection::StoreUnavailable { .. }
                    | ReceiverRejection::Overloaded { .. }
                    | ReceiverRejection::AcceptInProgress { .. }
            );
            let response = rejection.into_response();
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(
                response.headers().get(header::RETRY_AFTER).is_some(),
                retry,
                "{code}"
            );
        }
    }

    #[test]
    fn answers_say_their_status() {
        let answer = Answer::Duplicate {
            event_id: "evt_1".into(),
            kind: "k".into(),
            matched: DedupMatch::ReplayKey,
        };
        assert_eq!(answer.status_word(), "duplicate");
        assert_eq!(answer.into_response().status(), StatusCode::OK);
    }
}
