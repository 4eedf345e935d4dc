//! The HTTP client the ready-made steps share, and the rules that turn an HTTP
//! answer into a step outcome: 2xx is done; 5xx, 408, 429 and timeouts are
//! retryable (429 and 503 wait at least their `Retry-After`); anything else
//! is terminal.
//!
//! One client per process keeps one connection pool: register
//! [`HttpClient::default()`] with
//! [`Engine::with_resource`](tickmark::Engine::with_resource). A step that
//! finds none registered uses a process-wide default client built on first use.

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::{json, Map, Value};
use tickmark::{StepContext, StepError};
use tokio_util::sync::CancellationToken;

/// How long one request may take, connecting and reading the answer
/// included, unless a step says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of a response body is kept in a step's output, unless the step
/// says otherwise. The rest is not read.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The longest `Retry-After` honoured; a longer one is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// How much of a failed response's body goes into the step's error message.
const ERROR_EXCERPT_CHARS: usize = 200;

/// The `User-Agent` sent unless a step sets its own.
pub const USER_AGENT: &str = concat!("tickmark-steps/", env!("CARGO_PKG_VERSION"));

#[cfg(feature = "rustls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "rustls"))]
type Connector = HttpConnector;

/// A pooled HTTP/1.1 client (hyper-util's), shared by every step of a
/// process. `https://` needs the crate's `rustls` feature. Pooled
/// connections are driven by tasks on the runtime that opened them: a
/// process with several Tokio runtimes should register one client per engine
/// it runs on each.
///
/// ```
/// # use tickmark::{Engine, Handlers};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = tickmark::connect(&format!("sqlite://{}", dir.path().join("c.db").display())).await?;
/// let engine = Engine::new(store, Handlers::new())?
///     .with_resource(tickmark_steps::HttpClient::default());
/// # let _ = engine;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HttpClient {
    client: Client<Connector, Full<Bytes>>,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("https", &self.supports_https())
            .finish_non_exhaustive()
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    /// A client with a connection pool (idle connections closed after 30 s)
    /// and a 10 s connect timeout.
    pub fn new() -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector(http));
        Self { client }
    }

    /// Whether this build can call `https://` URLs (the `rustls` feature).
    pub fn supports_https(&self) -> bool {
        cfg!(feature = "rustls")
    }

    /// Send `request` and read at most `max_body` bytes of the answer, all
    /// within `timeout`; give up when `cancel` fires. Every failure here
    /// (refused, reset, timed out, cancelled) is retryable.
    pub(crate) async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
        max_body: usize,
        cancel: &CancellationToken,
    ) -> Result<Exchange, StepError> {
        let what = format!(
            "{} {}",
            request.method(),
            tickmark::redact_url(&request.uri().to_string())
        );
        let work = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| StepError::retryable(format!("{what}: {}", chain(&error))))?;
            let (parts, mut body) = response.into_parts();
            let mut bytes = Vec::new();
            let mut truncated = false;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|error| {
                    StepError::retryable(format!("{what}: reading the answer: {}", chain(&error)))
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let room = max_body - bytes.len();
                if data.len() > room {
                    bytes.extend_from_slice(&data[..room]);
                    truncated = true;
                    break;
                }
                bytes.extend_from_slice(&data);
            }
            Ok(Exchange {
                what: what.clone(),
                status: parts.status,
                headers: parts.headers,
                body: bytes,
                truncated,
            })
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(StepError::retryable(format!(
                "{what}: cancelled (the lease was lost or the worker is shutting down)"
            ))),
            result = tokio::time::timeout(timeout, work) => result.unwrap_or_else(|_| {
                Err(StepError::retryable(format!(
                    "{what}: no complete answer within {} ms",
                    timeout.as_millis()
                )))
            }),
        }
    }
}

#[cfg(not(feature = "rustls"))]
fn connector(http: HttpConnector) -> Connector {
    http
}

