//! `payments`: a webhook receiver and a worker in one process.
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_test cargo run -p tickmark-examples --bin payments -- \
//!     [--database-url URL] [--listen ADDR] [--receipt-url URL] [--render-secs N] \
//!     [--out-dir DIR] [--public-url URL] \
//!     [--dashboard-listen ADDR --dashboard-token TOKEN [--metrics-public]] \
//!     [--header-read-timeout SECS] [--body-read-timeout SECS] [--write-timeout SECS] \
//!     [--max-requests-per-connection N] \
//!     [--max-connections N] [--max-connections-per-address N] [--max-connection-age SECS] \
//!     [--max-in-flight N] \
//!     [--body-limit BYTES]
//! ```
//!
//! Stripe's `invoice.payment_succeeded` runs `credit_account` (in the
//! database, exactly once), `send_receipt` (POST with an `Idempotency-Key`)
//! and `render_invoice` (a long step that writes `<out-dir>/<event id>.txt`);
//! every other verified event, from any source, runs `record`. `--help` lists
//! the sources and their secrets; `docs/receiver.md` walks through it with
//! curl and openssl. With `--dashboard-listen`, the dashboard and `/metrics`
//! are served on a second address (`docs/dashboard.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tickmark::dashboard::Dashboard;
use tickmark::receiver::{PublicBaseUrl, DEFAULT_BODY_LIMIT};
use tickmark::reconcile::{Reconciler, StripeApi};
use tickmark::serve::Limits;
use tickmark::{Engine, Receiver, SecretString, WorkerConfig};
use tickmark_examples::payments::{self, ReceiptClient, ReceiptUrl, Settings, SourceSetup};
use tickmark_examples::shutdown::shutdown_signal;
use tokio_util::sync::CancellationToken;

const ABOUT: &str =
    "Receive payment webhooks and process each event once: a receiver and a worker in one process.";

const LONG_ABOUT: &str = "\
Receive payment webhooks and process each event once: a receiver and a worker in one process.

