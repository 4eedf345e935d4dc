//! The HTTP client every reconciler uses to call a provider's API: HTTPS
//! (rustls with ring), a time limit on each request, a cap on what an answer
//! may hold, a pace between requests, and retries of what the providers
//! document as worth retrying (429 after its `Retry-After`, 5xx, a refused
//! or dropped connection), each a little later than the last.
//!
//! Our own rather than a general client crate (reqwest): hyper and rustls
//! are already in tickmark's tree for the receiver and the steps, and the
//! retry rules are the providers', not a library's.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::error::ReconcileError;

/// How the client paces and retries; [`Default`] is what the reconcilers use.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// The longest one request may take, connecting and reading included.
    pub timeout: Duration,
    /// The least time between two requests of this client (the providers'
    /// rate limits: Stripe allows 25 reads a second in a sandbox).
    pub pace: Duration,
    /// How many times one request is sent before the run gives up.
    pub attempts: u32,
    /// The first wait before a retry; each next one doubles, with jitter.
    pub first_backoff: Duration,
    /// The longest wait a run accepts (a `Retry-After` or a rate-limit reset):
    /// a longer one ends the run, and the next resumes from the cursor.
    pub max_wait: Duration,
    /// The most an answer may hold.
    pub max_body_bytes: usize,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            pace: Duration::from_millis(50),
            attempts: 6,
            first_backoff: Duration::from_millis(500),
            max_wait: Duration::from_secs(120),
            max_body_bytes: 32 * 1024 * 1024,
        }
    }
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A pooled HTTP/1.1 client for the providers' APIs.
#[derive(Debug)]
pub(crate) struct ApiClient {
    client: Client<Connector, Full<Bytes>>,
    settings: ClientSettings,
    /// When the next request may start.
    next_start: Mutex<Instant>,
}

/// One request to a provider's API. Its `Debug` shows no credential: the
/// values of headers other than a few known harmless ones are masked, the
/// URL loses its user info, and the body shows only its length.
#[derive(Clone)]
pub(crate) struct ApiRequest {
    pub method: Method,
    pub url: Url,
    pub headers: Vec<(HeaderName, String)>,
    pub json_body: Option<Vec<u8>>,
}

/// Headers whose values never hold a credential, shown as they are in
/// `Debug`; every other value (`Authorization`, `X-Shopify-Access-Token`,
/// whatever a provider adds next) is masked.
const SHOWN_HEADERS: &[&str] = &["accept", "content-type", "x-github-api-version"];

impl std::fmt::Debug for ApiRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let value = if SHOWN_HEADERS.contains(&name.as_str()) {
                    value.as_str()
                } else {
                    "***"
                };
                (name.as_str(), value)
            })
            .collect();
        f.debug_struct("ApiRequest")
            .field("method", &self.method)
            .field("url", &shown.as_str())
            .field("headers", &headers)
            .field("json_body_bytes", &self.json_body.as_ref().map(Vec::len))
            .finish()
    }
}

/// A provider's answer: any status but the retried ones.
#[derive(Debug)]
pub(crate) struct ApiResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Why one attempt did not produce an answer to return.
pub(crate) enum AttemptFailure {
    /// Worth another attempt after `wait` (`None`: the backoff decides).
    Retry {
        reason: String,
        wait: Option<Duration>,
    },
    /// Not worth another attempt.
    Stop(ReconcileError),
}

impl ApiRequest {
    /// A `GET` of `url` accepting JSON.
    pub fn get(url: Url) -> Self {
        Self {
            method: Method::GET,
            url,
            headers: Vec::new(),
            json_body: None,
        }
    }

    /// A `POST` of `url` with a JSON body (`None`: an empty one).
    pub fn post(url: Url, json_body: Option<Vec<u8>>) -> Self {
        Self {
            method: Method::POST,
            url,
            headers: Vec::new(),
            json_body,
        }
    }

    /// The same request with one more header.
    pub fn header(mut self, name: HeaderName, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// `GET https://api.stripe.com/v1/events`: what messages name (no query,
    /// which may carry cursors but never secrets; no user info).
    pub fn what(&self) -> String {
        let mut shown = self.url.clone();
        shown.set_query(None);
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        format!("{} {shown}", self.method)
    }
}

impl ApiClient {
    /// A client with `settings`.
    pub fn new(settings: ClientSettings) -> Result<Self, ReconcileError> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(settings.timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|error| ReconcileError::Config(format!("TLS: {error}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            settings,
            next_start: Mutex::new(Instant::now()),
        })
    }

