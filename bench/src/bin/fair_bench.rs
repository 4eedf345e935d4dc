//! One tenant's flood against the other tenants' steady deliveries (issue
//! 44): how long do the quiet tenants wait while the loud one drains?
//!
//! ```text
//! cargo run --release -p tickmark-bench --bin fair_bench -- \
//!     [--database-url URL] [--backlog 50000] [--tenants 10] [--rate 10] \
//!     [--step-ms 20] [--idle-secs 30] [--flood-secs 60]
//! ```
//!
//! A Stripe Connect platform: every event carries its connected account
//! (`"account": "acct_…"`), and its one step takes `--step-ms` (a remote
//! call). One worker at the default settings (`WorkerConfig::default()`),
//! the receiver on loopback with a Stripe source, and `--tenants` quiet
//! tenants (B, C, …) each posting signed deliveries over HTTP at `--rate`
//! a second, open loop, as a provider does.
//!
//! 1. **Idle**: the quiet tenants alone for `--idle-secs`: their latency
//!    with nothing in the way.
//! 2. **Flood**: tenant A's `--backlog` events accepted first (directly,
//!    `Engine::accept`), then the quiet tenants for `--flood-secs` while A
//!    drains.
//!
//! A quiet event's latency runs from its acceptance (`received_at`) to its
//! final mark (`finished_at`), both the database's clock. Reported per
//! phase: the quiet tenants' p50/p99/max, A's drain rate while the quiet
//! tenants sent, and everything finished per second. A table, then one JSON
//! line. Speed is reported, never a reason to fail; an event lost or not
//! finished is (exit 1).
//!
//! Default: a fresh SQLite file in a temp folder. A PostgreSQL URL gets a
//! fresh schema (`tickmark_bench_<pid>_fair`), dropped afterwards.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use clap::Parser;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::receiver::providers::Stripe;
use tickmark::{
    Engine, Handler, Handlers, NewEvent, Receiver, Step, StepContext, StepResult, Store,
    WorkerConfig,
};
use tickmark_bench::bench::database::ScratchDatabase;
use tickmark_bench::bench::stats::percentile_ms;
use tickmark_examples::stripe_signature::stripe_signature;
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_fair_bench";
const SOURCE: &str = "stripe";
const KIND: &str = "invoice.paid";
/// The loud tenant.
const LOUD: &str = "acct_A";

/// One tenant's flood against the others' steady deliveries.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Database (`sqlite://…` or `postgres://…`). Default: a new SQLite file
    /// in a temp folder. A PostgreSQL URL runs in a fresh schema, dropped
    /// afterwards.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Tenant A's events, queued before the flood phase
    #[arg(long, default_value_t = 50_000)]
    backlog: usize,
    /// Quiet tenants (B, C, …)
    #[arg(long, default_value_t = 10)]
    tenants: usize,
    /// Deliveries a second from each quiet tenant
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// How long each event's one step takes, in milliseconds
    #[arg(long, default_value_t = 20)]
    step_ms: u64,
    /// How long the quiet tenants send with nothing else queued
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,
    /// How long the quiet tenants send while A drains
    #[arg(long, default_value_t = 60)]
    flood_secs: u64,
    /// Claim in fair shares per tenant (`Handler::tenant_key("/account")`);
    /// without it, in due order
    #[arg(long)]
    fair: bool,
    /// How long to wait, after sending, for every quiet event to finish
    #[arg(long, default_value_t = 900)]
    finish_timeout_secs: u64,
}

/// Events finished by each tenant in this process (an engine resource).
#[derive(Debug, Clone, Default)]
struct FinishedBy(Arc<Mutex<HashMap<String, u64>>>);

impl FinishedBy {
    fn of(&self, tenant: &str) -> u64 {
        self.0
            .lock()
            .expect("finished lock")
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }

    fn total(&self) -> u64 {
        self.0.lock().expect("finished lock").values().sum()
    }
}

/// Waits `ms` (a remote call), then counts the event as its tenant's.
#[derive(Debug, Serialize, Deserialize)]
struct RemoteCall {
    ms: u64,
}

#[typetag::serde(name = "fair_bench.remote_call")]
#[async_trait::async_trait]
impl Step for RemoteCall {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        let tenant = ctx.event().payload["account"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        *ctx.resource::<FinishedBy>()?
            .0
            .lock()
            .expect("finished lock")
            .entry(tenant)
            .or_default() += 1;
        Ok(json!({}))
    }
}

/// A Stripe Connect event of `account`.
fn body(account: &str, id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "object": "event",
        "type": KIND,
        "account": account,
        "data": {"object": {"id": format!("in_{id}"), "amount_paid": 1200, "currency": "usd"}}
    })
}

