//! Helpers for the unit tests: an event, a context, a loopback HTTP server.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use tickmark::{Event, Resources, StepContext, StepOutputs};
use tokio_util::sync::CancellationToken;

/// An `order.paid` event from `shop`.
pub fn event(id: &str, payload: serde_json::Value) -> Event {
    Event {
        seq: 1,
        source: "shop".into(),
        id: id.into(),
        kind: "order.paid".into(),
        payload,
        received_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).expect("valid time"),
    }
}

/// A context for step `name` of `event`, attempt 1, never cancelled.
pub fn context<'a>(
    event: &'a Event,
    name: &'a str,
    outputs: &'a StepOutputs,
    resources: &'a Resources,
) -> StepContext<'a> {
    StepContext::new(
        event,
        name,
        outputs,
        1,
        CancellationToken::new(),
        None,
        resources,
    )
}

/// One request a [`Server`] received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// A loopback server that answers every request with the next scripted
/// answer (the last one repeats) and records what it received.
pub struct Server {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One scripted answer: status, headers, body, and a delay before answering.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay_ms: u64,
}

impl Answer {
    pub fn new(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay_ms: 0,
        }
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn delay_ms(mut self, delay_ms: u64) -> Self {
        self.delay_ms = delay_ms;
        self
    }
}

impl Server {
    pub async fn start(script: Vec<Answer>) -> Server {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let script = Arc::new(script);
        let recorded = Arc::clone(&seen);
        let router = Router::new().fallback(move |request: axum::extract::Request| {
            let seen = Arc::clone(&recorded);
            let script = Arc::clone(&script);
            async move {
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX)
                    .await
                    .expect("body")
                    .to_vec();
                let index = {
                    let mut seen = seen.lock().expect("lock");
                    seen.push(Seen {
                        method: parts.method.to_string(),
                        path: parts.uri.to_string(),
                        headers: parts.headers,
                        body,
                    });
                    seen.len() - 1
                };
                let answer = script[index.min(script.len() - 1)].clone();
                if answer.delay_ms > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(answer.delay_ms)).await;
                }
                let mut response = (
                    StatusCode::from_u16(answer.status).expect("status"),
                    answer.body,
                )
                    .into_response();
                for (name, value) in answer.headers {
                    response
                        .headers_mut()
                        .insert(name, value.parse().expect("header value"));
                }
                response
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Server { addr, seen, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