    /// The settings this client was made with.
    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }

    /// Send `request` once, at this client's pace: the answer, or whether
    /// and when it is worth sending again. [`RetryLoop`] decides how often.
    pub async fn send_once(
        &self,
        request: &ApiRequest,
        cancel: &CancellationToken,
    ) -> Result<ApiResponse, AttemptFailure> {
        self.wait_turn(cancel).await.map_err(AttemptFailure::Stop)?;
        self.attempt(request, &request.what()).await
    }

    /// Wait until this client may start its next request.
    async fn wait_turn(&self, cancel: &CancellationToken) -> Result<(), ReconcileError> {
        let start = {
            let mut next = self.next_start.lock().await;
            let start = (*next).max(Instant::now());
            *next = start + self.settings.pace;
            start
        };
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(ReconcileError::Cancelled),
            () = tokio::time::sleep_until(start) => Ok(()),
        }
    }

    /// Send once, within the time limit, and sort the answer.
    async fn attempt(
        &self,
        request: &ApiRequest,
        what: &str,
    ) -> Result<ApiResponse, AttemptFailure> {
        let built = build(request).map_err(AttemptFailure::Stop)?;
        let exchange = async {
            let response =
                self.client
                    .request(built)
                    .await
                    .map_err(|error| AttemptFailure::Retry {
                        reason: chain(&error),
                        wait: None,
                    })?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, self.settings.max_body_bytes)
                .collect()
                .await
                .map_err(|error| AttemptFailure::Retry {
                    reason: format!("reading the answer: {error}"),
                    wait: None,
                })?
                .to_bytes()
                .to_vec();
            Ok(ApiResponse {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        let response = tokio::time::timeout(self.settings.timeout, exchange)
            .await
            .map_err(|_| AttemptFailure::Retry {
                reason: format!("no complete answer within {:?}", self.settings.timeout),
                wait: None,
            })??;
        classify(response, what)
    }
}

/// The hyper request for `request`.
fn build(request: &ApiRequest) -> Result<Request<Full<Bytes>>, ReconcileError> {
    let mut builder = Request::builder()
        .method(request.method.clone())
        .uri(request.url.as_str())
        .header(
            USER_AGENT,
            concat!("tickmark-reconcile/", env!("CARGO_PKG_VERSION")),
        );
    if !request.headers.iter().any(|(name, _)| *name == ACCEPT) {
        builder = builder.header(ACCEPT, "application/json");
    }
    for (name, value) in &request.headers {
        let value = HeaderValue::from_str(value).map_err(|_| {
            ReconcileError::Config(format!(
                "the {name} header of {} holds a character HTTP does not allow",
                request.what()
            ))
        })?;
        builder = builder.header(name, value);
    }
    let body = match &request.json_body {
        Some(body) => {
            builder = builder.header(CONTENT_TYPE, "application/json");
            Full::new(Bytes::from(body.clone()))
        }
        None => Full::new(Bytes::new()),
    };
    builder
        .body(body)
        .map_err(|error| ReconcileError::Config(format!("{}: {error}", request.what())))
}

/// Return the answer, or say whether and when to send again: 429, 5xx and
/// GitHub's rate-limit 403 (no requests left until `x-ratelimit-reset`, or a
/// secondary limit with `Retry-After`) are retried.
fn classify(response: ApiResponse, what: &str) -> Result<ApiResponse, AttemptFailure> {
    let status = response.status;
    let retry_after = retry_after(&response.headers);
    let rate_limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN
            && (retry_after.is_some() || github_limit_used_up(&response.headers)));
    if rate_limited {
        let wait = retry_after.or_else(|| github_reset_in(&response.headers));
        return Err(AttemptFailure::Retry {
            reason: format!("{what}: rate limited ({status})"),
            wait,
        });
    }
    if status.is_server_error() {
        return Err(AttemptFailure::Retry {
            reason: format!("answered {status}"),
            wait: retry_after,
        });
    }
    Ok(response)
}