/// The quiet tenants' accounts: `acct_B`, `acct_C`, … (`acct_q25` on).
fn quiet_tenants(count: usize) -> Vec<String> {
    (0..count)
        .map(|n| match u8::try_from(n) {
            Ok(n) if n < 25 => format!("acct_{}", char::from(b'B' + n)),
            _ => format!("acct_q{n}"),
        })
        .collect()
}

/// Post `rate` deliveries a second for each tenant until `stop`; the ids
/// acknowledged.
async fn send(
    addr: SocketAddr,
    tenants: Vec<String>,
    rate: f64,
    phase: &str,
    stop: CancellationToken,
) -> Result<Vec<String>, String> {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let mut senders = Vec::new();
    for tenant in tenants {
        let (client, phase, stop) = (client.clone(), phase.to_owned(), stop.clone());
        senders.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut requests = Vec::new();
            for n in 0.. {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let id = format!("evt_{phase}_{tenant}_{n}");
                let client = client.clone();
                let payload = body(&tenant, &id).to_string();
                requests.push(tokio::spawn(async move {
                    deliver(&client, addr, &payload).await.map(|()| id)
                }));
            }
            let mut acknowledged = Vec::new();
            for request in requests {
                acknowledged.push(request.await.map_err(|e| e.to_string())??);
            }
            Ok::<_, String>(acknowledged)
        }));
    }
    let mut ids = Vec::new();
    for sender in senders {
        ids.extend(sender.await.map_err(|e| e.to_string())??);
    }
    Ok(ids)
}

/// One delivery, retried (as a provider retries) until a 2xx, at most 5 times.
async fn deliver(
    client: &Client<HttpConnector, Body>,
    addr: SocketAddr,
    payload: &str,
) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let signature = stripe_signature(SECRET, chrono::Utc::now().timestamp(), payload);
        let request = Request::post(format!("http://{addr}/hooks/{SOURCE}"))
            .header("content-type", "application/json")
            .header("stripe-signature", signature)
            .body(Body::from(payload.to_owned()))
            .map_err(|e| e.to_string())?;
        match client.request(request).await {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => last = format!("answered {}", response.status()),
            Err(error) => last = error.to_string(),
        }
    }
    Err(format!("a delivery was never acknowledged: {last}"))
}

