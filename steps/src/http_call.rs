//! `HttpCall`: one HTTP request that sends the step's idempotency key, so a
//! re-run after a crash is absorbed by the far side.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::Full;
use serde::{Deserialize, Serialize};
use tickmark::{Step, StepContext, StepError, StepResult};

use crate::error::ConfigError;
use crate::http_client::{self, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT};
use crate::value_from::ValueFrom;

/// The header that carries the idempotency key unless a step names another.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Response headers kept in the output unless a step lists its own.
pub const DEFAULT_RESPONSE_HEADERS: [&str; 2] = ["content-type", "location"];

/// An HTTP request, sent with the step's idempotency key
/// (`Idempotency-Key: {source}:{event id}:{step}`), identical on every attempt.
///
/// - **Body** (optional): a [`ValueFrom`] — a fixed JSON value, the event
///   payload, or a JSON pointer into an earlier step's output — sent as JSON
///   (`Content-Type: application/json` unless a header says otherwise).
/// - **Headers**: fixed ones in the plan; secret ones (an `Authorization`)
///   from the [`HttpCredentials`] resource, by name, never stored.
/// - **Client**: the [`HttpClient`](crate::HttpClient) resource, or a
///   process-wide default.
/// - **Outcome**: 2xx is done and the output is
///   `{"status", "headers", "body", "truncated"}` (the body as JSON when the
///   answer is JSON, else as text, cut at `max_response_bytes`, default
///   64 KiB). 5xx, 408, 429, a timeout (`timeout_ms`, default 30 s), a
///   connection error or the step's cancellation are retryable; 429 and 503
///   wait at least their `Retry-After`. Any other status is terminal, as are a
///   bad URL, method or header: retrying would not change them.
///
/// ```
/// use std::time::Duration;
/// use tickmark::Handler;
/// use tickmark_steps::{HttpCall, ValueFrom};
///
/// let handler = Handler::new()
///     .named_step(
///         "charge",
///         HttpCall::post("http://payments.internal/charges")
///             .body(ValueFrom::event_at("/data/object"))
///             .credentials("payments")
///             .timeout(Duration::from_secs(10)),
///     )
///     .named_step(
///         "notify",
///         HttpCall::post("http://crm.internal/notes")
///             .body(ValueFrom::output("charge", "/body/receipt"))
///             .header("X-Source", "tickmark"),
///     );
/// assert_eq!(handler.step_names(), ["charge", "notify"]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HttpCall {
    /// The method (`GET`, `POST`, …).
    #[serde(default = "default_method")]
    pub method: String,
    /// An absolute `http://` URL (`https://` with the `rustls` feature).
    pub url: String,
    /// Fixed headers. They are stored in the plan: put secrets in
    /// [`HttpCredentials`] instead.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The body, sent as JSON; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<ValueFrom>,
    /// The name of a header set in the [`HttpCredentials`] resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// The header that carries the idempotency key.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// Give up on one request after this many milliseconds (default 30 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Response headers to keep in the output.
    #[serde(default = "default_response_headers")]
    pub response_headers: Vec<String>,
    /// Keep at most this many bytes of the response body (default 65 536).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<usize>,
    /// Further statuses to retry instead of failing terminally, e.g. `409`
    /// from a service that answers so while a request with the same key is
    /// still in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_statuses: Vec<u16>,
}

fn default_method() -> String {
    "POST".to_owned()
}

fn default_idempotency_header() -> String {
    IDEMPOTENCY_HEADER.to_owned()
}

fn default_response_headers() -> Vec<String> {
    DEFAULT_RESPONSE_HEADERS.map(str::to_owned).to_vec()
}

