//! What PgBouncer costs tickmark: drain throughput and dispatch latency
//! directly, and through a PgBouncer of the run's own in transaction mode
//! (with `listen_url`, and polling without it) and in session mode, in one
//! run on the shared PostgreSQL server (docs/deploying.md).
//!
//! ```text
//! cargo run -p tickmark-bench --bin pooler_bench -- [--events N] [--steps K]
//!                                                   [--concurrency C] [--samples S]
//! ```
//!
//! Each mode gets a fresh schema. Throughput: `N` events of `K` no-op steps
//! accepted, then drained by one worker at concurrency `C`. Dispatch: `S`
//! events accepted one at a time on an idle worker at the default polling
//! interval (2 s), accept to first step started. Needs PgBouncer
//! (`scripts/setup`). Prints a table, then one JSON line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tickmark::{Engine, Handler, Handlers, NewEvent, Step, StepContext, StepResult, WorkerConfig};
use tickmark_bench::bench::dispatch::{self, Stamp, StartTimes};
use tickmark_bench::bench::stats::percentile_ms;
use tickmark_tests::pgbouncer::PoolMode;
use tickmark_tests::TestDb;
use tokio_util::sync::CancellationToken;

/// A step that does nothing: what is measured is the store's cost.
#[derive(Debug, Serialize, Deserialize)]
struct Noop;

#[typetag::serde(name = "pooler_bench.noop")]
#[async_trait::async_trait]
impl Step for Noop {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Ok(serde_json::Value::Null)
    }
}

struct Args {
    events: usize,
    steps: usize,
    concurrency: usize,
    samples: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        events: 2000,
        steps: 3,
        concurrency: 16,
        samples: 100,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let value: usize = iter
            .next()
            .ok_or(format!("{flag} needs a value"))?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--events" => args.events = value,
            "--steps" => args.steps = value,
            "--concurrency" => args.concurrency = value,
            "--samples" => args.samples = value,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

#[derive(Debug, Serialize)]
struct Figures {
    mode: &'static str,
    events_per_s: f64,
    dispatch_p50_ms: f64,
    dispatch_p99_ms: f64,
}

async fn database(mode: &str) -> Option<TestDb> {
    match mode {
        "direct" => TestDb::postgres().await,
        "transaction+listen_url" => {
            TestDb::through_pgbouncer(PoolMode::Transaction, true, &[]).await
        }
        "transaction, polling" => {
            TestDb::through_pgbouncer(PoolMode::Transaction, false, &[]).await
        }
        "session" => TestDb::through_pgbouncer(PoolMode::Session, false, &[]).await,
        _ => None,
    }
}

async fn throughput(db: &TestDb, args: &Args) -> Result<f64, Box<dyn std::error::Error>> {
    let mut handler = Handler::new();
    for n in 0..args.steps {
        handler = handler.named_step(format!("s{n}"), Noop);
    }
    let engine = Engine::new(
        db.store.clone(),
        Handlers::new().on("bench", "tick", handler),
    )?;
    let engine = Arc::new(engine);
    // Accepted concurrently, as a receiver would, so accepts share commits.
    let mut accepts = tokio::task::JoinSet::new();
    for chunk in 0..16 {
        let engine = Arc::clone(&engine);
        let events = args.events;
        accepts.spawn(async move {
            for n in (chunk..events).step_by(16) {
                engine
                    .accept(NewEvent::with_id(
                        "bench",
                        format!("evt_{n}"),
                        "tick",
                        serde_json::json!({}),
                    ))
                    .await?;
            }
            Ok::<_, tickmark::StoreError>(())
        });
    }
    while let Some(accepted) = accepts.join_next().await {
        accepted??;
    }
    let started = Instant::now();
    let stats = engine
        .worker(WorkerConfig::default().with_concurrency(args.concurrency))?
        .run_until_idle()
        .await?;
    let elapsed = started.elapsed();
    if stats.events_done != args.events as u64 {
        return Err(format!("drained {} of {} events", stats.events_done, args.events).into());
    }
    Ok(args.events as f64 / elapsed.as_secs_f64())
}

async fn dispatch_latency(
    db: &TestDb,
    samples: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (times, mut started) = StartTimes::channel();
    let engine = Engine::new(
        db.store.clone(),
        Handlers::new().on("dispatch", "ping", Handler::new().step(Stamp)),
    )?
    .with_resource(times);
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(
        engine
            .worker(WorkerConfig::default().with_name("idle"))?
            .run(shutdown.clone()),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies =
        dispatch::measure(&engine, &mut started, samples, Duration::from_millis(20)).await?;
    shutdown.cancel();
    worker.await??;
    Ok((
        percentile_ms(&mut latencies, 50.0),
        percentile_ms(&mut latencies, 99.0),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tickmark_tests::db::init_tracing();
    let args = parse_args()?;
    let mut all = Vec::new();
    for mode in [
        "direct",
        "transaction+listen_url",
        "transaction, polling",
        "session",
    ] {
        eprintln!("[{mode}]");
        let polling = mode == "transaction, polling";
        let events_per_s = if polling {
            // The same statements as with listen_url: only wake-ups differ.
            f64::NAN
        } else {
            let db = database(mode)
                .await
                .ok_or("PostgreSQL or PgBouncer is missing")?;
            throughput(&db, &args).await?
        };
        let db = database(mode)
            .await
            .ok_or("PostgreSQL or PgBouncer is missing")?;
        // Polling waits up to the 2 s interval per sample: fewer of them.
        let samples = if polling {
            args.samples.min(10)
        } else {
            args.samples
        };
        let (p50, p99) = dispatch_latency(&db, samples).await?;
        all.push(Figures {
            mode,
            events_per_s,
            dispatch_p50_ms: p50,
            dispatch_p99_ms: p99,
        });
    }
    let direct = all[0].events_per_s;
    println!(
        "{} events x {} no-op steps, concurrency {} ({} build)",
        args.events,
        args.steps,
        args.concurrency,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!(
        "  {:<24} {:>10} {:>8} {:>10} {:>10}",
        "mode", "events/s", "ratio", "p50 ms", "p99 ms"
    );
    for f in &all {
        println!(
            "  {:<24} {:>10.0} {:>8.2} {:>10.2} {:>10.2}",
            f.mode,
            f.events_per_s,
            f.events_per_s / direct,
            f.dispatch_p50_ms,
            f.dispatch_p99_ms
        );
    }
    println!("{}", serde_json::to_string(&all)?);
    Ok(())
}