Routes: POST /hooks/stripe, /hooks/github, /hooks/shopify, /hooks/standard, /hooks/slack,
/hooks/twilio, and GET /healthz. Every delivery is verified on its raw bytes, recorded once
(a redelivery answers 200 {\"status\":\"duplicate\"}) and answered at once; a worker in the
same process runs the steps.

Stripe invoice.payment_succeeded runs three steps:
  credit_account  adds data.object.amount_paid to data.object.customer's balance in the
                  `accounts` table, in the engine's transaction: exactly once
  send_receipt    POSTs a JSON receipt to --receipt-url with an Idempotency-Key header
  render_invoice  works --render-secs, then writes <out-dir>/<event id>.txt atomically
Every other verified event, from any source, runs one step, `record`, which adds
(source, event id, kind) to the `received` table.

Several `payments` processes on one PostgreSQL database share the work.";

const AFTER_HELP: &str = "\
Environment (a source without its secret is off: its path answers 404):
  STRIPE_WEBHOOK_SECRET    Stripe endpoint signing secret (whsec_...)
  GITHUB_WEBHOOK_SECRET    GitHub webhook secret
  SHOPIFY_WEBHOOK_SECRET   Shopify app client secret
  STANDARD_WEBHOOK_SECRET  Standard Webhooks / Svix secret (whsec_<base64>)
  SLACK_SIGNING_SECRET     Slack app signing secret
  TWILIO_AUTH_TOKEN        Twilio auth token (set --public-url behind a proxy)
  DATABASE_URL             same as --database-url
  TICKMARK_DASHBOARD_TOKEN same as --dashboard-token
  STRIPE_API_KEY           same as --stripe-api-key: reconcile what the receiver missed
  RUST_LOG                 log filter (default: info)
Each secret variable may hold several comma-separated secrets while one is rotated.

Example: sign and send a Stripe event with curl and openssl
  export STRIPE_WEBHOOK_SECRET=whsec_test
  payments --receipt-url http://127.0.0.1:9000/receipts &
  body='{\"id\":\"evt_1\",\"type\":\"invoice.payment_succeeded\",\"data\":{\"object\":{\"id\":\"in_1\",\"customer\":\"cus_1\",\"amount_paid\":1200,\"currency\":\"usd\"}}}'
  t=$(date +%s)
  sig=$(printf '%s' \"$t.$body\" | openssl dgst -sha256 -hmac \"$STRIPE_WEBHOOK_SECRET\" -r | cut -d' ' -f1)
  curl -s http://127.0.0.1:8080/hooks/stripe -H \"Stripe-Signature: t=$t,v1=$sig\" \\
       -H 'Content-Type: application/json' -d \"$body\"
  # => {\"event_id\":\"evt_1\",\"kind\":\"invoice.payment_succeeded\",\"status\":\"new\"}; again => \"duplicate\"";

/// Command-line settings.
#[derive(Debug, Parser)]
#[command(name = "payments", version, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP)]
struct Args {
    /// The database: `sqlite://FILE` (created if missing) or
    /// `postgres://USER@HOST/DB`. tickmark's tables and the app's
    /// (`accounts`, `received`) live there.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://payments.db")]
    database_url: String,

    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Where `send_receipt` POSTs each receipt (http:// only), with an
    /// `Idempotency-Key` header. A 5xx or timeout is retried, another 4xx
    /// dead-letters the event. Without it, `send_receipt` is skipped.
    #[arg(long, value_name = "URL")]
    receipt_url: Option<ReceiptUrl>,

    /// Seconds `render_invoice` works before writing the invoice: a stand-in
    /// for a long job (the lease is renewed meanwhile).
    #[arg(long, value_name = "N", default_value_t = 0)]
    render_secs: u64,

    /// Folder for the rendered invoices, `<event id>.txt` (created if missing).
    #[arg(long, value_name = "DIR", default_value = "invoices")]
    out_dir: PathBuf,

    /// The public base URL providers post to, e.g. `https://hooks.example.com`.
    /// Twilio signs the full URL, so behind a proxy or TLS terminator set it:
    /// the URL checked is this base + the request's path and query.
    #[arg(long, value_name = "URL")]
    public_url: Option<PublicBaseUrl>,

    /// Serve the dashboard and `/metrics` on this address, e.g.
    /// `127.0.0.1:9090` (off by default). Every page and `/metrics` need
    /// the token: browsers sign in with a form, scripts and Prometheus send
    /// `Authorization: Bearer <token>`.
    #[arg(long, value_name = "ADDR")]
    dashboard_listen: Option<SocketAddr>,

    /// The dashboard's token, needed for every page, every action and
    /// `/metrics`. Required with --dashboard-listen; use a long random secret.
    #[arg(
        long,
        env = "TICKMARK_DASHBOARD_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    dashboard_token: Option<SecretString>,

    /// Seconds a connection may take to send a request's headers, counted
    /// from the accept (or from the previous answer: this is also how long
    /// an idle kept-alive connection stays open). Slower ones are closed.
    /// This and the limits below apply to --dashboard-listen too.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_seconds)]
    header_read_timeout: Duration,

    /// Seconds a request (a delivery, a dashboard form) may take to send its
    /// whole body, after its headers. Slower ones get 408 and are closed.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_seconds)]
    body_read_timeout: Duration,

    /// Seconds an answer may wait for the client to read it (counted while
    /// the socket takes nothing). A client that pipelines requests and never
    /// reads the answers is closed then.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_seconds)]
    write_timeout: Duration,

    /// Most requests answered on one connection; the last answer closes it.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_requests_per_connection)]
    max_requests_per_connection: usize,

    /// Most connections open at once. At the cap a new connection takes the
    /// place of an idle one (of the client holding the most first); with
    /// none idle it is answered 503 and closed at once. Keep it below the
    /// open-file limit (`ulimit -n`).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections)]
    max_connections: usize,

    /// Most connections open at once from one client address (an IPv6 /64
    /// counts as one); beyond it the client's own idle connection makes
    /// room, else 503 and close. Behind a reverse proxy every connection is
    /// the proxy's: set it to --max-connections there.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections_per_address)]
    max_connections_per_address: usize,

    /// Seconds a connection may stay open; then it is closed after its
    /// request in progress (at once if idle).
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_seconds)]
    max_connection_age: Duration,

    /// Most deliveries handled at once; more are answered 503 with
    /// Retry-After at once.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_in_flight)]
    max_in_flight: usize,

    /// Largest delivery body accepted, in bytes; larger ones get 413.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BODY_LIMIT)]
    body_limit: usize,

    /// Serve `/metrics` on --dashboard-listen without the token, for a
    /// scraper on a private network that cannot send one (the metrics show
    /// counts and names, never payloads; the pages stay private).
    #[arg(long, requires = "dashboard_listen")]
    metrics_public: bool,

    /// Stripe's secret or restricted key (read access to events). With it,
    /// a reconciler beside the worker pulls from `GET /v1/events` what the
    /// receiver missed (Stripe gives up after 3 days), every
    /// --reconcile-every, one process of the fleet at a time
    /// (docs/reconcile.md).
    #[arg(
        long,
        env = "STRIPE_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    stripe_api_key: Option<SecretString>,

    /// Seconds between two reconcile runs (with up to a tenth more at random).
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = parse_seconds)]
    reconcile_every: Duration,

    /// Another address for Stripe's API (a proxy, a test server).
    #[arg(long, value_name = "URL")]
    stripe_api_base: Option<String>,
}

