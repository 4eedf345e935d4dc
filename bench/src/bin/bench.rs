//! How fast is tickmark on your database, against the database's own limit?
//!
//! ```text
//! cargo run --release -p tickmark-bench --bin bench -- \
//!     [--database-url URL] [--events N] [--steps K] [--workers C] [--backlog B]
//! ```
//!
//! Default: a fresh SQLite file in a temp folder. On PostgreSQL every phase
//! works in a fresh schema, dropped afterwards. Phases:
//!
//! 1. accept `max(N, B)` events (the backlog), then drain `N` of them with `K`
//!    no-op steps at concurrency `C`: `events_per_s`, `steps_per_s`;
//! 2. the **naive ceiling** in the same run, same database, same concurrency:
//!    the plain SQL a careful engineer writes by hand (claim one with `FOR
//!    UPDATE SKIP LOCKED` / `BEGIN IMMEDIATE`, one commit per step, one to
//!    finish), and the rate of one-row insert commits;
//! 3. dispatch latency (accept → first step started) on an idle engine;
//! 4. idle CPU of 4 idle workers over `--idle-secs`;
//! 5. peak RSS of this process;
//! 6. per drained event, this process's CPU time and, on PostgreSQL, what
//!    the server spent: WAL bytes and (when the server runs on this
//!    machine) its processes' CPU time.
//!
//! It prints a table and, last, one JSON line. Ratios are what to compare
//! across machines; absolute figures depend on the machine and its load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use tickmark::{Engine, Handler, Handlers, NewEvent, Step, StepContext, StepResult, WorkerConfig};
use tickmark_bench::bench::database::ScratchDatabase;
use tickmark_bench::bench::dispatch::{self, Stamp, StartTimes};
use tickmark_bench::bench::phases::Phases;
use tickmark_bench::bench::server_cost::{self, ServerCost, ServerSnapshot, WalRecords};
use tickmark_bench::bench::{naive, process, stats};
use tokio_util::sync::CancellationToken;

/// Measure tickmark's throughput and latency against the database's own ceiling.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Database to measure (`sqlite://…` or `postgres://…`). Default: a new
    /// SQLite file in a temp folder. PostgreSQL phases run in fresh schemas.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Events to drain (timed).
    #[arg(long, default_value_t = 1000)]
    events: usize,
    /// No-op steps per event.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Events run concurrently (the worker's concurrency, and the naive
    /// ceiling's number of clients).
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Events queued before draining starts (at least `--events`).
    #[arg(long, default_value_t = 0)]
    backlog: usize,
    /// How long to measure idle CPU (0 skips it).
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,
    /// Dispatch-latency samples (0 skips them).
    #[arg(long, default_value_t = 200)]
    dispatch_samples: usize,
    /// Skip the naive ceiling.
    #[arg(long)]
    no_naive: bool,
    /// Print where the drain's time went: the engine's `claim`, `event`,
    /// `step` and `mark` spans, summed (adds the cost of debug spans).
    #[arg(long)]
    phases: bool,
    /// PostgreSQL: print the WAL the drain wrote by record type, in bytes
    /// per event (the `pg_walinspect` extension; needs a superuser).
    #[arg(long)]
    wal_records: bool,
    /// Export traces (tickmark's `otel` feature at the defaults: the accept
    /// and every step attempt, a span each) to a loopback collector that
    /// throws them away, started in this process: what exporting costs.
    #[arg(long, conflicts_with = "phases")]
    otel: bool,
    /// Log as an application does, at `INFO` (formatted, then thrown away):
    /// the baseline `--otel` adds to, since an application that exports
    /// traces logs too.
    #[arg(long, conflicts_with = "phases")]
    logs: bool,
    /// Seal every payload and output at rest (`TICKMARK_KEYS` set, with a
    /// fixed key made for the bench: docs/privacy.md): what encryption costs.
    #[arg(long)]
    encrypt: bool,
}

/// The key `--encrypt` seals with (32 bytes of 0..31; a bench's, not a secret).
const BENCH_KEYS: &str = "bench:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// A step that does nothing: what is measured is the engine's own cost.
#[derive(Debug, Serialize, Deserialize)]
struct Noop;

