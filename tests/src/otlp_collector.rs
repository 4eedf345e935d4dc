//! A loopback OpenTelemetry collector: `POST /v1/traces` over real HTTP,
//! each request decoded as an OTLP `ExportTraceServiceRequest` with the
//! official protobuf definitions (`opentelemetry-proto`), its spans kept
//! for the test to read. It speaks what a collector's OTLP/HTTP receiver
//! speaks (protobuf in, an empty `ExportTraceServiceResponse` out); what it
//! cannot decode it refuses with 400, so an exporter sending anything else
//! fails the test instead of passing it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use tokio_util::sync::CancellationToken;

/// One span as the collector received it.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSpan {
    /// `service.name` of the process that sent it.
    pub service: String,
    /// The span's name (`accept`, `event`, `step`, `webhook`).
    pub name: String,
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// The parent's span id; `None` for a trace's root.
    pub parent_span_id: Option<String>,
    /// Its attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// Its links: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// The names and attribute values of its events (the log lines inside
    /// it), for what must never appear in a trace.
    pub event_texts: Vec<String>,
}

impl CollectedSpan {
    /// Attribute `key`, as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// Every text the span carries: its name, attribute keys and values,
    /// and its events'.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str())
            .chain(
                self.attributes
                    .iter()
                    .flat_map(|(k, v)| [k.as_str(), v.as_str()]),
            )
            .chain(self.event_texts.iter().map(String::as_str))
    }
}

/// A collector listening on 127.0.0.1; stopped when dropped.
pub struct OtlpCollector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
    stop: CancellationToken,
}

impl OtlpCollector {
    /// Listen on a free loopback port, served by a thread of its own: a
    /// test may block its runtime on a flush that waits for this collector.
    pub async fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the collector's address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(Arc::clone(&spans));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the collector's runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("the collector's listener");
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped.cancelled_owned())
                    .await
                    .ok();
            });
        });
        Self { addr, spans, stop }
    }

    /// What `OTEL_EXPORTER_OTLP_ENDPOINT` is set to (the exporter appends
    /// `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Wait (at most `limit`) until a span matching `found` has arrived.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        found: impl Fn(&CollectedSpan) -> bool,
    ) -> CollectedSpan {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(span) = self.spans().into_iter().find(&found) {
                return span;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no span {what} reached the collector within {limit:?}; it has {:#?}",
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<CollectedSpan>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let is_protobuf = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value == "application/x-protobuf");
    let Ok(request) = ExportTraceServiceRequest::decode(body)
        .map_err(|_| ())
        .and_then(|request| if is_protobuf { Ok(request) } else { Err(()) })
    else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|resource| {
                resource
                    .attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
            })
            .map(|kv| text(kv.value.as_ref()))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(CollectedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex::encode(&span.parent_span_id)),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex::encode(&link.trace_id), hex::encode(&link.span_id)))
                        .collect(),
                    event_texts: span
                        .events
                        .iter()
                        .flat_map(|event| {
                            std::iter::once(event.name.clone())
                                .chain(attributes(&event.attributes).into_values())
                        })
                        .collect(),
                });
            }
        }
    }
    spans
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend(received);
    (
        StatusCode::OK,
        protobuf,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Export this process's spans to `collector`, and log as
/// [`init_tracing`](crate::db::init_tracing) does: the subscriber becomes
/// the process's global default. A thread's default is not enough: spans
/// cross threads (sqlx's SQLite workers drop them), and the registry closes
/// a span's parent in the default subscriber of the thread that drops it.
/// `None`, recorded as a skip, when the process has a global subscriber
/// already: under `cargo test`, where tests share one process (nextest,
/// which `scripts/test` runs, gives each test its own).
pub fn trace_this_process(collector: &OtlpCollector) -> Option<tickmark::otel::Traces> {
    let traces = tickmark::otel::Traces::to_collector(&collector.endpoint(), "tickmark-tests")
        .expect("an exporter to the loopback collector");
    if !crate::db::install_tracing(Some(&traces)) {
        crate::skip::record(
            &crate::skip::current_test(),
            "needs a process of its own to export its spans (run it with cargo nextest, as \
             scripts/test does)",
        );
        return None;
    }
    Some(traces)
}
