//! A fleet of worker processes on one PostgreSQL database: does adding
//! processes make tickmark faster, or at least never slower or less correct?
//!
//! ```text
//! cargo run --release -p tickmark-bench --bin fleet_bench -- \
//!     [--database-url URL] [--processes 1,2,4,8] [--events 20000] [--receivers 2]
//! scripts/bench-fleet            # release build, then 1/2/4/8 processes
//! ```
//!
//! For each process count N, in a fresh schema (dropped afterwards):
//!
//! 1. R receiver processes (the tickmark receiver over HTTP on loopback, a
//!    Stripe source, no worker) take a backlog of signed deliveries of
//!    `--events` distinct 3-step events, 10 % of the deliveries repeated;
//!    then they stop (their pools would count against `max_connections`);
//! 2. N worker processes, each one engine worker at `WorkerConfig::default()`
//!    with the store's default pool, drain it, timed from `go` to the last
//!    event's `finished_at`, while `pg_stat_activity` is sampled every 100 ms;
//! 3. checks: every event accepted once and done, every step marked once, one
//!    effect row per step, no takeover and no step run twice;
//! 4. for N ≥ 2, a second run with `--kill-events`: worker 0 is SIGKILLed a
//!    third of the way through, and the events it held are followed until
//!    another worker has claimed and finished them (bounded by the lease).
//!
//! The steps (`tickmark_bench::fleet::steps`): `reserve` inserts a row in
//! the step's own transaction, `call` sleeps `--call-ms` (a remote call) then
//! records the call keyed by its idempotency key, `settle` is like `reserve`.
//!
//! It prints a table (Markdown) and, last, one JSON line. The same binary,
//! run with the hidden `--role worker|receiver`, is each child process.

use clap::Parser;
use tickmark_bench::fleet::report::{self, Row};
use tickmark_bench::fleet::roles;
use tickmark_bench::fleet::run::{run, RunConfig};

/// Scale-out benchmark: 1, 2, 4, 8 worker processes on one PostgreSQL database.
#[derive(Debug, Parser)]
#[command(version, long_about = None, args_override_self = true)]
struct Args {
    /// PostgreSQL server (without `search_path`: every run works in a fresh
    /// schema, dropped afterwards). The user needs to be allowed to set
    /// `track_functions` (a superuser) for the claim counts.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// Worker process counts to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    processes: Vec<usize>,
    /// Distinct events in each throughput run's backlog (3 steps each).
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Distinct events in each kill run's backlog (N ≥ 2).
    #[arg(long, default_value_t = 6_000)]
    kill_events: usize,
    /// Skip the kill runs.
    #[arg(long)]
    no_kill: bool,
    /// Receiver processes that take the backlog.
    #[arg(long, default_value_t = 2)]
    receivers: usize,
    /// Concurrent HTTP clients delivering the backlog.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Share of extra deliveries that repeat an earlier one (redeliveries).
    #[arg(long, default_value_t = 0.1)]
    redelivered: f64,
    /// The `call` step's simulated remote call, in milliseconds.
    #[arg(long, default_value_t = 5)]
    call_ms: u64,
    /// Repeat the throughput runs this many times, every other round in
    /// reverse order (so a machine's drifting load falls on all counts
    /// alike); kill runs only in the first round. Ratios are to the
    /// 1-process run of the same round.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also run, for each N ≥ 2, one worker process at N × 16 slots
    /// (`with_concurrency`): the same number of slots in one process, to
    /// tell what the processes add beyond the slots.
    #[arg(long)]
    control: bool,
    /// Child processes only: the worker's concurrency.
    #[arg(long, hide = true)]
    concurrency: Option<usize>,
    /// Child processes only: `worker` or `receiver`.
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Child processes only: the database URL (schema, application_name).
    #[arg(long, hide = true)]
    child_url: Option<String>,
    /// Child processes only: the worker's name (its lease owner).
    #[arg(long, hide = true)]
    name: Option<String>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let default_filter = if args.role.is_some() {
        "warn"
    } else {
        "info,sqlx=warn"
    };
    let _logging = tickmark_examples::logging::log_to_stderr("fleet_bench", default_filter);

    if let Some(role) = &args.role {
        let url = args.child_url.as_deref().ok_or("--child-url is required")?;
        return match role.as_str() {
            "worker" => {
                let name = args.name.as_deref().ok_or("--name is required")?;
                roles::worker(url, name, args.call_ms, args.concurrency).await
            }
            "receiver" => roles::receiver(url, args.call_ms).await,
            other => Err(format!("unknown role `{other}`").into()),
        };
    }
    if !args.database_url.starts_with("postgres") {
        return Err("fleet_bench runs on PostgreSQL (--database-url postgres://…)".into());
    }

    let mut rows: Vec<Row> = Vec::new();
    let default_slots = tickmark::WorkerConfig::default().concurrency;
    for round in 0..args.rounds.max(1) {
        let mut order = args.processes.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut this_round: Vec<Row> = Vec::new();
        for processes in order {
            let processes = processes.max(1);
            let config = RunConfig {
                base_url: args.database_url.clone(),
                processes,
                receivers: args.receivers.max(1),
                events: args.events,
                redelivered: args.redelivered,
                clients: args.clients,
                call_ms: args.call_ms,
                concurrency: None,
                kill: false,
                tag: format!("r{round}n{processes}"),
            };
            tracing::info!(round, processes, events = args.events, "throughput run");
            let throughput = run(&config).await?;
            tracing::info!(
                processes,
                events_per_s = throughput.events_per_s,
                correct = throughput.correct,
                "drained"
            );
            let control = if args.control && processes >= 2 {
                let config = RunConfig {
                    processes: 1,
                    concurrency: Some(default_slots * processes),
                    tag: format!("r{round}n{processes}c"),
                    ..config.clone()
                };
                tracing::info!(slots = default_slots * processes, "control: one process");
                Some(run(&config).await?)
            } else {
                None
            };
            let killed = if round == 0 && processes >= 2 && !args.no_kill {
                let config = RunConfig {
                    events: args.kill_events,
                    kill: true,
                    tag: format!("r{round}n{processes}k"),
                    ..config
                };
                tracing::info!(processes, events = args.kill_events, "kill run");
                Some(run(&config).await?)
            } else {
                None
            };
            let row = Row {
                round,
                throughput,
                control,
                killed,
                ratio_to_one: None,
            };
            // One JSON line per row as it completes, so a long run leaves a trace.
            eprintln!("{}", serde_json::to_string(&row)?);
            this_round.push(row);
        }
        let one = this_round
            .iter()
            .find(|r| r.throughput.processes == 1)
            .map(|r| r.throughput.events_per_s);
        for row in &mut this_round {
            row.ratio_to_one =
                one.map(|one| (row.throughput.events_per_s / one * 100.0).round() / 100.0);
        }
        this_round.sort_by_key(|r| r.throughput.processes);
        rows.extend(this_round);
    }
    report::print(&rows);
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}