#[typetag::serde(name = "bench.noop")]
#[async_trait::async_trait]
impl Step for Noop {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Ok(serde_json::Value::Null)
    }
}

#[derive(Debug, Default, Serialize)]
struct Figures {
    backend: String,
    /// `--encrypt`: payloads and outputs sealed at rest.
    encrypted: bool,
    events: usize,
    steps: usize,
    workers: usize,
    backlog: usize,
    accept_per_s: f64,
    events_per_s: f64,
    steps_per_s: f64,
    naive_events_per_s: f64,
    ratio_to_naive: f64,
    insert_commits_per_s: f64,
    dispatch_p50_ms: f64,
    dispatch_p99_ms: f64,
    idle_cpu_pct: f64,
    rss_mb: f64,
    /// PostgreSQL: WAL bytes written per drained event (server-wide).
    db_wal_bytes_per_event: f64,
    /// PostgreSQL on this machine: the server's CPU µs per drained event.
    db_cpu_us_per_event: f64,
    /// This process's CPU µs per drained event (the engine and its driver;
    /// SQLite's own work included, as it runs in this process).
    engine_cpu_us_per_event: f64,
    /// `--otel`: spans the collector took during the drain, and spans
    /// dropped because the export queue was full.
    spans_exported: u64,
    spans_dropped: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let phases = args.phases.then(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let phases = Phases::default();
        let subscriber = tracing_subscriber::registry().with(
            phases.layer().with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("tickmark", tracing::Level::DEBUG),
            ),
        );
        tracing::subscriber::set_global_default(subscriber).map(|()| phases)
    });
    let phases = phases.transpose()?;
    let traces = if args.otel {
        let sink = tickmark_bench::bench::otlp_sink::start()?;
        Some(tickmark::otel::Traces::to_collector(
            &sink,
            "tickmark-bench",
        )?)
    } else {
        None
    };
    if args.otel || args.logs {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let logs = args.logs.then(|| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_ansi(false)
                .with_filter(tracing::level_filters::LevelFilter::INFO)
        });
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry()
                .with(logs)
                .with(traces.as_ref().map(tickmark::otel::Traces::layer)),
        )?;
    }
    let base = args.database_url.as_deref();
    let backlog = args.backlog.max(args.events);
    let mut figures = Figures {
        encrypted: args.encrypt,
        events: args.events,
        steps: args.steps,
        workers: args.workers,
        backlog,
        ..Figures::default()
    };

    eprintln!(
        "[1/4] throughput: {backlog} queued, draining {} with {} no-op steps at concurrency {}",
        args.events, args.steps, args.workers
    );
    let db = ScratchDatabase::create(base, "drain").await?;
    figures.backend = if db.is_postgres() {
        "postgres"
    } else {
        "sqlite"
    }
    .to_owned();
    let drained = drain(&args, &db.url, backlog, phases.as_ref()).await;
    db.remove().await?;
    let drained = drained?;
    figures.accept_per_s = drained.accept_per_s;
    figures.events_per_s = drained.events_per_s;
    if let Some(cost) = drained.server {
        figures.db_wal_bytes_per_event = cost.wal_bytes_per(args.events);
        figures.db_cpu_us_per_event = cost.cpu_us_per(args.events);
    }
    figures.steps_per_s = drained.events_per_s * args.steps as f64;
    figures.engine_cpu_us_per_event =
        drained.engine_cpu.as_secs_f64() * 1e6 / args.events.max(1) as f64;
    figures.rss_mb = process::peak_rss_mb();
    if let Some(traces) = &traces {
        traces.flush()?;
        let counts = traces.counts();
        figures.spans_exported = counts.exported();
        figures.spans_dropped = counts.dropped();
    }

    if !args.no_naive {
        eprintln!(
            "[2/4] naive ceiling: the same work in hand-written SQL, {} clients",
            args.workers
        );
        let db = ScratchDatabase::create(base, "naive").await?;
        let naive_rate = naive::events_per_s(&db.url, args.events, args.steps, args.workers).await;
        let inserts =
            naive::insert_commits_per_s(&db.url, (args.events * 2).max(2000), args.workers).await;
        db.remove().await?;
        figures.naive_events_per_s = naive_rate.map_err(|e| e.to_string())?;
        figures.insert_commits_per_s = inserts.map_err(|e| e.to_string())?;
        figures.ratio_to_naive =
            figures.events_per_s / figures.naive_events_per_s.max(f64::MIN_POSITIVE);
    }

    eprintln!("[3/4] dispatch latency and idle CPU on an idle engine");
    let db = ScratchDatabase::create(base, "idle").await?;
    let idle = idle_figures(&args, &db.url).await;
    db.remove().await?;
    let (p50, p99, idle_cpu) = idle?;
    figures.dispatch_p50_ms = p50;
    figures.dispatch_p99_ms = p99;
    figures.idle_cpu_pct = idle_cpu;
    figures.rss_mb = figures.rss_mb.max(process::peak_rss_mb());

    eprintln!("[4/4] done");
    print_table(&figures);
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

