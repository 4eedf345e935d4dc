//! The soak run: an hour of steady signed deliveries, 20 % of them
//! redeliveries, with a retention shorter than the run and `tickmark prune`
//! on a schedule; do the tables level off, does throughput hold, is every
//! redelivery still a duplicate?
//!
//! ```text
//! scripts/soak                                    # release build, one hour
//! cargo run --release -p tickmark-bench --bin soak -- \
//!     [--database-url URL] [--minutes 60] [--rate 50] [--retention 5m] \
//!     [--dedup-window 15m] [--prune-every 1m] [--sample-every 10s] [--out soak-out]
//! ```
//!
//! In one process, on PostgreSQL (a fresh schema, dropped afterwards): the
//! receiver with a Stripe source on loopback, a worker running a 3-step
//! handler (`bench/src/soak/handler.rs`: its middle step writes an
//! application row in the engine's transaction, counting its runs), and a
//! sender posting signed deliveries over HTTP at `--rate`. `tickmark prune
//! --older-than RETENTION --dedup-window WINDOW --i-know` runs every
//! `--prune-every` as a child process, as cron would run it. Every
//! `--sample-every` the sizes of the schema's tables and their dead tuples
//! are read, with the interval's throughput and acknowledgement latency.
//!
//! Writes `soak.csv`, `soak.svg` and `summary.json` into `--out`, prints a
//! summary, and exits 1 when a correctness check fails (a redelivery answered
//! `new`, an effect applied twice, an event lost or unfinished, a prune that
//! failed). Speed is reported, never a reason to fail.

use std::path::PathBuf;
use std::pin::pin;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use sqlx::PgPool;
use tickmark::receiver::providers::Stripe;
use tickmark::store::postgres::{PostgresOptions, PostgresStore};
use tickmark::{Engine, Receiver, WorkerConfig};
use tickmark_bench::bench::database::ScratchDatabase;
use tickmark_bench::soak::handler::{self, Finished};
use tickmark_bench::soak::pruner::{self, PrunerConfig, PrunerTotals};
use tickmark_bench::soak::samples::{write_csv, Phase, Sample};
use tickmark_bench::soak::sender::{self, SenderConfig, SenderState};
use tickmark_bench::soak::summary::{Correctness, Summary};
use tickmark_bench::soak::{plot, sampler};
use tickmark_examples::shutdown::shutdown_signal;
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_soak_signing_secret_0123456789";

const LONG_ABOUT: &str = "\
Soak tickmark on PostgreSQL: steady signed Stripe deliveries over HTTP for --minutes,
--duplicates of them redeliveries of acknowledged events (a --late-share of those older
than the retention, so only a tombstone can answer them), while `tickmark prune
--older-than RETENTION --dedup-window WINDOW --i-know` runs every --prune-every.

Every --sample-every it reads each table's pg_total_relation_size and n_dead_tup, and the
interval's acknowledgements/s, events finished/s and acknowledgement p50/p99. It writes
soak.csv, soak.svg and summary.json into --out and prints first-vs-last segment figures
(ten minutes of a run of 30 minutes or more, a tenth of a shorter one).

Exits 1 when a correctness check fails: a redelivery answered new, an effect applied
twice, an event lost or unfinished after the drain, a failed prune. Speed is reported.

The server's autovacuum off (as on some test machines)? --vacuum auto (the default) then
VACUUMs the run's tables after each prune, standing in for it.";

