//! A worker process for the crash and multi-process tests: it runs whatever
//! events the database holds (their plans name the test steps linked in here).
//!
//! ```text
//! tickmark-test-worker --database-url URL [--name NAME] [--lease-ms N]
//!                      [--concurrency N] [--prefetch N] [--claim-batch N]
//!                      [--until-idle] [--probe-url URL]
//! ```
//! `--probe-url` (default: the database URL) is where the probe records
//! what steps did: past the pooler when `--database-url` goes through one.
//! Without `--until-idle` it runs until SIGTERM or SIGINT (graceful shutdown).

use std::time::Duration;

use tickmark::{Engine, Handlers, WorkerConfig};
use tickmark_tests::Probe;
use tokio_util::sync::CancellationToken;

struct Args {
    database_url: String,
    probe_url: Option<String>,
    name: Option<String>,
    lease: Duration,
    concurrency: usize,
    /// Most events claimed ahead (default: `WorkerConfig::with_concurrency`'s).
    prefetch: Option<usize>,
    /// Most events per claim (default: the concurrency).
    claim_batch: Option<u32>,
    until_idle: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        database_url: String::new(),
        probe_url: None,
        name: None,
        lease: Duration::from_secs(2),
        concurrency: 4,
        prefetch: None,
        claim_batch: None,
        until_idle: false,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--database-url" => args.database_url = value()?,
            "--name" => args.name = Some(value()?),
            "--probe-url" => args.probe_url = Some(value()?),
            "--lease-ms" => {
                args.lease =
                    Duration::from_millis(value()?.parse().map_err(|e| format!("--lease-ms: {e}"))?)
            }
            "--concurrency" => {
                args.concurrency = value()?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?
            }
            "--prefetch" => {
                args.prefetch = Some(value()?.parse().map_err(|e| format!("--prefetch: {e}"))?)
            }
            "--claim-batch" => {
                args.claim_batch = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--claim-batch: {e}"))?,
                )
            }
            "--until-idle" => args.until_idle = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.database_url.is_empty() {
        return Err("--database-url is required".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Traces to a collector when a test asks (OTEL_EXPORTER_OTLP_ENDPOINT).
    let _traces = tickmark_tests::db::init_tracing_and_traces("tickmark-test-worker");
    let args = parse_args()?;
    let store = tickmark::connect(&args.database_url).await?;
    let probe = Probe::connect(args.probe_url.as_deref().unwrap_or(&args.database_url)).await;
    let engine = Engine::new(store, Handlers::new())?.with_resource(probe);
    let mut config = WorkerConfig::default()
        .with_lease(args.lease)
        .with_concurrency(args.concurrency)
        .with_poll_every(Duration::from_millis(200))
        .with_grace(Duration::from_secs(2));
    if let Some(name) = args.name {
        config = config.with_name(name);
    }
    if let Some(prefetch) = args.prefetch {
        config.prefetch = prefetch;
    }
    if let Some(claim_batch) = args.claim_batch {
        config.claim_batch = claim_batch;
    }
    let worker = engine.worker(config).expect("valid worker settings");
    if args.until_idle {
        let stats = worker.run_until_idle().await?;
        println!("{}", serde_json::to_string(&stats)?);
        return Ok(());
    }
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        signal.cancel();
    });
    worker.run(shutdown).await?;
    Ok(())
}