/// What the drain measured.
struct Drained {
    accept_per_s: f64,
    events_per_s: f64,
    /// What the PostgreSQL server spent during the drain.
    server: Option<ServerCost>,
    /// This process's CPU time during the drain.
    engine_cpu: Duration,
}

/// Accept the backlog, then drain `--events` of it.
async fn drain(
    args: &Args,
    url: &str,
    backlog: usize,
    phases: Option<&Phases>,
) -> Result<Drained, Box<dyn std::error::Error>> {
    let store = tickmark::connect(url).await?;
    let mut handler = Handler::new();
    for n in 0..args.steps {
        handler = handler.named_step(format!("noop_{n}"), Noop);
    }
    let mut engine = Engine::new(store, Handlers::new().on("bench", "tick", handler))?;
    if args.encrypt {
        let keys = tickmark::privacy::Keyring::parse(BENCH_KEYS)?;
        engine = engine.with_privacy(tickmark::privacy::Privacy::new().with_keys(keys));
    }

    let started = Instant::now();
    let accepters = 16;
    let mut tasks = Vec::new();
    for a in 0..accepters {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            for n in (a..backlog).step_by(accepters) {
                engine
                    .accept(NewEvent::with_id(
                        "bench",
                        format!("evt_{n:07}"),
                        "tick",
                        serde_json::json!({"n": n}),
                    ))
                    .await?;
            }
            Ok::<_, tickmark::StoreError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let accept_per_s = backlog as f64 / started.elapsed().as_secs_f64();

    let config = WorkerConfig::default()
        .with_concurrency(args.workers)
        .with_poll_every(Duration::from_millis(100));
    let worker = engine.worker(config)?;
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    // The server's counters are read on a connection of their own.
    let counters = if url.starts_with("postgres") {
        Some(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(url)
                .await?,
        )
    } else {
        None
    };
    let before = match &counters {
        Some(pool) => Some(ServerSnapshot::take(pool).await?),
        None => None,
    };
    if let Some(phases) = phases {
        phases.reset();
    }
    let started = Instant::now();
    let cpu_before = process::cpu_time();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let target = args.events as u64;
    let mut reported = Instant::now();
    loop {
        let done = stats.borrow_and_update().events_done;
        if done >= target {
            break;
        }
        if reported.elapsed() > Duration::from_secs(5) {
            eprintln!("      {done} / {target} events");
            reported = Instant::now();
        }
        stats.changed().await?;
    }
    let elapsed = started.elapsed();
    let engine_cpu = process::cpu_time().saturating_sub(cpu_before);
    let server = match (&counters, &before) {
        (Some(pool), Some(before)) => {
            let after = ServerSnapshot::take(pool).await?;
            if args.wal_records {
                let records = server_cost::wal_records(pool, before, &after).await?;
                print_wal_records(&records, args.events);
            }
            Some(after.since(before))
        }
        _ => None,
    };
    if let Some(phases) = phases {
        tickmark_bench::bench::phases::print(&phases.snapshot(), args.workers, elapsed, target);
    }
    shutdown.cancel();
    running.await??;
    if let Some(pool) = counters {
        pool.close().await;
    }
    Ok(Drained {
        accept_per_s,
        events_per_s: args.events as f64 / elapsed.as_secs_f64(),
        server,
        engine_cpu,
    })
}

/// Dispatch latency p50 and p99 (ms) and idle CPU (% of one core).
async fn idle_figures(
    args: &Args,
    url: &str,
) -> Result<(f64, f64, f64), Box<dyn std::error::Error>> {
    let store = tickmark::connect(url).await?;
    let (times, mut started) = StartTimes::channel();
    let engine = Engine::new(
        store,
        Handlers::new().on("dispatch", "ping", Handler::new().step(Stamp)),
    )?
    .with_resource(times);
    let engine = Arc::new(engine);

    // Four idle workers, with the default (slow) polling: fast dispatch must
    // come from wake-ups, and idle CPU from not spinning.
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for n in 0..4 {
        let worker = engine.worker(WorkerConfig::default().with_name(format!("idle-{n}")))?;
        workers.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut latencies = if args.dispatch_samples > 0 {
        dispatch::measure(
            &engine,
            &mut started,
            args.dispatch_samples,
            Duration::from_millis(20),
        )
        .await?
    } else {
        Vec::new()
    };
    let p50 = stats::percentile_ms(&mut latencies, 50.0);
    let p99 = stats::percentile_ms(&mut latencies, 99.0);

    let mut idle_cpu = 0.0;
    if args.idle_secs > 0 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let meter = process::CpuMeter::start();
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        idle_cpu = meter.percent();
    }
    shutdown.cancel();
    for worker in workers {
        worker.await??;
    }
    Ok((p50, p99, idle_cpu))
}

/// The drain's WAL by record type, per event, to stderr (beside the phases).
fn print_wal_records(records: &[WalRecords], events: usize) {
    let per = |bytes: i64| bytes as f64 / events.max(1) as f64;
    eprintln!("WAL by record type during the drain, per event:");
    eprintln!(
        "  {:<24} {:>10} {:>12} {:>16}",
        "record", "per event", "bytes/event", "of which images"
    );
    for r in records {
        eprintln!(
            "  {:<24} {:>10.2} {:>12.1} {:>16.1}",
            r.kind,
            r.count as f64 / events.max(1) as f64,
            per(r.bytes),
            per(r.full_page_bytes)
        );
    }
}

fn print_table(f: &Figures) {
    println!();
    println!(
        "backend {} · {} events × {} steps · concurrency {} · backlog {}",
        f.backend, f.events, f.steps, f.workers, f.backlog
    );
    println!(
        "  {:<34} {:>12.0}",
        "accepted events/s (16 accepters)", f.accept_per_s
    );
    println!("  {:<34} {:>12.0}", "events/s (drain)", f.events_per_s);
    println!("  {:<34} {:>12.0}", "steps/s (drain)", f.steps_per_s);
    if f.naive_events_per_s > 0.0 {
        println!(
            "  {:<34} {:>12.0}",
            "naive SQL events/s (same run)", f.naive_events_per_s
        );
        println!("  {:<34} {:>12.2}", "ratio to naive", f.ratio_to_naive);
        println!(
            "  {:<34} {:>12.0}",
            "one-row insert commits/s", f.insert_commits_per_s
        );
    }
    println!("  {:<34} {:>12.2}", "dispatch p50 ms", f.dispatch_p50_ms);
    println!("  {:<34} {:>12.2}", "dispatch p99 ms", f.dispatch_p99_ms);
    println!(
        "  {:<34} {:>12.2}",
        "idle CPU % of one core (4 workers)", f.idle_cpu_pct
    );
    println!("  {:<34} {:>12.1}", "peak RSS MB", f.rss_mb);
    if f.db_wal_bytes_per_event > 0.0 {
        println!(
            "  {:<34} {:>12.0}",
            "server WAL bytes per event", f.db_wal_bytes_per_event
        );
    }
    println!(
        "  {:<34} {:>12.1}",
        "this process's CPU µs per event", f.engine_cpu_us_per_event
    );
    if f.db_cpu_us_per_event > 0.0 {
        println!(
            "  {:<34} {:>12.1}",
            "server CPU µs per event", f.db_cpu_us_per_event
        );
    }
}
