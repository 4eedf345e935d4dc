//! How the example servers log: `tracing` to stderr, filtered by
//! `RUST_LOG` (else the binary's default), with colour only on a terminal,
//! so a log file or a pipe gets plain text. Built with the `otel` feature,
//! they also export traces when `OTEL_EXPORTER_OTLP_ENDPOINT` names a
//! collector (docs/observability.md).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// What keeps the traces exporting: hold it until the process ends
/// (dropping it sends what is still queued).
#[must_use = "dropping it stops exporting traces at once"]
pub struct Logging {
    #[cfg(feature = "otel")]
    _traces: Option<tickmark::otel::Traces>,
}

/// Log to stderr with `RUST_LOG`, or `default_filter` when it is unset or
/// invalid; with the `otel` feature, export traces as the `OTEL_*`
/// variables say, under the service name `service`.
pub fn log_to_stderr(service: &str, default_filter: &str) -> Logging {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    #[cfg(feature = "otel")]
    {
        let traces = tickmark::otel::Traces::from_env(service).unwrap_or_else(|error| {
            eprintln!("{service}: traces are off: {error}");
            None
        });
        tracing_subscriber::registry()
            .with(stderr)
            .with(traces.as_ref().map(tickmark::otel::Traces::layer))
            .init();
        Logging { _traces: traces }
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = service;
        tracing_subscriber::registry().with(stderr).init();
        Logging {}
    }
}