impl HttpCall {
    /// A `method` request to `url`, with no body.
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            method: method.into(),
            url: url.into(),
            headers: BTreeMap::new(),
            body: None,
            credentials: None,
            idempotency_header: default_idempotency_header(),
            timeout_ms: None,
            response_headers: default_response_headers(),
            max_response_bytes: None,
            retry_statuses: Vec::new(),
        }
    }

    /// A `GET` of `url`.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new("GET", url)
    }

    /// A `POST` to `url`.
    pub fn post(url: impl Into<String>) -> Self {
        Self::new("POST", url)
    }

    /// A `PUT` to `url`.
    pub fn put(url: impl Into<String>) -> Self {
        Self::new("PUT", url)
    }

    /// Send this body, as JSON.
    #[must_use]
    pub fn body(mut self, body: ValueFrom) -> Self {
        self.body = Some(body);
        self
    }

    /// Send this fixed JSON value as the body.
    #[must_use]
    pub fn json(self, value: serde_json::Value) -> Self {
        self.body(ValueFrom::fixed(value))
    }

    /// Add a fixed header (stored in the plan: no secrets).
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Add the headers of the [`HttpCredentials`] set `name` at run time.
    #[must_use]
    pub fn credentials(mut self, name: impl Into<String>) -> Self {
        self.credentials = Some(name.into());
        self
    }

    /// Send the idempotency key in header `name` instead of `Idempotency-Key`.
    #[must_use]
    pub fn idempotency_header(mut self, name: impl Into<String>) -> Self {
        self.idempotency_header = name.into();
        self
    }

    /// Give up on one request after `timeout` (a retryable failure).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Keep response header `name` in the output too.
    #[must_use]
    pub fn keep_response_header(mut self, name: impl Into<String>) -> Self {
        self.response_headers.push(name.into());
        self
    }

    /// Keep at most `bytes` of the response body in the output.
    #[must_use]
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = Some(bytes);
        self
    }

    /// Retry on `status` too, instead of failing terminally.
    #[must_use]
    pub fn retry_on(mut self, status: u16) -> Self {
        self.retry_statuses.push(status);
        self
    }

    /// The request this step sends for the event of `ctx`. Every problem is
    /// terminal except a missing credentials resource (retryable: a deploy
    /// that registers it fixes it).
    pub(crate) fn request(&self, ctx: &StepContext<'_>) -> Result<Request<Full<Bytes>>, StepError> {
        // Methods are case-sensitive on the wire; `post` in a config means POST.
        let method = Method::from_bytes(self.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| StepError::terminal(format!("`{}` is not an HTTP method", self.method)))?;
        let uri: Uri = self.url.parse().map_err(|error| {
            StepError::terminal(format!(
                "`{}` is not a URL: {error}",
                tickmark::redact_url(&self.url)
            ))
        })?;
        http_client::check_scheme(&uri)?;

        let mut headers = HeaderMap::new();
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(http_client::USER_AGENT),
        );
        for (name, value) in &self.headers {
            let (name, value) = header(name, value)?;
            headers.insert(name, value);
        }
        if let Some(set) = &self.credentials {
            let credentials = ctx.resource::<HttpCredentials>()?;
            let secret = credentials.sets.get(set).ok_or_else(|| {
                StepError::retryable(format!(
                    "credentials `{set}` are not in this process's HttpCredentials"
                ))
            })?;
            for (name, value) in secret {
                headers.insert(name.clone(), value.clone());
            }
        }
        let (name, value) = header(&self.idempotency_header, ctx.idempotency_key())?;
        headers.insert(name, value);
        crate::trace_context::send_trace_context(&mut headers);

        let body = match &self.body {
            Some(from) => {
                let value = from.resolve(ctx)?;
                if !headers.contains_key(CONTENT_TYPE) {
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
                Full::new(Bytes::from(serde_json::to_vec(value.as_ref()).map_err(
                    |error| StepError::terminal(format!("body cannot be encoded: {error}")),
                )?))
            }
            None => Full::default(),
        };
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        Ok(request)
    }
}

/// A header from configuration text, or a terminal error naming it.
fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), StepError> {
    let parsed_name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| StepError::terminal(format!("`{name}` is not a valid header name")))?;
    let parsed_value = HeaderValue::from_str(value).map_err(|_| {
        StepError::terminal(format!(
            "the value of header `{name}` is not valid in HTTP (control characters?)"
        ))
    })?;
    Ok((parsed_name, parsed_value))
}

#[typetag::serde(name = "tickmark.http_call")]
#[async_trait::async_trait]
impl Step for HttpCall {
    fn reads(&self) -> Vec<&str> {
        self.body.iter().filter_map(ValueFrom::reads_step).collect()
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let request = self.request(ctx)?;
        let timeout = self
            .timeout_ms
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let max_body = self
            .max_response_bytes
            .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
        let exchange = http_client::client_for(ctx)
            .exchange(request, timeout, max_body, ctx.cancellation())
            .await?;
        exchange.check(&self.retry_statuses)?;
        Ok(exchange.output(&self.response_headers))
    }
}

/// Secret headers for [`HttpCall`]s, by name: registered with the engine
/// (`Engine::with_resource`), never stored in a plan. A step that names a set
/// gets its headers added (replacing fixed headers of the same name). Its
/// `Debug` shows names, never values.
///
/// ```
/// use tickmark_steps::HttpCredentials;
///
/// let credentials = HttpCredentials::new()
///     .bearer("payments", "sk_test_123")?
///     .header("crm", "X-Api-Key", "k_456")?;
/// assert!(!format!("{credentials:?}").contains("sk_test"));
/// # Ok::<(), tickmark_steps::ConfigError>(())
/// ```
#[derive(Clone, Default)]
pub struct HttpCredentials {
    sets: HashMap<String, HeaderMap>,
}