/// The longest wait a provider's answer is taken at its word for: a day.
/// A longer `Retry-After` or rate-limit reset is capped here (and logged);
/// a run then stops, as for any wait over [`ClientSettings::max_wait`].
pub(crate) const MAX_ASKED_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// `Retry-After` in seconds (the form Stripe, GitHub and Shopify send),
/// capped at [`MAX_ASKED_WAIT`]; anything else (a date, a negative or
/// non-finite number, text) is no `Retry-After`. Never panics.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let seconds: f64 = value.parse().ok()?;
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    Some(capped_wait(
        Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX),
        value,
    ))
}

/// `asked`, or [`MAX_ASKED_WAIT`] when it is longer (logged: `said` is what
/// the provider sent).
fn capped_wait(asked: Duration, said: &str) -> Duration {
    if asked <= MAX_ASKED_WAIT {
        return asked;
    }
    let said: String = said.chars().take(40).collect();
    tracing::warn!(asked = %said, capped = ?MAX_ASKED_WAIT, "provider API: asked to wait implausibly long; capped");
    MAX_ASKED_WAIT
}

/// GitHub's primary rate limit is used up: `x-ratelimit-remaining: 0`.
/// <https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api>
fn github_limit_used_up(headers: &HeaderMap) -> bool {
    headers
        .get("x-ratelimit-remaining")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim() == "0")
}

/// How long until GitHub's `x-ratelimit-reset` (UTC epoch seconds).
fn github_reset_in(headers: &HeaderMap) -> Option<Duration> {
    let reset: i64 = headers
        .get("x-ratelimit-reset")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let now = chrono::Utc::now().timestamp();
    let seconds = u64::try_from(reset.saturating_sub(now))
        .unwrap_or(0)
        .saturating_add(1);
    Some(capped_wait(
        Duration::from_secs(seconds),
        &format!("x-ratelimit-reset {reset}"),
    ))
}

/// An error with its sources, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

impl ApiResponse {
    /// The body as JSON of type `T`, or what did not decode.
    pub fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, ReconcileError> {
        let mut decoder = serde_json::Deserializer::from_slice(&self.body);
        serde_path_to_error::deserialize(&mut decoder).map_err(|error| ReconcileError::Malformed {
            what: what.to_owned(),
            reason: error.to_string(),
        })
    }

    /// A refusal (a 4xx) with the provider's message: Stripe's
    /// `error.message`, GitHub's and Shopify's `message` / `errors`.
    pub fn refused(&self, what: &str, hint: &'static str) -> ReconcileError {
        let parsed: Option<serde_json::Value> = serde_json::from_slice(&self.body).ok();
        let message = parsed
            .as_ref()
            .and_then(|value| {
                value
                    .pointer("/error/message")
                    .or_else(|| value.get("message"))
                    .or_else(|| value.get("errors"))
            })
            .map(|message| match message {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&self.body)
                    .chars()
                    .take(200)
                    .collect()
            });
        ReconcileError::Refused {
            what: what.to_owned(),
            status: self.status.as_u16(),
            message,
            hint,
        }
    }
}

/// The retries of one request: how many are left, and how long to wait
/// before the next.
#[derive(Debug)]
pub(crate) struct RetryLoop {
    attempts: u32,
    backoff: Duration,
    settings: ClientSettings,
    what: String,
}

impl RetryLoop {
    /// The retries of `request` under `settings`.
    pub fn new(settings: &ClientSettings, request: &ApiRequest) -> Self {
        Self {
            attempts: 0,
            backoff: settings.first_backoff,
            settings: settings.clone(),
            what: request.what(),
        }
    }

    /// After an attempt failed with `reason`: how long to wait before the
    /// next, or the error that ends the run (attempts used up, or a pause
    /// asked for that is longer than a run waits).
    pub fn after_failure(
        &mut self,
        reason: String,
        asked: Option<Duration>,
    ) -> Result<Duration, ReconcileError> {
        self.attempts += 1;
        if self.attempts >= self.settings.attempts {
            return Err(ReconcileError::Unreachable {
                what: self.what.clone(),
                reason,
                attempts: self.attempts,
            });
        }
        let wait = match asked {
            Some(wait) if wait > self.settings.max_wait => {
                return Err(ReconcileError::RateLimited {
                    what: self.what.clone(),
                    wait,
                });
            }
            Some(wait) => wait,
            None => {
                let spread = self
                    .backoff
                    .mul_f64(0.5 + tickmark_driver::jitter::unit() / 2.0);
                self.backoff = self.backoff.saturating_mul(2).min(self.settings.max_wait);
                spread
            }
        };
        tracing::warn!(what = %self.what, attempt = self.attempts, ?wait, %reason, "provider API: retrying");
        Ok(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&'static str, &str)]) -> ApiResponse {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        ApiResponse {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map,
            body: Vec::new(),
        }
    }

