//! The Admin API as this process reaches it ([`AdminApi`]), and what its
//! answers mean for the step that called it: every step that calls the API
//! (`push_product`, the order calls) POSTs JSON through
//! [`AdminApi::post`], with its idempotency key in an `Idempotency-Key`
//! header, so a re-run (after a crash, a timeout, a snooze) is absorbed by
//! the far side.
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | done |
//! | 429 | snoozed for its `Retry-After` (seconds or an HTTP date; 2 s when absent), no attempt spent |
//! | 408, 5xx, other non-2xx, a timeout, no connection | retried on the handler's schedule (after `Retry-After`, when given) |
//! | any other 4xx | terminal: the event is dead-lettered with the answer |
//!
//! A 429 can come although every call takes a token from the shop's bucket
//! first: the store's limit is shared with its other apps.

use std::fmt;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tickmark::StepError;
use tickmark_steps::http_client::parse_retry_after;
use tokio_util::sync::CancellationToken;

use super::AdminApiUrl;

/// How long one call may take, answer included, before it counts as a
/// (retryable) timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a 429 without a readable `Retry-After` snoozes the step.
const SNOOZE_WITHOUT_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The shortest snooze after a 429 (`Retry-After: 0` included): the API
/// asked to slow down.
const MIN_SNOOZE: Duration = Duration::from_secs(1);

/// The longest snooze honoured; a longer `Retry-After` is cut to this.
const MAX_SNOOZE: Duration = Duration::from_secs(3600);

/// How much of an answer's body is read (the rest is dropped with the
/// connection); its first 200 characters go into an error message.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The Admin API as this process reaches it: its base URL (if given) and one
/// pooled HTTP client. Registered once with
/// [`Engine::with_resource`](tickmark::Engine::with_resource): it belongs to
/// the process, not to an event, so it is in no plan.
#[derive(Clone)]
pub struct AdminApi {
    url: Option<AdminApiUrl>,
    timeout: Duration,
    client: Client<HttpConnector, Body>,
}

/// One call of a step: where, with which key, what, and what it is for (the
/// words of error messages, e.g. "pushing the product").
#[derive(Debug)]
pub(super) struct ApiCall<'a> {
    pub url: &'a str,
    pub idempotency_key: &'a str,
    pub body: &'a Value,
    pub shop: &'a str,
    pub doing: &'a str,
}

