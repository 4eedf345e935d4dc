//! # tickmark-otel: tickmark's traces, sent to an OpenTelemetry collector
//!
//! **Not for users directly.** Turn on the `tickmark` crate's `otel`
//! feature and use `tickmark::otel`.
//!
//! [`Traces::from_env`] sets up what the OpenTelemetry specification's
//! environment variables describe: an OTLP/HTTP (protobuf) exporter to
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (with `…_HEADERS` and `…_TIMEOUT`), the service named by
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, the sampler of
//! `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, and the batch queue
//! of `OTEL_BSP_*`. [`Traces::layer`] is the `tracing` layer that turns
//! tickmark's spans (the delivery, the accept, each event run and each step
//! attempt) into OpenTelemetry spans. The engine itself stores each event's
//! trace context and continues it in every later run (docs/observability.md).
//!
//! Export runs on the SDK's own thread: a step never waits for it. Its
//! queue is bounded, and a span that does not fit is dropped and counted
//! ([`SpanCounts`]).
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//!
//! # fn main() -> Result<(), tickmark_otel::OtelError> {
//! // `None` unless an OTLP endpoint is configured.
//! let traces = tickmark_otel::Traces::from_env("shopsync")?;
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::fmt::layer())
//!     .with(traces.as_ref().map(tickmark_otel::Traces::layer))
//!     .init();
//! // … run the engine; dropping `traces` sends what is still queued.
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bounded;

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::level_filters::LevelFilter;
use tracing::Subscriber;
use tracing_subscriber::filter::{filter_fn, FilterExt, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

pub use bounded::SpanCounts;
use bounded::{BoundedProcessor, CountedExporter};

/// The OpenTelemetry name of the spans' instrumentation scope.
pub const SCOPE: &str = "tickmark";

/// The export queue's length when `OTEL_BSP_MAX_QUEUE_SIZE` does not say
/// (the specification's default).
pub const DEFAULT_QUEUE: usize = 2048;

/// Why traces could not be set up, or flushed.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// An `OTEL_*` variable holds a value the exporter refuses.
    #[error(
        "the OpenTelemetry exporter's configuration is refused ({0}); check \
         OTEL_EXPORTER_OTLP_ENDPOINT (a URL such as http://collector:4318), \
         OTEL_EXPORTER_OTLP_HEADERS (key=value,…) and OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds)"
    )]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// An `OTEL_*` variable that tickmark reads itself is not what it may be.
    #[error("{name}={value:?} is not {expected}")]
    Variable {
        /// The variable.
        name: &'static str,
        /// What it holds.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
    /// What was queued could not all be sent at shutdown.
    #[error("the last traces could not all be sent to the collector: {0}")]
    Flush(#[from] opentelemetry_sdk::error::OTelSdkError),
}

/// Traces being exported: the SDK's tracer provider and what became of the
/// spans. Dropping it sends what is still queued (at most the export
/// timeout) and stops the export thread.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    counts: Arc<SpanCounts>,
}

impl Traces {
    /// Export traces as the `OTEL_*` environment variables say (see the
    /// crate's docs), naming the service `service_name` unless
    /// `OTEL_SERVICE_NAME` names it. `Ok(None)` when no OTLP endpoint is
    /// configured, `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`:
    /// a build with the feature, run without a collector, sends nothing.
    pub fn from_env(service_name: &str) -> Result<Option<Self>, OtelError> {
        if !configured()? {
            return Ok(None);
        }
        Self::build(None, service_name).map(Some)
    }