#[cfg(feature = "rustls")]
fn connector(mut http: HttpConnector) -> Connector {
    http.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        // ring implements every protocol version rustls enables by default.
        .expect("ring supports rustls' default protocol versions")
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// The client registered with the engine, or else the process-wide default.
pub(crate) fn client_for<'c>(ctx: &'c StepContext<'_>) -> &'c HttpClient {
    static DEFAULT: OnceLock<HttpClient> = OnceLock::new();
    match ctx.resource::<HttpClient>() {
        Ok(client) => client,
        Err(_) => DEFAULT.get_or_init(HttpClient::new),
    }
}

/// A terminal error unless `uri` is an absolute `http://` URL, or an
/// `https://` one in a build with the `rustls` feature.
pub(crate) fn check_scheme(uri: &http::Uri) -> Result<(), StepError> {
    // Messages show the URL without its password.
    let shown = tickmark::redact_url(&uri.to_string()).into_owned();
    if uri.authority().is_none() {
        return Err(StepError::terminal(format!(
            "`{shown}` is not an absolute URL (http://host/path)"
        )));
    }
    match uri.scheme_str() {
        Some("http") => Ok(()),
        Some("https") if cfg!(feature = "rustls") => Ok(()),
        Some("https") => Err(StepError::terminal(format!(
            "`{shown}` needs TLS: enable the `rustls` feature of tickmark-steps \
             (tickmark-steps = {{ features = [\"rustls\"] }})"
        ))),
        _ => Err(StepError::terminal(format!(
            "`{shown}` is neither http:// nor https://"
        ))),
    }
}

/// One request's answer, with the body read up to a limit.
#[derive(Debug)]
pub(crate) struct Exchange {
    /// `METHOD URL`, for messages.
    pub what: String,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// Whether the body was longer than the limit (and cut).
    pub truncated: bool,
}

impl Exchange {
    /// Done for 2xx; otherwise the failure, retryable or terminal (see the
    /// module documentation). `retry_also` lists further statuses to retry.
    pub fn check(&self, retry_also: &[u16]) -> Result<(), StepError> {
        outcome(
            self.status,
            &self.headers,
            &self.what,
            &self.excerpt(),
            retry_also,
            SystemTime::now(),
        )
    }

    /// The body as JSON when it is declared and parses as JSON, else as text
    /// (lossy UTF-8); `null` when empty.
    pub fn body_value(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        let declared_json = self
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                let essence = v.split(';').next().unwrap_or("").trim();
                essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")
            });
        if declared_json && !self.truncated {
            if let Ok(value) = serde_json::from_slice(&self.body) {
                return value;
            }
        }
        Value::String(String::from_utf8_lossy(&self.body).into_owned())
    }

    /// The step output: status, the headers in `keep` that are present
    /// (lower-case names; repeated ones joined with `, `), the body, and
    /// whether it was truncated.
    pub fn output(&self, keep: &[String]) -> Value {
        let mut headers = Map::new();
        for name in keep {
            let name = name.to_ascii_lowercase();
            let values: Vec<String> = self
                .headers
                .get_all(name.as_str())
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            if !values.is_empty() {
                headers.insert(name, Value::String(values.join(", ")));
            }
        }
        json!({
            "status": self.status.as_u16(),
            "headers": headers,
            "body": self.body_value(),
            "truncated": self.truncated,
        })
    }

    /// The start of the body, for an error message.
    fn excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let mut excerpt: String = text.chars().take(ERROR_EXCERPT_CHARS).collect();
        if excerpt.len() < text.len() || self.truncated {
            excerpt.push('…');
        }
        excerpt
    }
}

/// The outcome of an answer with `status` (see the module documentation).
fn outcome(
    status: StatusCode,
    headers: &HeaderMap,
    what: &str,
    excerpt: &str,
    retry_also: &[u16],
    now: SystemTime,
) -> Result<(), StepError> {
    if status.is_success() {
        return Ok(());
    }
    let said = if excerpt.is_empty() {
        String::new()
    } else {
        format!(": {excerpt}")
    };
    let code = status.as_u16();
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        let asked = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now));
        return Err(match asked {
            Some(delay) => StepError::retryable_after(
                delay,
                format!(
                    "{what} answered {status}, retry after {} s{said}",
                    delay.as_secs()
                ),
            ),
            None => StepError::retryable(format!("{what} answered {status}{said}")),
        });
    }
    if status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || retry_also.contains(&code)
    {
        return Err(StepError::retryable(format!(
            "{what} answered {status}{said}"
        )));
    }
    let hint = if status.is_redirection() {
        " (redirects are not followed: use the final URL)"
    } else {
        ""
    };
    Err(StepError::terminal(format!(
        "{what} answered {status}{hint}{said}"
    )))
}