/// Soak tickmark: steady deliveries with redeliveries, prune on a schedule.
#[derive(Debug, Parser)]
#[command(version, about, long_about = LONG_ABOUT)]
struct Args {
    /// PostgreSQL server; the run works in a fresh schema, dropped afterwards
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// How long to send, in minutes (fractions allowed: 1.5)
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Deliveries per second (new events and redeliveries together)
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Share of deliveries that redeliver an acknowledged event
    #[arg(long, default_value_t = 0.2)]
    duplicates: f64,
    /// Share of redeliveries that are late (older than the retention plus a prune period)
    #[arg(long, default_value_t = 0.25)]
    late_share: f64,
    /// Prune's --older-than: finished events older than this lose payload and steps
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    retention: Duration,
    /// Prune's --dedup-window: how long a tombstone answers redeliveries
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    dedup_window: Duration,
    /// How often prune runs
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    prune_every: Duration,
    /// How often sizes, dead tuples, throughput and latency are sampled
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    sample_every: Duration,
    /// The `tickmark` command line (default: `tickmark` beside this executable)
    #[arg(long, value_name = "PATH")]
    tickmark_bin: Option<PathBuf>,
    /// Where soak.csv, soak.svg and summary.json go
    #[arg(long, default_value = "soak-out")]
    out: PathBuf,
    /// Events the worker runs at once
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// VACUUM the run's tables after each prune: auto = when the server's autovacuum is off
    #[arg(long, value_enum, default_value_t = Vacuum::Auto)]
    vacuum: Vacuum,
    /// Bytes of filler in each payload
    #[arg(long, default_value_t = 1024)]
    payload_bytes: usize,
    /// After sending, how long to wait for the workers to finish every event
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Keep the schema afterwards (to look at it with psql)
    #[arg(long)]
    keep_schema: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Vacuum {
    /// When the server's autovacuum is off
    Auto,
    /// Always
    On,
    /// Never (autovacuum's business)
    Off,
}

/// A duration as operators type them (`90s`, `15m`, `2h`, `1h 30m`), read by
/// `humantime`, as the `tickmark` command line reads its own.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|error| format!("`{text}`: {error} (a duration such as 90s, 15m or 2h)"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let _logging =
        tickmark_examples::logging::log_to_stderr("soak", "info,sqlx=warn,tickmark::receiver=warn");
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            tracing::error!("soak: {error}");
            ExitCode::from(2)
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn run(args: Args) -> Result<bool, BoxError> {
    if !args.database_url.starts_with("postgres") {
        return Err("the soak measures PostgreSQL tables: give a postgres:// URL".into());
    }
    if !(args.rate > 0.0 && args.minutes > 0.0) {
        return Err("--rate and --minutes must be positive".into());
    }
    if args.dedup_window <= args.retention + args.prune_every {
        return Err("--dedup-window must exceed --retention plus --prune-every".into());
    }
    let tickmark_bin = match args.tickmark_bin.clone() {
        Some(path) => path,
        None => std::env::current_exe()?.with_file_name("tickmark"),
    };
    if !tickmark_bin.exists() {
        return Err(format!(
            "no tickmark binary at {} (build it: cargo build --release -p tickmark --bin tickmark, \
             or pass --tickmark-bin)",
            tickmark_bin.display()
        )
        .into());
    }
    std::fs::create_dir_all(&args.out)?;

    let scratch = ScratchDatabase::create(Some(&args.database_url), "soak")
        .await
        .map_err(|e| e.to_string())?;
    let outcome = soak(&args, &scratch.url, tickmark_bin).await;
    if args.keep_schema {
        tracing::info!(url = %tickmark::redact_url(&scratch.url), "schema kept");
    } else {
        scratch.remove().await.map_err(|e| e.to_string())?;
    }
    outcome
}

async fn soak(args: &Args, url: &str, tickmark_bin: PathBuf) -> Result<bool, BoxError> {
    let options = PostgresOptions {
        max_connections: 16,
        ..PostgresOptions::default()
    };
    let store = PostgresStore::connect_with(url, options).await?;
    let pool = store.pool().clone();
    sqlx::query(handler::CREATE_EFFECTS).execute(&pool).await?;
    let vacuum = match args.vacuum {
        Vacuum::On => true,
        Vacuum::Off => false,
        Vacuum::Auto => {
            let setting: String = sqlx::query_scalar("SHOW autovacuum")
                .fetch_one(&pool)
                .await?;
            setting != "on"
        }
    };

    let finished = Finished::default();
    let engine = Engine::new(Arc::new(store), handler::handlers())?.with_resource(finished.clone());
    let router = Receiver::new(engine.clone())
        .source(handler::SOURCE, Stripe::new([SECRET])?)?
        .standalone_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop_server = CancellationToken::new();
    let server = {
        let stop = stop_server.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        })
    };
    let stop_worker = CancellationToken::new();
    let worker = engine.worker(WorkerConfig::default().with_concurrency(args.concurrency))?;
    let worker = tokio::spawn(worker.run(stop_worker.clone()));

    let pruner_config = PrunerConfig {
        tickmark_bin,
        database_url: url.to_owned(),
        every: args.prune_every,
        retention: args.retention,
        dedup_window: args.dedup_window,
        vacuum,
    };
    tracing::info!(
        minutes = args.minutes,
        rate = args.rate,
        duplicates = args.duplicates,
        retention_s = args.retention.as_secs(),
        dedup_window_s = args.dedup_window.as_secs(),
        prune_every_s = args.prune_every.as_secs(),
        vacuum_after_prune = vacuum,
        receiver = %addr,
        prune = %pruner::prune_args(&pruner_config).join(" "),
        "soak started"
    );
    let prune_totals = Arc::new(PrunerTotals::default());
    let stop_pruner = CancellationToken::new();
    let pruner = tokio::spawn(pruner::run(
        pruner_config,
        pool.clone(),
        prune_totals.clone(),
        stop_pruner.clone(),
    ));

    let state = Arc::new(SenderState::default());
    let stop_sender = CancellationToken::new();
    let sender = tokio::spawn(sender::run(
        SenderConfig {
            addr,
            secret: SECRET.to_owned(),
            rate: args.rate,
            duplicate_share: args.duplicates,
            late_share: args.late_share,
            retention: args.retention,
            late_after: args.retention + args.prune_every + Duration::from_secs(5),
            late_before: args.dedup_window.mul_f64(0.9),
            payload_bytes: args.payload_bytes,
        },
        state.clone(),
        stop_sender.clone(),
    ));

    let mut recorder = Recorder {
        pool: pool.clone(),
        state: state.clone(),
        finished: finished.clone(),
        prune_totals: prune_totals.clone(),
        started: Instant::now(),
        last: Instant::now(),
        last_finished: 0,
        samples: Vec::new(),
        out: args.out.clone(),
        title: format!(
            "tickmark soak: {:.0} deliveries/s, {:.0} % redeliveries, retention {}s, dedup window {}s, prune every {}s",
            args.rate,
            args.duplicates * 100.0,
            args.retention.as_secs(),
            args.dedup_window.as_secs(),
            args.prune_every.as_secs()
        ),
    };
    let sending_for = Duration::from_secs_f64(args.minutes * 60.0);
    let mut interrupted = pin!(shutdown_signal());
    let mut tick = tokio::time::interval(args.sample_every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = &mut interrupted => {
                tracing::warn!("interrupted: stopping the sender, then draining");
                break;
            }
            _ = tick.tick() => {}
        }
        recorder.sample(Phase::Sending).await?;
        if recorder.started.elapsed() >= sending_for {
            break;
        }
    }
    let sent_minutes = recorder.started.elapsed().as_secs_f64() / 60.0;
    stop_sender.cancel();
    sender.await?;

    // Drain: the worker finishes what was accepted; prune keeps running.
    let drain_until = Instant::now() + args.drain_timeout;
    loop {
        tokio::time::sleep(Duration::from_secs(1).min(args.sample_every)).await;
        let active: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')",
        )
        .fetch_one(&pool)
        .await?;
        let due = recorder.last.elapsed() >= args.sample_every;
        if active == 0 || Instant::now() >= drain_until || due {
            recorder.sample(Phase::Draining).await?;
        }
        if active == 0 || Instant::now() >= drain_until {
            break;
        }
    }
    stop_pruner.cancel();
    pruner.await?;
    stop_worker.cancel();
    worker.await??;
    stop_server.cancel();
    server.await??;

    let totals = &state.totals;
    let count = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql).fetch_one(&pool);
    let tombstone_table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('tickmark_tombstones')::text")
            .fetch_one(&pool)
            .await?;
    let correctness = Correctness {
        accepted: totals.accepted.load(Ordering::Relaxed),
        redeliveries: totals.redeliveries.load(Ordering::Relaxed),
        late_redeliveries: totals.late_redeliveries.load(Ordering::Relaxed),
        late_answered_duplicate: totals.late_duplicates.load(Ordering::Relaxed),
        duplicates_answered_new: totals.redelivery_answered_new.load(Ordering::Relaxed),
        first_deliveries_answered_duplicate: totals
            .first_answered_duplicate
            .load(Ordering::Relaxed),
        lost: totals.lost.load(Ordering::Relaxed),
        failed_requests: totals.failed_requests.load(Ordering::Relaxed),
        double_effects: count("SELECT count(*) FROM soak_effects WHERE runs > 1").await?,
        effect_rows: count("SELECT count(*) FROM soak_effects").await?,
        finished: finished.get(),
        unfinished: count(
            "SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')",
        )
        .await?,
        not_done: count("SELECT count(*) FROM tickmark_events WHERE state <> 'done'").await?,
        prune_runs: prune_totals.runs.load(Ordering::Relaxed),
        prune_failures: prune_totals.failures.load(Ordering::Relaxed),
        pruned: prune_totals.deleted.load(Ordering::Relaxed),
        tombstones_expired: prune_totals.tombstones_expired.load(Ordering::Relaxed),
        tombstones_at_end: match tombstone_table {
            Some(_) => Some(count("SELECT count(*) FROM tickmark_tombstones").await?),
            None => None,
        },
    };
    let summary = Summary::new(&recorder.samples, sent_minutes, args.rate, correctness);
    recorder.write()?;
    std::fs::write(
        args.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    println!("{}", summary.render());
    println!(
        "wrote {}, {} and {}",
        args.out.join("soak.csv").display(),
        args.out.join("soak.svg").display(),
        args.out.join("summary.json").display()
    );
    Ok(summary.passed())
}