    /// Export traces to the collector at `endpoint` (its OTLP/HTTP base,
    /// such as `http://collector:4318`; `/v1/traces` is appended), whatever
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` says. The other `OTEL_*` variables
    /// apply as in [`from_env`](Self::from_env).
    pub fn to_collector(endpoint: &str, service_name: &str) -> Result<Self, OtelError> {
        Self::build(Some(endpoint), service_name)
    }

    fn build(endpoint: Option<&str>, service_name: &str) -> Result<Self, OtelError> {
        let counts = Arc::new(SpanCounts::default());
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary);
        if let Some(endpoint) = endpoint {
            exporter =
                exporter.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        let exporter = exporter.build()?;
        let capacity = queue_length()?;
        let batches =
            BatchSpanProcessor::builder(CountedExporter::new(exporter, Arc::clone(&counts)))
                .with_batch_config(
                    BatchConfigBuilder::default()
                        .with_max_queue_size(capacity)
                        .build(),
                )
                .build();
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(service_name.to_owned());
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedProcessor::new(
                batches,
                capacity,
                Arc::clone(&counts),
            ))
            .with_resource(resource.build())
            .build();
        Ok(Self { provider, counts })
    }

    /// The `tracing` layer that exports spans at `INFO` and above (tickmark's
    /// delivery, accept and step-attempt spans, and the log lines inside
    /// them as span events). The exporter's own HTTP client and the SDK's
    /// logs are left out, so export never traces itself.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        let filter = Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target("opentelemetry", LevelFilter::OFF)
            .with_target("opentelemetry_sdk", LevelFilter::OFF)
            .with_target("opentelemetry_otlp", LevelFilter::OFF)
            .with_target("opentelemetry-otlp", LevelFilter::OFF)
            .with_target("reqwest", LevelFilter::OFF)
            .with_target("hyper_util", LevelFilter::OFF)
            .with_target("hyper", LevelFilter::OFF);
        // An event's run is not exported: its step attempts hang from the
        // accept (a run a crash cut short never ends its span), so the run
        // would be one more span per event that no other span needs.
        let not_the_run = filter_fn(|metadata| {
            !(metadata.is_span()
                && metadata.name() == "event"
                && metadata.target().starts_with("tickmark_core"))
        });
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(SCOPE))
            .with_location(false)
            .with_threads(false)
            // Busy and idle times cost two clock reads per poll of every
            // span; a span's start and end say how long it took.
            .with_tracked_inactivity(false)
            // Nor is OpenTelemetry's own current context swapped at every
            // poll: tickmark reads a span's context from the span itself
            // (`tickmark::trace`), and an instrumented library that reads
            // `opentelemetry::Context::current()` is not one it calls.
            .with_context_activation(false)
            .with_filter(filter.and(not_the_run))
    }

    /// What became of the spans so far: exported, failed, dropped.
    pub fn counts(&self) -> &SpanCounts {
        &self.counts
    }

    /// Send what is queued now, and wait for it (at most the export timeout).
    pub fn flush(&self) -> Result<(), OtelError> {
        Ok(self.provider.force_flush()?)
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the last traces could not all be sent to the collector");
        }
        let dropped = self.counts.dropped();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "spans were dropped because the export queue was full; raise \
                 OTEL_BSP_MAX_QUEUE_SIZE or sample fewer traces (OTEL_TRACES_SAMPLER)"
            );
        }
    }
}

/// Whether the environment asks for traces to be exported.
fn configured() -> Result<bool, OtelError> {
    let var = |name| {
        std::env::var(name)
            .ok()
            .filter(|value| !value.trim().is_empty())
    };
    if var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(false),
        Some(other) => {
            return Err(OtelError::Variable {
                name: "OTEL_TRACES_EXPORTER",
                value: other.to_owned(),
                expected: "`otlp` or `none` (tickmark exports over OTLP/HTTP only)",
            })
        }
    }
    if let Some(protocol) = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .filter(|protocol| protocol != "http/protobuf")
    {
        return Err(OtelError::Variable {
            name: "OTEL_EXPORTER_OTLP_PROTOCOL",
            value: protocol,
            expected: "`http/protobuf` (tickmark exports over OTLP/HTTP only; a collector \
                       listens for it on port 4318)",
        });
    }
    Ok(var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
}

/// `OTEL_BSP_MAX_QUEUE_SIZE`, or the specification's default.
fn queue_length() -> Result<usize, OtelError> {
    match std::env::var("OTEL_BSP_MAX_QUEUE_SIZE") {
        Err(_) => Ok(DEFAULT_QUEUE),
        Ok(value) => value
            .trim()
            .parse()
            .ok()
            .filter(|length| *length > 0)
            .ok_or(OtelError::Variable {
                name: "OTEL_BSP_MAX_QUEUE_SIZE",
                value,
                expected: "a number of spans above 0",
            }),
    }
}