/// The delay a `Retry-After` value asks for, at `now`: delay-seconds
/// (`120`) or an HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`; a date in the
/// past is no delay). Capped at [`MAX_RETRY_AFTER`]; `None` when unreadable.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use tickmark_steps::http_client::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 07:28:00 GMT
/// assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
///     Some(Duration::from_secs(60))
/// );
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: only an overflow can fail to parse, and that is "a lot".
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// An error and its causes, joined with `: ` (hyper-util's own message is
/// only "client error (Connect)").
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use tickmark::FailureKind;

    use super::*;
    use crate::test_support::{Answer, Server};

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    /// 2015-10-21 07:28:00 GMT.
    const NOW: u64 = 1_445_412_480;

    #[test]
    fn retry_after_seconds() {
        let now = at(NOW);
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("86400", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("86401", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        for bad in ["", " ", "-1", "1.5", "+3", "3s", "soon", "0x10"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_http_dates_in_all_three_formats() {
        let now = at(NOW);
        for date in [
            "Wed, 21 Oct 2015 07:28:30 GMT",
            "Wednesday, 21-Oct-15 07:28:30 GMT",
            "Wed Oct 21 07:28:30 2015",
        ] {
            assert_eq!(
                parse_retry_after(date, now),
                Some(Duration::from_secs(30)),
                "{date}"
            );
        }
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past is no delay"
        );
        assert_eq!(
            parse_retry_after("Sat, 21 Oct 2017 07:00:00 GMT", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_after("Wed, 32 Oct 2015 07:28:30 GMT", now),
            None
        );
    }

    fn classify(status: u16, headers: &[(&str, &str)]) -> Result<(), StepError> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        outcome(
            StatusCode::from_u16(status).unwrap(),
            &map,
            "POST http://x/",
            "nope",
            &[409],
            at(NOW),
        )
    }

    #[test]
    fn statuses_map_to_outcomes() {
        for ok in [200, 201, 202, 204, 299] {
            assert!(classify(ok, &[]).is_ok(), "{ok}");
        }
        for retry in [500, 502, 503, 504, 599, 408, 429, 409] {
            let error = classify(retry, &[]).unwrap_err();
            assert_eq!(error.kind(), FailureKind::Retryable, "{retry}");
            assert_eq!(error.retry_after(), None);
        }
        for terminal in [400, 401, 403, 404, 410, 422, 301, 302, 304, 100] {
            let error = classify(terminal, &[]).unwrap_err();
            assert!(error.is_terminal(), "{terminal}");
            assert!(error.message().contains(&terminal.to_string()), "{error}");
        }
        assert!(classify(302, &[])
            .unwrap_err()
            .message()
            .contains("redirects are not followed"));
    }

    #[test]
    fn retry_after_is_honoured_on_429_and_503_only() {
        for status in [429, 503] {
            let error = classify(status, &[("retry-after", "5")]).unwrap_err();
            assert_eq!(error.kind(), FailureKind::Retryable);
            assert_eq!(error.retry_after(), Some(Duration::from_secs(5)));
            assert!(error.message().contains("retry after 5 s"), "{error}");
        }
        let date = classify(429, &[("retry-after", "Wed, 21 Oct 2015 07:29:00 GMT")]).unwrap_err();
        assert_eq!(date.retry_after(), Some(Duration::from_secs(60)));
        let garbage = classify(503, &[("retry-after", "later")]).unwrap_err();
        assert_eq!(garbage.retry_after(), None);
        let other = classify(500, &[("retry-after", "5")]).unwrap_err();
        assert_eq!(other.retry_after(), None);
    }

    fn exchange(content_type: Option<&str>, body: &[u8], truncated: bool) -> Exchange {
        let mut headers = HeaderMap::new();
        if let Some(value) = content_type {
            headers.insert(CONTENT_TYPE, value.parse().unwrap());
        }
        headers.append("x-request-id", "a".parse().unwrap());
        headers.append("x-request-id", "b".parse().unwrap());
        Exchange {
            what: "GET http://x/".into(),
            status: StatusCode::OK,
            headers,
            body: body.to_vec(),
            truncated,
        }
    }

    #[test]
    fn bodies_are_json_when_declared_and_whole_else_text() {
        let json_body = br#"{"ok":true}"#;
        assert_eq!(
            exchange(Some("application/json; charset=utf-8"), json_body, false).body_value(),
            json!({"ok": true})
        );
        assert_eq!(
            exchange(Some("application/problem+json"), json_body, false).body_value(),
            json!({"ok": true})
        );
        assert_eq!(
            exchange(Some("text/plain"), json_body, false).body_value(),
            json!(r#"{"ok":true}"#)
        );
        assert_eq!(
            exchange(Some("application/json"), b"{\"ok\":", true).body_value(),
            json!("{\"ok\":")
        );
        assert_eq!(
            exchange(None, b"\xffhi", false).body_value(),
            json!("\u{fffd}hi")
        );
        assert_eq!(exchange(None, b"", false).body_value(), Value::Null);
    }

    #[test]
    fn the_output_keeps_selected_headers() {
        let output = exchange(Some("application/json"), b"[1]", false).output(&[
            "Content-Type".into(),
            "X-Request-Id".into(),
            "etag".into(),
        ]);
        assert_eq!(
            output,
            json!({
                "status": 200,
                "headers": {"content-type": "application/json", "x-request-id": "a, b"},
                "body": [1],
                "truncated": false,
            })
        );
    }

    #[test]
    fn schemes() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(check_scheme(&uri("http://127.0.0.1:1/x")).is_ok());
        for bad in ["/relative", "ftp://host/x"] {
            assert!(check_scheme(&uri(bad)).unwrap_err().is_terminal(), "{bad}");
        }
        let refused = check_scheme(&uri("ftp://user:s3cret@host/x")).unwrap_err();
        assert!(!refused.message().contains("s3cret"), "{refused}");
        assert!(refused.message().contains("user:***@host"), "{refused}");
        let https = check_scheme(&uri("https://example.com/"));
        if cfg!(feature = "rustls") {
            assert!(https.is_ok());
        } else {
            let error = https.unwrap_err();
            assert!(error.is_terminal());
            assert!(error.message().contains("`rustls` feature"), "{error}");
        }
    }

    fn get(url: &str) -> Request<Full<Bytes>> {
        Request::get(url).body(Full::default()).unwrap()
    }

    #[tokio::test]
    async fn long_bodies_are_cut_at_the_limit() {
        let server = Server::start(vec![Answer::new(200, &"x".repeat(10_000))]).await;
        let client = HttpClient::new();
        let cancel = CancellationToken::new();
        let cut = client
            .exchange(get(&server.url("/")), DEFAULT_TIMEOUT, 100, &cancel)
            .await
            .unwrap();
        assert_eq!((cut.body.len(), cut.truncated), (100, true));
        let whole = client
            .exchange(get(&server.url("/")), DEFAULT_TIMEOUT, 10_000, &cancel)
            .await
            .unwrap();
        assert_eq!((whole.body.len(), whole.truncated), (10_000, false));
    }

    #[tokio::test]
    async fn timeouts_cancellation_and_refused_connections_are_retryable() {
        let server = Server::start(vec![Answer::new(200, "late").delay_ms(5_000)]).await;
        let client = HttpClient::new();
        let never = CancellationToken::new();
        let started = std::time::Instant::now();
        let error = client
            .exchange(
                get(&server.url("/slow")),
                Duration::from_millis(100),
                10,
                &never,
            )
            .await
            .unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
        assert!(error.message().contains("within 100 ms"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(2));

        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            trigger.cancel();
        });
        let error = client
            .exchange(get(&server.url("/slow")), DEFAULT_TIMEOUT, 10, &cancel)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
        assert!(error.message().contains("cancelled"), "{error}");

        // A port nobody listens on: bind one, note it, close it.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let error = client
            .exchange(
                get(&format!("http://{closed}/")),
                DEFAULT_TIMEOUT,
                10,
                &never,
            )
            .await
            .unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
        assert!(error.message().contains(&closed.to_string()), "{error}");
    }
}