/// Takes the samples and keeps the CSV and the plot up to date.
struct Recorder {
    pool: PgPool,
    state: Arc<SenderState>,
    finished: Finished,
    prune_totals: Arc<PrunerTotals>,
    started: Instant,
    last: Instant,
    last_finished: u64,
    samples: Vec<Sample>,
    out: PathBuf,
    title: String,
}

impl Recorder {
    async fn sample(&mut self, phase: Phase) -> Result<(), BoxError> {
        let now = Instant::now();
        let interval = self.state.take_interval();
        let finished = self.finished.get();
        let tables = sampler::table_sizes(&self.pool).await?;
        let sample = Sample {
            t_s: now.duration_since(self.started).as_secs_f64(),
            phase,
            interval_s: now.duration_since(self.last).as_secs_f64(),
            acks: interval.new + interval.duplicate,
            new: interval.new,
            duplicate: interval.duplicate,
            failed: interval.failed,
            finished: finished - self.last_finished,
            latencies_ms: interval.latencies_ms,
            pruned_total: self.prune_totals.deleted.load(Ordering::Relaxed),
            tables,
        };
        self.last = now;
        self.last_finished = finished;
        tracing::info!(
            minute = format!("{:.1}", sample.t_s / 60.0),
            phase = ?phase,
            acks_per_s = format!("{:.1}", sample.acks_per_s()),
            finished_per_s = format!("{:.1}", sample.finished_per_s()),
            ack_p99_ms = format!("{:.2}", sample.ack_ms(0.99)),
            tickmark_mb = format!("{:.2}", sample.tickmark_bytes() as f64 / 1_048_576.0),
            dead_tuples = sample.tickmark_dead(),
            pruned = sample.pruned_total,
            failed = sample.failed,
            "sample"
        );
        self.samples.push(sample);
        self.write()
    }

    fn write(&self) -> Result<(), BoxError> {
        write_csv(&self.out.join("soak.csv"), &self.samples)?;
        plot::write_svg(&self.out.join("soak.svg"), &self.title, &self.samples)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_operators_type_them() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("30").is_err(), "a unit is required");
        assert!(parse_duration("m").is_err());
    }
}
