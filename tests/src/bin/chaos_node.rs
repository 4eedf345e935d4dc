//! `tickmark-chaos-node`: one node of the chaos run (`docs/chaos.md`). It is
//! the `payments` example app — its receiver and its worker, in one process —
//! with the knobs a fault test needs: a short lease, its own port, a render
//! step that works long enough to be killed in the middle.
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_… tickmark-chaos-node --database-url URL --name NAME \
//!     [--listen 127.0.0.1:0] [--receipt-url URL] [--render-ms N] [--lease-ms N] \
//!     [--concurrency N] [--out-dir DIR]
//! ```
//!
//! It prints one line on stdout once it serves, `chaos-node: listening on
//! http://ADDR`, and logs to stderr (`RUST_LOG`, default `info,sqlx=warn`).
//! The engine's own warnings are what the chaos driver counts: `mark refused:
//! the lease was lost; this worker stops`, `lease lost: …`, `lease expired
//! before a heartbeat could renew it; …`, `took over an expired lease: …`,
//! `step failed`. SIGTERM or SIGINT stops it gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use tickmark::{Engine, Receiver, WorkerConfig};
use tickmark_examples::payments::{self, ReceiptClient, ReceiptUrl, Settings};
use tokio_util::sync::CancellationToken;

/// How long a node keeps trying to reach its database at start (it may be
/// restarted while the chaos run has PostgreSQL down).
const CONNECT_FOR: Duration = Duration::from_secs(60);

/// A node of the chaos run: the payments app's receiver and worker.
#[derive(Debug, Parser)]
#[command(name = "tickmark-chaos-node", version)]
struct Args {
    /// `postgres://…` or `sqlite://FILE`, shared by every node.
    #[arg(long)]
    database_url: String,

    /// The worker's name (the lease owner in `tickmark_events`).
    #[arg(long)]
    name: String,

    /// Where the receiver listens; port 0 picks a free one (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    /// Where `send_receipt` POSTs, with its `Idempotency-Key`.
    #[arg(long)]
    receipt_url: Option<ReceiptUrl>,

    /// How long `render_invoice` works, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    render_ms: u64,

    /// The worker's lease, in milliseconds (heartbeat every third of it).
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,

    /// Events run at once by this node's worker.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,

    /// How often the idle worker polls (other processes' inserts on SQLite
    /// wake nobody), in milliseconds.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,

    /// Folder for the rendered invoices.
    #[arg(long, default_value = "invoices")]
    out_dir: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tickmark-chaos-node: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| format!("cannot create {}: {e}", args.out_dir.display()))?;
    let store = open_with_retries(&args.database_url).await?;
    let lease = Duration::from_millis(args.lease_ms);
    let settings = Settings {
        receipt_url: args.receipt_url.clone(),
        receipt_timeout: Duration::from_secs(5),
        out_dir: args.out_dir.clone(),
        render_for: Duration::from_millis(args.render_ms),
    };
    // Sealed at rest when TICKMARK_KEYS is set (the log scan's SQLite run).
    let privacy = tickmark::privacy::Privacy::from_env().map_err(|e| e.to_string())?;
    let engine = Engine::new(store, payments::handlers())
        .map_err(|e| format!("invalid handlers: {e}"))?
        .with_privacy(privacy)
        .with_resource(settings)
        .with_resource(ReceiptClient::new());
    let (receiver, _setup) = payments::mount_sources(Receiver::new(engine.clone()), |name| {
        std::env::var(name).ok()
    })
    .map_err(|e| e.to_string())?;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    let config = WorkerConfig::default()
        .with_name(args.name.clone())
        .with_lease(lease)
        .with_concurrency(args.concurrency)
        .with_poll_every(Duration::from_millis(args.poll_ms))
        .with_grace(Duration::from_secs(5));
    tracing::info!(node = %args.name, %addr, lease_ms = args.lease_ms, render_ms = args.render_ms, "chaos node ready");
    println!("chaos-node: listening on http://{addr}");

    let stop_http = CancellationToken::new();
    let stop_worker = CancellationToken::new();
    let worker = tokio::spawn(
        engine
            .worker(config)
            .expect("valid worker settings")
            .run(stop_worker.clone()),
    );
    tokio::spawn({
        let stop_http = stop_http.clone();
        async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            stop_http.cancel();
        }
    });
    let served = axum::serve(listener, receiver.standalone_router())
        .with_graceful_shutdown(stop_http.clone().cancelled_owned())
        .await;
    stop_worker.cancel();
    let worked = worker.await;
    served.map_err(|e| format!("the HTTP server failed: {e}"))?;
    match worked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("the worker failed: {e}")),
        Err(e) => return Err(format!("the worker stopped unexpectedly: {e}")),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Open the store (and the app's tables), retrying while the database is
/// down: the driver restarts killed nodes whatever the database is doing.
async fn open_with_retries(url: &str) -> Result<std::sync::Arc<dyn tickmark::Store>, String> {
    let started = Instant::now();
    loop {
        match payments::open(url).await {
            Ok((store, _app)) => return Ok(store),
            Err(error) if started.elapsed() < CONNECT_FOR => {
                tracing::warn!(%error, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => return Err(format!("cannot open the database: {error}")),
        }
    }
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