    fn wait_of(result: Result<ApiResponse, AttemptFailure>) -> Option<Option<Duration>> {
        match result {
            Err(AttemptFailure::Retry { wait, .. }) => Some(wait),
            _ => None,
        }
    }

    #[test]
    fn a_429_waits_its_retry_after_and_a_5xx_backs_off() {
        let limited = classify(answer(429, &[("retry-after", "3")]), "GET x");
        assert_eq!(wait_of(limited), Some(Some(Duration::from_secs(3))));
        assert_eq!(wait_of(classify(answer(503, &[]), "GET x")), Some(None));
        assert!(classify(answer(404, &[]), "GET x").is_ok());
        assert!(classify(answer(200, &[]), "GET x").is_ok());
    }

    /// `Retry-After: 1e20` panicked `Duration::from_secs_f64` (and ended the
    /// scheduled reconciler): every value parses safely, a huge one capped.
    #[test]
    fn any_retry_after_parses_without_panicking_and_huge_ones_are_capped() {
        for (said, expected) in [
            ("1e20", Some(MAX_ASKED_WAIT)),
            ("1e400", None),
            ("18446744073709551616", Some(MAX_ASKED_WAIT)),
            ("inf", None),
            ("NaN", None),
            ("-1", None),
            ("Wed, 21 Oct 2015 07:28:00 GMT", None),
            ("2.5", Some(Duration::from_millis(2500))),
            ("86401", Some(MAX_ASKED_WAIT)),
        ] {
            let limited = classify(answer(429, &[("retry-after", said)]), "GET x");
            assert_eq!(wait_of(limited), Some(expected), "Retry-After: {said}");
        }
        let far = answer(
            403,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &i64::MAX.to_string()),
            ],
        );
        assert_eq!(wait_of(classify(far, "GET x")), Some(Some(MAX_ASKED_WAIT)));
        let past = answer(
            403,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &i64::MIN.to_string()),
            ],
        );
        assert_eq!(
            wait_of(classify(past, "GET x")),
            Some(Some(Duration::from_secs(1)))
        );
    }

    #[test]
    fn github_rate_limit_403s_are_retried_and_other_403s_are_not() {
        let used_up = answer(403, &[("x-ratelimit-remaining", "0")]);
        assert!(wait_of(classify(used_up, "GET x")).is_some());
        let secondary = answer(403, &[("retry-after", "60")]);
        assert_eq!(
            wait_of(classify(secondary, "GET x")),
            Some(Some(Duration::from_secs(60)))
        );
        assert!(classify(answer(403, &[("x-ratelimit-remaining", "12")]), "GET x").is_ok());
    }

    #[test]
    fn debug_of_a_request_shows_no_credential() {
        let url = Url::parse("https://key:secret@api.stripe.com/v1/events?limit=3").unwrap();
        let request = ApiRequest::post(url, Some(b"{}".to_vec()))
            .header(http::header::AUTHORIZATION, "Bearer sk_live_topsecret")
            .header(
                HeaderName::from_static("x-shopify-access-token"),
                "shpat_topsecret",
            )
            .header(ACCEPT, "application/vnd.github+json");
        let shown = format!("{request:?} {request:#?}");
        for secret in ["sk_live_topsecret", "shpat_topsecret", "secret@"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("authorization"), "{shown}");
        assert!(shown.contains("application/vnd.github+json"), "{shown}");
        assert!(shown.contains("api.stripe.com/v1/events"), "{shown}");
    }

    #[test]
    fn requests_are_named_without_their_query_or_password() {
        let url = Url::parse("https://key:secret@api.stripe.com/v1/events?limit=3").unwrap();
        assert_eq!(
            ApiRequest::get(url).what(),
            "GET https://api.stripe.com/v1/events"
        );
    }
}
