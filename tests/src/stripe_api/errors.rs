//! Stripe's error responses: an HTTP status and a JSON body
//! `{"error": {"type", "message", "code"?, "param"?}}`.
//!
//! Types and codes as Stripe documents them: `invalid_request_error` for a
//! bad request (400), a missing object (404, code `resource_missing`) or a
//! missing or wrong API key (401); `api_error` for a fault on Stripe's side
//! (5xx); code `rate_limit` for too many requests (429).
//! <https://docs.stripe.com/api/errors>, <https://docs.stripe.com/error-codes>,
//! <https://docs.stripe.com/rate-limits>

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// One error answer of the fake API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// 400 `invalid_request_error`: a parameter is unknown, repeated,
    /// malformed or out of range, or two parameters exclude each other.
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// Stripe-like explanation.
        message: String,
        /// The parameter at fault, when there is one.
        param: Option<String>,
    },
    /// 401 `invalid_request_error`: no API key, or not the fake's.
    #[error("unauthorized: {message}")]
    Unauthorized {
        /// Stripe-like explanation.
        message: String,
    },
    /// 404 `invalid_request_error` with code `resource_missing`: no event
    /// with that id ("No such event: 'evt_…'").
    #[error("no such event: {id}")]
    NoSuchEvent {
        /// The id asked for.
        id: String,
        /// The parameter that named it (`starting_after`, `ending_before`, `id`).
        param: String,
    },
    /// 404 `invalid_request_error`: no such route ("Unrecognized request URL").
    #[error("unrecognized request URL ({method}: {path})")]
    UnrecognizedUrl {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// 429 `invalid_request_error` with code `rate_limit`, and a
    /// `Retry-After` header of this many seconds.
    #[error("rate limited (retry after {retry_after_secs} s)")]
    RateLimited {
        /// The `Retry-After` value, in whole seconds.
        retry_after_secs: u64,
    },
    /// A 429 whose `Retry-After` says this text, as a broken or hostile
    /// server might (`1e20`).
    #[error("rate limited (Retry-After: {text})")]
    RateLimitedSaying {
        /// The `Retry-After` value, sent as it is.
        text: String,
    },
    /// A 5xx `api_error` with this status.
    #[error("api error (status {status})")]
    Server {
        /// The status (500, 502, 503, …).
        status: u16,
    },
}

impl ApiError {
    /// A 400 for `param` with `message`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param.to_owned()),
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::NoSuchEvent { .. } | Self::UnrecognizedUrl { .. } => StatusCode::NOT_FOUND,
            Self::RateLimited { .. } | Self::RateLimitedSaying { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Server { status } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// The JSON body, as Stripe shapes it.
    pub fn body(&self) -> serde_json::Value {
        let (kind, message, code, param) = match self {
            Self::InvalidRequest { message, param } => {
                ("invalid_request_error", message.clone(), None, param.clone())
            }
            Self::Unauthorized { message } => ("invalid_request_error", message.clone(), None, None),
            Self::NoSuchEvent { id, param } => (
                "invalid_request_error",
                format!("No such event: '{id}'"),
                Some("resource_missing"),
                Some(param.clone()),
            ),
            Self::UnrecognizedUrl { method, path } => (
                "invalid_request_error",
                format!(
                    "Unrecognized request URL ({method}: {path}). Please see https://stripe.com/docs or we can help at https://support.stripe.com/."
                ),
                None,
                None,
            ),
            Self::RateLimited { .. } | Self::RateLimitedSaying { .. } => (
                "invalid_request_error",
                "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.".to_owned(),
                Some("rate_limit"),
                None,
            ),
            Self::Server { .. } => (
                "api_error",
                "An unknown error occurred on Stripe's side (a fault the fake was told to inject).".to_owned(),
                None,
                None,
            ),
        };
        let mut error = json!({ "type": kind, "message": message });
        if let Some(code) = code {
            error["code"] = json!(code);
        }
        if let Some(param) = param {
            error["param"] = json!(param);
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if let Self::RateLimited { retry_after_secs } = self {
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from(retry_after_secs));
        }
        if let Self::RateLimitedSaying { text } = self {
            if let Ok(value) = HeaderValue::from_str(&text) {
                response.headers_mut().insert("retry-after", value);
            }
        }
        response
    }
}