impl AdminApi {
    /// The API at `url` (`None`: this process cannot call it; its calls fail,
    /// retryably, saying so), with a [`DEFAULT_TIMEOUT`] per call.
    pub fn new(url: Option<AdminApiUrl>) -> Self {
        Self {
            url,
            timeout: DEFAULT_TIMEOUT,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Give each call at most `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The base URL, if this process has one.
    pub fn url(&self) -> Option<&AdminApiUrl> {
        self.url.as_ref()
    }

    /// The base URL, or the retryable failure of a process started without
    /// one (any process that has one can run the step).
    pub(super) fn base(&self) -> Result<&AdminApiUrl, StepError> {
        self.url.as_ref().ok_or_else(|| {
            StepError::retryable(
                "this shopsync process has no --admin-api-url: restart it with \
                 --admin-api-url URL (the event is retried on its schedule, and any \
                 process that has one can run it)",
            )
        })
    }

    /// POST `call.body` as JSON to `call.url` with the `Idempotency-Key`
    /// header; the answer's status when it is a 2xx, else the step's failure
    /// (see the module's table). Gives up, retryably, when `cancelled` fires.
    pub(super) async fn post(
        &self,
        call: &ApiCall<'_>,
        cancelled: &CancellationToken,
    ) -> Result<StatusCode, StepError> {
        let url = call.url;
        let request = Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", call.idempotency_key)
            .body(Body::from(call.body.to_string()))
            .map_err(|error| {
                StepError::terminal(format!("cannot build a request to {url}: {error}"))
            })?;

        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            // Read (a bounded part of) the answer so the connection can be reused.
            let body = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_else(|_| Bytes::new());
            Ok::<_, hyper_util::client::legacy::Error>((parts.status, parts.headers, body))
        };
        let (status, headers, body) = tokio::select! {
            answered = tokio::time::timeout(self.timeout, exchange) => match answered {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    return Err(StepError::retryable(format!(
                        "the Admin API is unreachable at {url}: {error}; check --admin-api-url"
                    )))
                }
                Err(_) => {
                    return Err(StepError::retryable(format!(
                        "the Admin API at {url} did not answer within {:?}",
                        self.timeout
                    )))
                }
            },
            _ = cancelled.cancelled() => {
                return Err(StepError::retryable(format!("cancelled while {}", call.doing)));
            }
        };
        let excerpt: String = String::from_utf8_lossy(&body).chars().take(200).collect();
        classify(status, &headers, &excerpt, call.shop)?;
        Ok(status)
    }
}

impl fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminApi")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The step's outcome for an answer: see the module's table.
fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    excerpt: &str,
    shop: &str,
) -> Result<(), StepError> {
    if status.is_success() {
        return Ok(());
    }
    let retry_after = headers
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| retry_after(value, SystemTime::now()));
    if status == StatusCode::TOO_MANY_REQUESTS {
        let delay = retry_after
            .unwrap_or(SNOOZE_WITHOUT_RETRY_AFTER)
            .clamp(MIN_SNOOZE, MAX_SNOOZE);
        return Err(StepError::snooze(
            delay,
            format!(
                "the Admin API answered 429 for {shop}: its limit is used up (shared with the \
                 shop's other apps); trying again in {delay:?}, without spending an attempt"
            ),
        ));
    }
    let message = format!("the Admin API answered {status}: {excerpt}");
    if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT {
        return Err(StepError::terminal(format!(
            "{message} (a refusal no retry will change: fix the event's data or the API, then \
             `tickmark events retry`)"
        )));
    }
    Err(match retry_after {
        Some(delay) => StepError::retryable_after(delay.min(MAX_SNOOZE), message),
        None => StepError::retryable(message),
    })
}

/// A `Retry-After` value: seconds, with a fraction too (Shopify sends
/// `2.0`), or an HTTP date.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let seconds = value.trim().parse::<f64>().ok();
    match seconds {
        Some(seconds) if seconds.is_finite() && seconds >= 0.0 => Some(Duration::from_secs_f64(
            seconds.min(MAX_SNOOZE.as_secs_f64()),
        )),
        Some(_) => None,
        None => parse_retry_after(value, now),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use tickmark::FailureKind;

    use super::*;

    fn outcome(status: u16, retry_after: Option<&str>) -> Result<(), StepError> {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        }
        classify(
            StatusCode::from_u16(status).unwrap(),
            &headers,
            "",
            "a.myshopify.com",
        )
    }

    #[test]
    fn answers_are_classified() {
        assert!(outcome(200, None).is_ok());
        assert!(outcome(201, None).is_ok());
        for retried in [500, 502, 503, 408, 301, 304] {
            let error = outcome(retried, None).unwrap_err();
            assert_eq!(error.kind(), FailureKind::Retryable, "{retried}");
        }
        for refused in [400, 401, 403, 404, 409, 422] {
            assert!(
                outcome(refused, None).unwrap_err().is_terminal(),
                "{refused}"
            );
        }
        let after = outcome(503, Some("7")).unwrap_err();
        assert_eq!(after.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_429_snoozes_for_its_retry_after() {
        let snooze = |value| match outcome(429, value).unwrap_err().kind() {
            FailureKind::Snooze { delay } => delay,
            other => panic!("not a snooze: {other:?}"),
        };
        assert_eq!(snooze(Some("1")), Duration::from_secs(1));
        assert_eq!(snooze(Some("2.0")), Duration::from_secs(2));
        assert_eq!(snooze(Some("0")), MIN_SNOOZE);
        assert_eq!(snooze(Some("999999")), MAX_SNOOZE);
        assert_eq!(snooze(Some("soon")), SNOOZE_WITHOUT_RETRY_AFTER);
        assert_eq!(snooze(None), SNOOZE_WITHOUT_RETRY_AFTER);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 07:28:00 GMT
        assert_eq!(retry_after(" 1.5 ", now), Some(Duration::from_millis(1500)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        for bad in ["-1", "NaN", "inf", "later"] {
            assert_eq!(retry_after(bad, now), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn without_a_url_a_call_is_retryable() {
        let api = AdminApi::new(None);
        let error = api.base().unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
        assert!(error.to_string().contains("--admin-api-url"), "{error}");
    }
}
