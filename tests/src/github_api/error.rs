//! The REST API's error answers, as GitHub writes them: a JSON body with
//! `message`, `documentation_url` and `status`.
//! <https://docs.github.com/en/rest/using-the-rest-api/troubleshooting-the-rest-api>

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// Where GitHub's generic error answers point.
const DOCS: &str = "https://docs.github.com/rest";
/// Where the rate-limit answers point.
const RATE_LIMIT_DOCS: &str =
    "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api";

/// An error answer of the fake REST API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// No token, or not the fake's: 401 `Bad credentials`.
    #[error("bad credentials")]
    BadCredentials,
    /// No such hook or delivery (or one past retention): 404 `Not Found`.
    #[error("not found")]
    NotFound,
    /// A query parameter that does not parse: 422 `Validation Failed`
    /// (the list endpoints document 422 "Validation failed").
    #[error("validation failed: {0}")]
    Validation(String),
    /// An `X-GitHub-Api-Version` the API does not support: 400
    /// (<https://docs.github.com/en/rest/about-the-rest-api/api-versions>).
    #[error("unsupported API version {0}")]
    UnsupportedVersion(String),
    /// A secondary rate limit: 429 (or 403) with `Retry-After`
    /// (<https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api#exceeding-the-rate-limit>).
    #[error("secondary rate limit")]
    SecondaryRateLimit {
        /// 429 or 403.
        status: u16,
        /// The `Retry-After` seconds.
        retry_after: Duration,
    },
    /// The primary rate limit: 403 with `x-ratelimit-remaining: 0` and
    /// `x-ratelimit-reset` (UTC epoch seconds).
    #[error("primary rate limit")]
    PrimaryRateLimit {
        /// When the limit resets, unix seconds.
        reset: i64,
    },
    /// An injected server error.
    #[error("server error {0}")]
    Server(u16),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message, docs) = match &self {
            Self::BadCredentials => (401, "Bad credentials".to_owned(), DOCS),
            Self::NotFound => (404, "Not Found".to_owned(), DOCS),
            Self::Validation(_) => (422, "Validation Failed".to_owned(), DOCS),
            Self::UnsupportedVersion(version) => (
                400,
                format!("Unsupported 'X-GitHub-Api-Version' header: {version}"),
                "https://docs.github.com/rest/about-the-rest-api/api-versions",
            ),
            Self::SecondaryRateLimit { status, .. } => (
                *status,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.".to_owned(),
                RATE_LIMIT_DOCS,
            ),
            Self::PrimaryRateLimit { .. } => (
                403,
                "API rate limit exceeded for user ID 1.".to_owned(),
                RATE_LIMIT_DOCS,
            ),
            Self::Server(status) => (*status, "Server Error".to_owned(), DOCS),
        };
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({
            "message": message,
            "documentation_url": docs,
            "status": code.as_u16().to_string(),
        });
        if let Self::Validation(reason) = &self {
            body["errors"] = json!([{ "message": reason, "code": "invalid" }]);
        }
        let mut response = (code, Json(body)).into_response();
        let headers = response.headers_mut();
        match self {
            Self::SecondaryRateLimit { retry_after, .. } => {
                headers.insert("retry-after", HeaderValue::from(retry_after.as_secs()));
            }
            Self::PrimaryRateLimit { reset } => {
                headers.insert("x-ratelimit-limit", HeaderValue::from(5000));
                headers.insert("x-ratelimit-remaining", HeaderValue::from(0));
                headers.insert("x-ratelimit-used", HeaderValue::from(5000));
                headers.insert("x-ratelimit-reset", HeaderValue::from(reset));
            }
            _ => {}
        }
        response
    }
}