impl HttpCredentials {
    /// No credentials yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add header `name: value` to set `set`.
    pub fn header(
        mut self,
        set: impl Into<String>,
        name: &str,
        value: &str,
    ) -> Result<Self, ConfigError> {
        let set = set.into();
        let invalid = |reason: &str| ConfigError::InvalidHeader {
            set: set.clone(),
            name: name.to_owned(),
            reason: reason.to_owned(),
        };
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("not a valid header name"))?;
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| invalid("the value has characters HTTP does not allow"))?;
        value.set_sensitive(true);
        self.sets.entry(set).or_default().append(name, value);
        Ok(self)
    }

    /// Add `Authorization: Bearer {token}` to set `set`.
    pub fn bearer(self, set: impl Into<String>, token: &str) -> Result<Self, ConfigError> {
        self.header(set, "authorization", &format!("Bearer {token}"))
    }
}

impl fmt::Debug for HttpCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (set, headers) in &self.sets {
            let names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
            map.entry(set, &names);
        }
        map.finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tickmark::{FailureKind, Resources, StepOutputs};

    use super::*;
    use crate::test_support::{context, event, Answer, Server};

    fn build(call: &HttpCall, resources: &Resources) -> Result<Request<Full<Bytes>>, StepError> {
        let event = event("evt_1", json!({"order": {"id": "o_1"}}));
        let outputs = StepOutputs::default();
        let ctx = context(&event, "reserve", &outputs, resources);
        call.request(&ctx)
    }

    async fn body_of(request: &Request<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let bytes = request.body().clone().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_carry_method_url_headers_key_and_body() {
        let call = HttpCall::put("http://127.0.0.1:9/orders?x=1")
            .header("X-Trace", "t1")
            .body(ValueFrom::event_at("/order"));
        let request = build(&call, &Resources::default()).unwrap();
        assert_eq!(request.method(), Method::PUT);
        let lower = build(&HttpCall::new("delete", "http://h/"), &Resources::default()).unwrap();
        assert_eq!(lower.method(), Method::DELETE);
        assert_eq!(request.uri(), "http://127.0.0.1:9/orders?x=1");
        let headers = request.headers();
        assert_eq!(headers["idempotency-key"], "shop:evt_1:reserve");
        assert_eq!(headers["x-trace"], "t1");
        assert_eq!(headers["content-type"], "application/json");
        assert!(headers["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("tickmark-steps/"));
        assert_eq!(body_of(&request).await, r#"{"id":"o_1"}"#);
    }

    #[tokio::test]
    async fn no_body_means_no_content_type_and_own_headers_win() {
        let get = build(&HttpCall::get("http://h/"), &Resources::default()).unwrap();
        assert!(!get.headers().contains_key("content-type"));
        assert_eq!(body_of(&get).await, "");

        let call = HttpCall::post("http://h/")
            .json(json!("text"))
            .header("content-type", "application/vnd.api+json")
            .header("user-agent", "mine")
            .idempotency_header("X-Request-Key");
        let request = build(&call, &Resources::default()).unwrap();
        let headers = request.headers();
        assert_eq!(headers["content-type"], "application/vnd.api+json");
        assert_eq!(headers["user-agent"], "mine");
        assert_eq!(headers["x-request-key"], "shop:evt_1:reserve");
        assert!(!headers.contains_key("idempotency-key"));
        assert_eq!(body_of(&request).await, r#""text""#);
    }

    #[test]
    fn the_idempotency_key_cannot_be_overridden_by_a_fixed_header() {
        let call = HttpCall::post("http://h/").header("Idempotency-Key", "fixed");
        let request = build(&call, &Resources::default()).unwrap();
        let keys: Vec<_> = request
            .headers()
            .get_all("idempotency-key")
            .iter()
            .collect();
        assert_eq!(keys, ["shop:evt_1:reserve"]);
    }

    #[test]
    fn credentials_come_from_the_resource() {
        let call = HttpCall::post("http://h/")
            .header("Authorization", "stored")
            .credentials("payments");
        let missing = build(&call, &Resources::default()).unwrap_err();
        assert_eq!(missing.kind(), FailureKind::Retryable);

        let mut resources = Resources::default();
        resources.insert(HttpCredentials::new().bearer("other", "x").unwrap());
        let unknown = build(&call, &resources).unwrap_err();
        assert_eq!(unknown.kind(), FailureKind::Retryable);
        assert!(unknown.message().contains("`payments`"), "{unknown}");

        let mut resources = Resources::default();
        resources.insert(HttpCredentials::new().bearer("payments", "sk_1").unwrap());
        let request = build(&call, &resources).unwrap();
        let auth: Vec<_> = request.headers().get_all("authorization").iter().collect();
        assert_eq!(auth, ["Bearer sk_1"]);
        assert!(request.headers()["authorization"].is_sensitive());
    }

    #[test]
    fn bad_configuration_is_terminal() {
        for call in [
            HttpCall::new("GE T", "http://h/"),
            HttpCall::post("not a url"),
            HttpCall::post("/relative"),
            HttpCall::post("ftp://h/"),
            HttpCall::post("http://h/").header("bad header", "v"),
            HttpCall::post("http://h/").header("x", "line\nbreak"),
            HttpCall::post("http://h/").body(ValueFrom::event_at("/nope")),
            HttpCall::post("http://h/").idempotency_header("bad:name"),
        ] {
            let error = build(&call, &Resources::default()).unwrap_err();
            assert!(error.is_terminal(), "{call:?}: {error}");
        }
        assert!(HttpCredentials::new().header("s", "bad name", "v").is_err());
        assert!(HttpCredentials::new().header("s", "x", "a\rb").is_err());
    }

    #[test]
    fn https_needs_the_rustls_feature() {
        let result = build(
            &HttpCall::get("https://example.com/"),
            &Resources::default(),
        );
        if cfg!(feature = "rustls") {
            assert!(result.is_ok());
        } else {
            let error = result.unwrap_err();
            assert!(error.is_terminal());
            assert!(error.message().contains("rustls"), "{error}");
        }
    }

    #[test]
    fn the_stored_form_is_stable_and_old_plans_read() {
        let call = HttpCall::post("http://h/x").json(json!({"a": 1}));
        let step: &dyn Step = &call;
        let stored = serde_json::to_value(step).unwrap();
        assert_eq!(stored["type"], "tickmark.http_call");
        assert_eq!(
            stored["config"],
            json!({
                "method": "POST",
                "url": "http://h/x",
                "body": {"from": "fixed", "value": {"a": 1}},
                "idempotency_header": "Idempotency-Key",
                "response_headers": ["content-type", "location"],
            })
        );
        let minimal: HttpCall = serde_json::from_value(json!({"url": "http://h/"})).unwrap();
        assert_eq!(minimal, HttpCall::post("http://h/"));
    }

    #[tokio::test]
    async fn a_call_returns_the_response_as_output() {
        let server = Server::start(vec![Answer::new(201, r#"{"id":"r_1"}"#)
            .header("content-type", "application/json")
            .header("location", "/r/1")])
        .await;
        let event = event("evt_1", json!({"n": 1}));
        let outputs = StepOutputs::default();
        let mut resources = Resources::default();
        resources.insert(crate::HttpClient::new());
        let mut ctx = context(&event, "reserve", &outputs, &resources);
        let call = HttpCall::post(server.url("/reservations")).body(ValueFrom::event());
        let output = call.run(&mut ctx).await.unwrap();
        assert_eq!(
            output,
            json!({
                "status": 201,
                "headers": {"content-type": "application/json", "location": "/r/1"},
                "body": {"id": "r_1"},
                "truncated": false,
            })
        );
        let seen = server.seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].method, "POST");
        assert_eq!(seen[0].path, "/reservations");
        assert_eq!(seen[0].headers["idempotency-key"], "shop:evt_1:reserve");
        assert_eq!(seen[0].body, br#"{"n":1}"#);
    }

    #[tokio::test]
    async fn without_a_registered_client_the_default_one_is_used() {
        let server = Server::start(vec![Answer::new(404, "no such order")]).await;
        let event = event("evt_1", json!({}));
        let outputs = StepOutputs::default();
        let resources = Resources::default();
        let mut ctx = context(&event, "reserve", &outputs, &resources);
        let error = HttpCall::get(server.url("/o/1"))
            .run(&mut ctx)
            .await
            .unwrap_err();
        assert!(error.is_terminal());
        assert!(error.message().contains("404"), "{error}");
        assert!(error.message().contains("no such order"), "{error}");
        assert_eq!(server.seen().len(), 1);
    }

    #[tokio::test]
    async fn retry_statuses_are_retryable() {
        let server = Server::start(vec![Answer::new(409, "in progress")]).await;
        let event = event("evt_1", json!({}));
        let outputs = StepOutputs::default();
        let resources = Resources::default();
        let mut ctx = context(&event, "reserve", &outputs, &resources);
        let error = HttpCall::post(server.url("/"))
            .retry_on(409)
            .run(&mut ctx)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
    }
}
