//! Posting one delivery to a hook, as GitHub's webhook sender does: once
//! (GitHub "does not automatically redeliver failed deliveries":
//! <https://docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries>),
//! with the documented headers
//! (<https://docs.github.com/en/webhooks/webhook-events-and-payloads#delivery-headers>),
//! signed with `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`
//! (<https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries>),
//! and given 10 seconds to answer before it is recorded as `timed out`
//! (<https://docs.github.com/en/webhooks/testing-and-troubleshooting-webhooks/troubleshooting-webhooks#timed-out>).
//!
//! Status texts, from the troubleshooting page above: a 2xx is `OK`; another
//! status is an `Invalid HTTP Response` (recorded as
//! `Invalid HTTP Response: <code>`); a refused connection is
//! `failed to connect to network`; any other failure to connect is
//! `failed to connect to host`; no answer in time is `timed out`. A delivery
//! without an HTTP response records `status_code` 0.

use std::error::Error as _;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{Method, Request, Uri};
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;

/// How long GitHub waits for a receiver's answer (github.com).
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// `User-Agent` of GitHub's webhook sender ("prefix `GitHub-Hookshot/`").
const USER_AGENT: &str = "GitHub-Hookshot/tickmark-fake";

/// What to post.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub url: String,
    pub guid: String,
    pub event: String,
    pub hook_id: u64,
    pub target_type: &'static str,
    pub target_id: u64,
    pub secret: String,
    pub body: Vec<u8>,
}

/// What came of it.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub request_headers: Vec<(String, String)>,
    pub status: String,
    pub status_code: u16,
    pub duration: f64,
    pub response_headers: Vec<(String, String)>,
    pub response_body: Option<String>,
}

/// `sha256=<hex>` of `body` under `secret`.
pub fn signature_256(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The legacy `sha1=<hex>` GitHub still sends beside it.
fn signature_1(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(body);
    format!("sha1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The headers GitHub sends with a delivery.
fn headers(outgoing: &Outgoing) -> Vec<(String, String)> {
    let mut headers = vec![
        ("Accept".to_owned(), "*/*".to_owned()),
        ("User-Agent".to_owned(), USER_AGENT.to_owned()),
        ("X-GitHub-Delivery".to_owned(), outgoing.guid.clone()),
        ("X-GitHub-Event".to_owned(), outgoing.event.clone()),
        ("X-GitHub-Hook-ID".to_owned(), outgoing.hook_id.to_string()),
        (
            "X-GitHub-Hook-Installation-Target-ID".to_owned(),
            outgoing.target_id.to_string(),
        ),
        (
            "X-GitHub-Hook-Installation-Target-Type".to_owned(),
            outgoing.target_type.to_owned(),
        ),
        ("content-type".to_owned(), "application/json".to_owned()),
    ];
    if !outgoing.secret.is_empty() {
        headers.push((
            "X-Hub-Signature".to_owned(),
            signature_1(&outgoing.secret, &outgoing.body),
        ));
        headers.push((
            "X-Hub-Signature-256".to_owned(),
            signature_256(&outgoing.secret, &outgoing.body),
        ));
    }
    headers
}

/// Post `outgoing` once, within `timeout`.
pub(crate) async fn deliver(outgoing: &Outgoing, timeout: Duration) -> Outcome {
    let request_headers = headers(outgoing);
    let started = Instant::now();
    let result = tokio::time::timeout(timeout, post(outgoing, &request_headers)).await;
    let duration = started.elapsed().as_secs_f64();
    let failed = |status: &str| Outcome {
        request_headers: request_headers.clone(),
        status: status.to_owned(),
        status_code: 0,
        duration,
        response_headers: Vec::new(),
        response_body: None,
    };
    match result {
        Err(_) => failed("timed out"),
        Ok(Err(failure)) => failed(failure.status_text()),
        Ok(Ok((code, response_headers, body))) => Outcome {
            request_headers: request_headers.clone(),
            status: if (200..300).contains(&code) {
                "OK".to_owned()
            } else {
                format!("Invalid HTTP Response: {code}")
            },
            status_code: code,
            duration,
            response_headers,
            response_body: Some(body),
        },
    }
}

/// Why no HTTP response came back.
#[derive(Debug)]
enum Failure {
    Refused,
    Other,
}

impl Failure {
    fn status_text(&self) -> &'static str {
        match self {
            Failure::Refused => "failed to connect to network",
            Failure::Other => "failed to connect to host",
        }
    }
}

type Response = (u16, Vec<(String, String)>, String);

async fn post(outgoing: &Outgoing, headers: &[(String, String)]) -> Result<Response, Failure> {
    let uri: Uri = outgoing.url.parse().map_err(|_| Failure::Other)?;
    let mut builder = Request::builder().method(Method::POST).uri(uri);
    for (name, value) in headers {
        builder = builder.header(name, value);
    }
    let request = builder
        .body(Full::new(Bytes::from(outgoing.body.clone())))
        .map_err(|_| Failure::Other)?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client.request(request).await.map_err(|error| {
        let mut source = error.source();
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    return Failure::Refused;
                }
            }
            source = cause.source();
        }
        Failure::Other
    })?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|_| Failure::Other)?.to_bytes();
    let response_headers = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    Ok((
        parts.status.as_u16(),
        response_headers,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}
