//! Traces in the tools a team already runs (Jaeger, Tempo, Honeycomb,
//! Datadog): tickmark's spans exported over OTLP/HTTP, configured by the
//! standard `OTEL_*` variables (the `tickmark-otel` crate). One trace per
//! event, from the delivery that accepted it to every step attempt, across
//! retries, takeovers and waits: docs/observability.md walks through it.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//!
//! # fn main() -> Result<(), tickmark::otel::OtelError> {
//! // `None` unless OTEL_EXPORTER_OTLP_ENDPOINT (or …_TRACES_ENDPOINT) is set.
//! let traces = tickmark::otel::Traces::from_env("shopsync")?;
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::fmt::layer())
//!     .with(traces.as_ref().map(tickmark::otel::Traces::layer))
//!     .init();
//! // … run the engine; dropping `traces` sends what is still queued.
//! # Ok(()) }
//! ```

pub use tickmark_otel::{OtelError, SpanCounts, Traces, DEFAULT_QUEUE};
