//! How the example servers log: `tracing` to stderr, filtered by
//! `RUST_LOG` (else the binary's default), with colour only on a terminal,
//! so a log file or a pipe gets plain text.

/// Log to stderr with `RUST_LOG`, or `default_filter` when it is unset or
/// invalid.
pub fn log_to_stderr(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