/// A number of seconds (`10`, `0.5`), positive and at most a day.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds (e.g. 10 or 0.5)"))?;
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        return Err(format!(
            "`{text}`: give more than 0 and at most 86400 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[tokio::main]
async fn main() -> ExitCode {
    let _logging = tickmark_examples::logging::log_to_stderr("payments", "info,sqlx=warn");
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("payments: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let dashboard_token = match (
        &args.dashboard_listen,
        args.dashboard_token.as_ref().map(SecretString::expose),
    ) {
        (Some(_), None | Some("")) => {
            return Err(
                "--dashboard-listen needs --dashboard-token (or TICKMARK_DASHBOARD_TOKEN)".into(),
            )
        }
        (_, token) => token.map(str::to_owned),
    };
    std::fs::create_dir_all(&args.out_dir).map_err(|e| {
        format!(
            "cannot create the invoice folder {}: {e}",
            args.out_dir.display()
        )
    })?;
    let (store, _app_db) = payments::open(&args.database_url).await.map_err(|e| {
        format!(
            "cannot open the database {}: {e}",
            tickmark::redact_url(&args.database_url)
        )
    })?;
    let settings = Settings {
        receipt_url: args.receipt_url.clone(),
        out_dir: args.out_dir.clone(),
        render_for: Duration::from_secs(args.render_secs),
        ..Settings::default()
    };
    // Payloads and outputs sealed at rest when TICKMARK_KEYS is set
    // (docs/privacy.md); checked against the database before it listens.
    let privacy = tickmark::privacy::Privacy::from_env().map_err(|e| e.to_string())?;
    let engine = Engine::new(store, payments::handlers())
        .map_err(|e| format!("invalid handlers: {e}"))?
        .with_privacy(privacy)
        .with_resource(settings)
        .with_resource(ReceiptClient::new());
    engine.check_keys().await.map_err(|e| e.to_string())?;

    let mut limits = Limits::default();
    limits.header_read_timeout = args.header_read_timeout;
    limits.body_read_timeout = args.body_read_timeout;
    limits.write_timeout = args.write_timeout;
    limits.max_requests_per_connection = args.max_requests_per_connection;
    limits.max_connections = args.max_connections;
    limits.max_connections_per_address = args.max_connections_per_address;
    limits.max_connection_age = args.max_connection_age;
    limits.max_in_flight = args.max_in_flight;
    let mut receiver = Receiver::new(engine.clone())
        .limits(limits)
        .body_limit(args.body_limit);
    if let Some(url) = args.public_url.clone() {
        receiver = receiver.public_base_url(url);
    }
    let (receiver, setup) = payments::mount_sources(receiver, |name| std::env::var(name).ok())
        .map_err(|e| e.to_string())?;
    for source in &setup {
        match source {
            SourceSetup::On { name, secrets } => {
                tracing::info!(source = name, secrets, "source on: POST /hooks/{name}")
            }
            SourceSetup::Off { name, variable } => {
                tracing::warn!(
                    source = name,
                    "source off: set {variable} to receive /hooks/{name}"
                )
            }
        }
    }
    if setup.iter().all(|s| matches!(s, SourceSetup::Off { .. })) {
        tracing::warn!("no source is on: every /hooks/ path answers 404 (see --help)");
    }

    let listener = tickmark::serve::bind(args.listen, &limits)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(
        database = %tickmark::redact_url(&args.database_url),
        receipts = args.receipt_url.as_ref().map(ToString::to_string).unwrap_or_else(|| "skipped".into()),
        out_dir = %args.out_dir.display(),
        render_secs = args.render_secs,
        "payments ready"
    );
    // The dashboard and /metrics, on their own (private) address.
    let ops_listener = match args.dashboard_listen {
        Some(ops_addr) => Some(
            tickmark::serve::bind(ops_addr, &limits)
                .await
                .map_err(|e| format!("cannot listen on {ops_addr} (--dashboard-listen): {e}"))?,
        ),
        None => None,
    };
    // One plain line on stdout, for scripts and tests that start the app.
    println!("payments: listening on http://{addr}");
    if let Some(listener) = &ops_listener {
        let ops_addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the dashboard's address: {e}"))?;
        println!("payments: dashboard on http://{ops_addr}/ (metrics at /metrics)");
    }

    let stop_http = CancellationToken::new();
    let stop_worker = CancellationToken::new();
    let worker = engine
        .worker(WorkerConfig::default())
        .map_err(|e| format!("invalid worker settings: {e}"))?;
    let worker = tokio::spawn(worker.run(stop_worker.clone()));
    let reconciler = match &args.stripe_api_key {
        Some(key) => {
            let mut stripe = StripeApi::new(key.expose());
            if let Some(base) = &args.stripe_api_base {
                stripe = stripe
                    .with_base_url(base)
                    .map_err(|e| format!("--stripe-api-base: {e}"))?;
            }
            let reconciler = Reconciler::new(engine.clone())
                .map_err(|e| format!("cannot start the reconciler: {e}"))?
                .stripe("stripe", stripe);
            tracing::info!(every = ?args.reconcile_every, "reconciler on: stripe, from GET /v1/events");
            Some(reconciler.spawn_every(args.reconcile_every, stop_worker.clone()))
        }
        None => {
            tracing::info!("reconciler off: set STRIPE_API_KEY to pull what the receiver missed");
            None
        }
    };
    // On the signal, the HTTP server and the worker stop together: the
    // worker's grace period for running steps runs while the connections
    // finish, not after them (a client holding a connection must not hold
    // the worker's stop back).
    tokio::spawn({
        let (stop_http, stop_worker) = (stop_http.clone(), stop_worker.clone());
        async move {
            shutdown_signal().await;
            tracing::info!(
                "shutting down: no new deliveries; running steps get their grace period"
            );
            stop_http.cancel();
            stop_worker.cancel();
        }
    });

    let ops = ops_listener.map(|listener| {
        let mut dashboard = Dashboard::new(engine.clone()).metrics_public(args.metrics_public);
        if let Some(token) = &dashboard_token {
            dashboard = dashboard.token(token);
        }
        let router = tickmark::ops::router(engine.clone(), Some(dashboard));
        let stop = stop_http.clone().cancelled_owned();
        // The same limits as the receiver's: this port faces browsers and
        // scrapers, and a slow client must not hold it either.
        tokio::spawn(tickmark::serve::serve(listener, router, limits, stop))
    });

    // The server stops accepting on the signal (requests in flight finish,
    // within the shutdown deadline); the worker's graceful shutdown runs at
    // the same time: running steps finish or are released. `serve`
    // applies the connection limits (header-read timeout, connection caps).
    let served = receiver
        .serve(listener, stop_http.clone().cancelled_owned())
        .await;
    stop_http.cancel();
    if let Some(ops) = ops {
        match ops.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("the dashboard server failed: {e}"),
            Err(e) => tracing::warn!("the dashboard server stopped unexpectedly: {e}"),
        }
    }
    stop_worker.cancel();
    let worked = worker.await;
    if let Some(reconciler) = reconciler {
        if let Err(e) = reconciler.await {
            tracing::warn!("the reconciler stopped unexpectedly: {e}");
        }
    }
    served.map_err(|e| format!("the HTTP server failed: {e}"))?;
    match worked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("the worker failed: {e}")),
        Err(e) => return Err(format!("the worker stopped unexpectedly: {e}")),
    }
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_positive_numbers() {
        assert_eq!(parse_seconds("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_seconds(" 0.5 "), Ok(Duration::from_millis(500)));
        for bad in ["", "0", "-1", "ten", "NaN", "inf", "86401"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_limit_flags_default_to_the_receivers_defaults() {
        let args = Args::parse_from(["payments"]);
        let defaults = Limits::default();
        assert_eq!(args.header_read_timeout, defaults.header_read_timeout);
        assert_eq!(args.body_read_timeout, defaults.body_read_timeout);
        assert_eq!(args.write_timeout, defaults.write_timeout);
        assert_eq!(
            args.max_requests_per_connection,
            defaults.max_requests_per_connection
        );
        assert_eq!(args.max_connections, defaults.max_connections);
        assert_eq!(
            args.max_connections_per_address,
            defaults.max_connections_per_address
        );
        assert_eq!(args.max_connection_age, defaults.max_connection_age);
        assert_eq!(args.max_in_flight, defaults.max_in_flight);
        assert_eq!(args.body_limit, DEFAULT_BODY_LIMIT);
    }

    #[test]
    fn debug_of_the_arguments_shows_no_key_or_token() {
        let args = Args::try_parse_from([
            "payments",
            "--stripe-api-key",
            "sk_live_topsecret",
            "--dashboard-listen",
            "127.0.0.1:9090",
            "--dashboard-token",
            "dash_topsecret",
        ])
        .expect("the arguments parse");
        let shown = format!("{args:?} {args:#?}");
        for secret in ["sk_live_topsecret", "dash_topsecret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("stripe_api_key: Some(***)"), "{shown}");
        let key = args.stripe_api_key.expect("given");
        assert_eq!(key.expose(), "sk_live_topsecret");
    }
}
