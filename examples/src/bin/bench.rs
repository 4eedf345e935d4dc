//! Throughput of the engine on your own database: accept a backlog of events,
//! then drain it with no-op steps and report events/s and steps/s.
//!
//! ```text
//! cargo run --release -p tickmark-examples --bin bench -- \
//!     [--database-url URL] [--events N] [--steps K] [--workers C]
//! ```
//!
//! Default: a fresh SQLite file in a temp folder, 1,000 events, 3 steps,
//! 16 concurrent events. On PostgreSQL it works in a fresh schema
//! (`tickmark_bench_<pid>`) and drops it afterwards. The last line is JSON.

use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use tickmark::{Engine, Handler, Handlers, NewEvent, Step, StepContext, StepResult, WorkerConfig};

/// Measure tickmark's throughput with no-op steps.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Database to measure (`sqlite://…` or `postgres://…`). Default: a new
    /// SQLite file in a temp folder. PostgreSQL runs in a fresh schema.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Events to accept and drain.
    #[arg(long, default_value_t = 1000)]
    events: usize,
    /// No-op steps per event.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Events run concurrently (the worker's concurrency).
    #[arg(long, default_value_t = 16)]
    workers: usize,
}

/// A step that does nothing: the engine's own cost is what is measured.
#[derive(Debug, Serialize, Deserialize)]
struct Noop;

#[typetag::serde(name = "bench.noop")]
#[async_trait::async_trait]
impl Step for Noop {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Ok(serde_json::Value::Null)
    }
}

#[derive(Debug, Serialize)]
struct Figures {
    backend: String,
    events: usize,
    steps: usize,
    workers: usize,
    accept_per_s: f64,
    events_per_s: f64,
    steps_per_s: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let temp = tempfile_dir()?;
    let (url, schema) = match &args.database_url {
        None => (
            format!("sqlite://{}", temp.join("bench.db").display()),
            None,
        ),
        Some(url) if url.starts_with("postgres") => {
            let schema = format!("tickmark_bench_{}", std::process::id());
            let admin = sqlx::PgPool::connect(url).await?;
            sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&admin)
                .await?;
            let separator = if url.contains('?') { '&' } else { '?' };
            (
                format!("{url}{separator}options[search_path]={schema}"),
                Some((admin, schema)),
            )
        }
        Some(url) => (url.clone(), None),
    };

    let result = run(&args, &url).await;
    if let Some((admin, schema)) = schema {
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&admin)
            .await?;
    }
    let _ = std::fs::remove_dir_all(&temp);
    let figures = result?;

    println!(
        "{:<10} {:>7} {:>6} {:>8} {:>12} {:>12} {:>12}",
        "backend", "events", "steps", "workers", "accept/s", "events/s", "steps/s"
    );
    println!(
        "{:<10} {:>7} {:>6} {:>8} {:>12.0} {:>12.0} {:>12.0}",
        figures.backend,
        figures.events,
        figures.steps,
        figures.workers,
        figures.accept_per_s,
        figures.events_per_s,
        figures.steps_per_s
    );
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

async fn run(args: &Args, url: &str) -> Result<Figures, Box<dyn std::error::Error>> {
    let store = tickmark::connect(url).await?;
    let backend = store.backend().to_string();
    let mut handler = Handler::new();
    for n in 0..args.steps {
        handler = handler.named_step(format!("noop_{n}"), Noop);
    }
    let engine = Engine::new(store, Handlers::new().on("bench", "tick", handler))?;

    let started = Instant::now();
    let accepters = 8;
    let mut tasks = Vec::new();
    for a in 0..accepters {
        let engine = engine.clone();
        let count = args.events;
        tasks.push(tokio::spawn(async move {
            for n in (a..count).step_by(accepters) {
                engine
                    .accept(NewEvent::with_id(
                        "bench",
                        format!("evt_{n}"),
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
    let accept_secs = started.elapsed().as_secs_f64();

    let config = WorkerConfig::default()
        .with_concurrency(args.workers)
        .with_poll_every(Duration::from_millis(100));
    let started = Instant::now();
    let stats = engine.worker(config).run_until_idle().await?;
    let drain_secs = started.elapsed().as_secs_f64();
    assert_eq!(
        stats.events_done as usize, args.events,
        "every event finished"
    );

    Ok(Figures {
        backend,
        events: args.events,
        steps: args.steps,
        workers: args.workers,
        accept_per_s: args.events as f64 / accept_secs,
        events_per_s: args.events as f64 / drain_secs,
        steps_per_s: (args.events * args.steps) as f64 / drain_secs,
    })
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("tickmark-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