/// Accept-to-done of each of `ids`, once all have finished (or the timeout).
async fn latencies(
    store: &dyn Store,
    ids: &[String],
    timeout: Duration,
) -> Result<Vec<Duration>, String> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        loop {
            let record = store
                .event_find(SOURCE, id)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("{id} was acknowledged but is not in the inbox"))?;
            if let Some(finished_at) = record.finished_at {
                let waited = finished_at - record.event.received_at;
                out.push(waited.to_std().unwrap_or_default());
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("{id} did not finish within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(out)
}

/// What one phase measured.
#[derive(Debug, Serialize)]
struct PhaseFigures {
    phase: &'static str,
    quiet_events: usize,
    quiet_p50_ms: f64,
    quiet_p99_ms: f64,
    quiet_max_ms: f64,
    /// A's events finished a second while the quiet tenants sent (flood only).
    loud_drain_per_s: Option<f64>,
    /// Every event finished a second while the quiet tenants sent.
    finished_per_s: f64,
}

struct Bench {
    engine: Engine,
    store: Arc<dyn Store>,
    addr: SocketAddr,
    finished: FinishedBy,
}

impl Bench {
    async fn phase(
        &self,
        args: &Args,
        phase: &'static str,
        secs: u64,
    ) -> Result<PhaseFigures, String> {
        let tenants = quiet_tenants(args.tenants);
        let (loud_before, total_before) = (self.finished.of(LOUD), self.finished.total());
        let stop = CancellationToken::new();
        let sending = tokio::spawn(send(self.addr, tenants, args.rate, phase, stop.clone()));
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.cancel();
        let elapsed = started.elapsed().as_secs_f64();
        let (loud_after, total_after) = (self.finished.of(LOUD), self.finished.total());
        let ids = sending.await.map_err(|e| e.to_string())??;
        let mut waited = latencies(
            self.store.as_ref(),
            &ids,
            Duration::from_secs(args.finish_timeout_secs),
        )
        .await?;
        let figures = PhaseFigures {
            phase,
            quiet_events: ids.len(),
            quiet_p50_ms: percentile_ms(&mut waited, 50.0),
            quiet_p99_ms: percentile_ms(&mut waited, 99.0),
            quiet_max_ms: percentile_ms(&mut waited, 100.0),
            loud_drain_per_s: (loud_after > loud_before)
                .then(|| (loud_after - loud_before) as f64 / elapsed),
            finished_per_s: (total_after - total_before) as f64 / elapsed,
        };
        tracing::info!(?figures, "phase done");
        Ok(figures)
    }

    /// Queue tenant A's backlog, 16 accepts at a time.
    async fn queue_backlog(&self, backlog: usize) -> Result<(), String> {
        let accepters = 16;
        let mut tasks = Vec::new();
        for a in 0..accepters {
            let engine = self.engine.clone();
            tasks.push(tokio::spawn(async move {
                for n in (a..backlog).step_by(accepters) {
                    let id = format!("evt_backlog_{n:07}");
                    engine
                        .accept(NewEvent::with_id(SOURCE, &id, KIND, body(LOUD, &id)))
                        .await?;
                }
                Ok::<_, tickmark::StoreError>(())
            }));
        }
        for task in tasks {
            task.await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

async fn run(args: &Args, url: &str) -> Result<Vec<PhaseFigures>, String> {
    let store = tickmark::connect(url).await.map_err(|e| e.to_string())?;
    let finished = FinishedBy::default();
    let mut handler = Handler::new().named_step("remote_call", RemoteCall { ms: args.step_ms });
    if args.fair {
        handler = handler.tenant_key("/account");
    }
    let handlers = Handlers::new().on(SOURCE, KIND, handler);
    let engine = Engine::new(store.clone(), handlers)
        .map_err(|e| e.to_string())?
        .with_resource(finished.clone());
    let router = Receiver::new(engine.clone())
        .source(SOURCE, Stripe::new([SECRET]).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?
        .standalone_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let stop_server = CancellationToken::new();
    let server = {
        let stop = stop_server.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        })
    };
    let bench = Bench {
        engine: engine.clone(),
        store,
        addr,
        finished,
    };
    let start_worker = || -> Result<_, String> {
        let stop = CancellationToken::new();
        let worker = engine
            .worker(WorkerConfig::default())
            .map_err(|e| e.to_string())?;
        Ok((stop.clone(), tokio::spawn(worker.run(stop))))
    };

    let (stop, worker) = start_worker()?;
    let idle = bench.phase(args, "idle", args.idle_secs).await?;
    stop.cancel();
    worker
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;

    let queued = Instant::now();
    bench.queue_backlog(args.backlog).await?;
    tracing::info!(
        events = args.backlog,
        secs = queued.elapsed().as_secs_f64(),
        "tenant A's backlog queued"
    );
    let (stop, worker) = start_worker()?;
    let flood = bench.phase(args, "flood", args.flood_secs).await?;
    stop.cancel();
    worker
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    stop_server.cancel();
    let _ = server.await;
    Ok(vec![idle, flood])
}

fn print(args: &Args, url: &str, figures: &[PhaseFigures]) {
    let backend = if url.starts_with("postgres") {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!(
        "\n{backend}, fair share {}, WorkerConfig::default(), one {} ms step; {} quiet tenants \
         at {}/s each; tenant A's backlog {}",
        if args.fair { "on" } else { "off" },
        args.step_ms,
        args.tenants,
        args.rate,
        args.backlog
    );
    println!(
        "{:<8} {:>8} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "phase", "quiet", "p50 ms", "p99 ms", "max ms", "A drained/s", "finished/s"
    );
    for f in figures {
        println!(
            "{:<8} {:>8} {:>12.0} {:>12.0} {:>12.0} {:>14} {:>14.0}",
            f.phase,
            f.quiet_events,
            f.quiet_p50_ms,
            f.quiet_p99_ms,
            f.quiet_max_ms,
            f.loud_drain_per_s
                .map_or_else(|| "-".to_owned(), |rate| format!("{rate:.0}")),
            f.finished_per_s
        );
    }
    if let [idle, flood] = figures {
        println!(
            "quiet p99 while A drains ÷ idle p99: {:.1}×",
            flood.quiet_p99_ms / idle.quiet_p99_ms.max(1.0)
        );
    }
    println!(
        "{}",
        json!({"backend": backend, "fair": args.fair, "args": format!("{args:?}"), "phases": figures})
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tickmark=warn".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let scratch = match ScratchDatabase::create(args.database_url.as_deref(), "fair").await {
        Ok(scratch) => scratch,
        Err(error) => {
            eprintln!("fair_bench: {error}");
            return ExitCode::from(2);
        }
    };
    let outcome = run(&args, &scratch.url).await;
    let url = scratch.url.clone();
    if let Err(error) = scratch.remove().await {
        eprintln!("fair_bench: could not remove the scratch database: {error}");
    }
    match outcome {
        Ok(figures) => {
            print(&args, &url, &figures);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("fair_bench: {error}");
            ExitCode::FAILURE
        }
    }
}
