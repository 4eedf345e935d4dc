//! Do waiting events cost anything? "Waiting events hold no lease and no
//! slot: 10,000 waiting orders, and the engine's idle CPU and claim latency
//! stay as with none."
//!
//! ```text
//! cargo run --release -p tickmark-bench --bin wait_bench -- \
//!     [--database-url URL] [--waiting 10000] [--idle-secs 20] [--claims 500] \
//!     [--wakes 200] [--vacuum]
//! ```
//!
//! Default: a fresh SQLite file in a temp folder; on PostgreSQL a fresh
//! schema, dropped afterwards. Two engines in this process, each on its own
//! scratch database, measured side by side:
//!
//! - (a) no waiting event;
//! - (b) `--waiting` orders accepted (`shop`/`order.created`: a no-op step,
//!   then a wait for `shop`/`order.paid` matching `/id`, 3-day timeout) and
//!   run with `run_until_idle()` until every one waits
//!   (`event_counts().waiting` checked).
//!
//! The two are measured in alternation (a, b, b, a, …), so that the load of
//! a shared machine falls on both alike; (a) is the ceiling of (b).
//!
//! 1. claim latency: `--claims` calls of `event_claim_many` (16 at most,
//!    30 s lease) that find nothing due, no worker running, in 10 rounds per
//!    side (after 20 warm-up calls, the very first reported apart); also the
//!    idle loop's next-due query, `run_until_idle`'s active count and the
//!    `/metrics` counts, 50 of each;
//! 2. idle CPU: four idle workers with `WorkerConfig::default()`, in two
//!    windows per side of `--idle-secs / 2` each: this process's CPU time as
//!    % of one core (per-thread `schedstat`, in ns; and the 10 ms-tick figure
//!    `bench` prints), and how often their claim loops woke;
//! 3. wake latency: one default worker per side; `--wakes` orders one at a
//!    time, 20 ms apart: accept the matching `order.paid` and time it until
//!    the order's next step starts. Side (a) has no orders to wake, so it
//!    first accepts `--wakes` orders of its own and lets them reach their
//!    wait: its wake figures are for `--wakes` waiting events, (b)'s for
//!    `--waiting`. As many plain events dispatched (accept → first step),
//!    alongside, for comparison.
//!
//! It prints a table with the ratio (b)/(a) of each figure and, last, one
//! JSON line.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use tickmark::wait::WaitFor;
use tickmark::{Engine, EventState, Handler, Handlers, NewEvent, Step, StepContext, StepResult};
use tickmark::{WorkerConfig, WorkerStats};
use tickmark_bench::bench::database::ScratchDatabase;
use tickmark_bench::bench::dispatch::{Stamp, StartTimes};
use tickmark_bench::bench::{process, stats};
use tickmark_driver::store::{ClaimParams, EventCounts};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Measure what waiting events cost an idle engine: claim latency, idle CPU
/// and wake latency, with none waiting and with many.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Database to measure (`sqlite://…` or `postgres://…`). Default: new
    /// SQLite files in a temp folder. PostgreSQL: fresh schemas.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Waiting orders on side (b).
    #[arg(long, default_value_t = 10_000)]
    waiting: usize,
    /// Idle CPU measured per side, seconds (0 skips it).
    #[arg(long, default_value_t = 20)]
    idle_secs: u64,
    /// Claims that find nothing due, timed per side.
    #[arg(long, default_value_t = 500)]
    claims: usize,
    /// Orders woken by their `order.paid`, timed per side (and as many
    /// plain events dispatched).
    #[arg(long, default_value_t = 200)]
    wakes: usize,
    /// PostgreSQL: `VACUUM ANALYZE` the engine's tables once the orders
    /// wait, as autovacuum soon would (by default the figures are taken
    /// right after, with the dead index entries of the orders' earlier row
    /// versions still in place). No effect on SQLite.
    #[arg(long)]
    vacuum: bool,
}

/// The source of the orders and their payments.
const SOURCE: &str = "shop";
/// How long an order waits for its payment.
const PAY_WITHIN: Duration = Duration::from_secs(3 * 24 * 3600);
/// Claim calls before the timed ones (the first is reported apart).
const WARM_UP_CLAIMS: usize = 20;
/// Rounds of claims per side (the sides alternate between rounds).
const CLAIM_ROUNDS: usize = 10;
/// Timings of each of the other queries, per side.
const QUERY_ROUNDS: usize = 50;
/// Gap after each wake or dispatch sample.
const SAMPLE_GAP: Duration = Duration::from_millis(20);
/// A sample that takes longer than this is counted as missed.
const GIVE_UP: Duration = Duration::from_secs(5);

/// A step that does nothing: reserving stock, say.
#[derive(Debug, Serialize, Deserialize)]
struct Noop;

#[typetag::serde(name = "wait_bench.noop")]
#[async_trait::async_trait]
impl Step for Noop {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Ok(serde_json::Value::Null)
    }
}

/// An order: reserve (no-op), wait up to 3 days for its payment, then
/// fulfil (records when it started). `order.paid` has no handler: it is
/// recorded (ignored) and wakes the order waiting on its id. And a plain
/// event whose one step records when it started, for comparison.
fn handlers() -> Handlers {
    Handlers::new()
        .on(
            SOURCE,
            "order.created",
            Handler::new()
                .named_step("reserve", Noop)
                .wait(
                    "paid",
                    WaitFor::event(SOURCE, "order.paid")
                        .matching("/id")
                        .timeout(PAY_WITHIN),
                )
                .named_step("fulfil", Stamp)
                .if_matched("paid"),
        )
        .on("dispatch", "ping", Handler::new().step(Stamp))
}

/// One side's figures.
#[derive(Debug, Default, Serialize)]
struct RunFigures {
    /// Events waiting while claims and idle CPU were measured.
    waiting: i64,
    /// Accepting the orders and running them to their wait, seconds.
    setup_s: f64,
    claim_first_ms: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
    next_due_p50_ms: f64,
    count_active_p50_ms: f64,
    event_counts_p50_ms: f64,
    idle_cpu_pct: f64,
    idle_cpu_pct_ticks: f64,
    idle_naps_per_s: f64,
    /// Events waiting when the wake samples began.
    wake_waiting: i64,
    wake_p50_ms: f64,
    wake_p99_ms: f64,
    wake_missed: usize,
    /// A plain event's accept → first step, same worker, alongside.
    dispatch_p50_ms: f64,
    dispatch_p99_ms: f64,
    dispatch_missed: usize,
    /// The engine's tables and indexes (PostgreSQL) or the database's pages
    /// (SQLite), after the setup, in MB.
    db_mb: f64,
}

#[derive(Debug, Serialize)]
struct Figures {
    backend: String,
    waiting: usize,
    idle_secs: u64,
    claims: usize,
    wakes: usize,
    vacuum: bool,
    none: RunFigures,
    with_waiting: RunFigures,
    /// (b)/(a) of each figure.
    ratios: BTreeMap<&'static str, f64>,
    rss_mb: f64,
}

type BoxError = Box<dyn std::error::Error>;

/// One engine on its own scratch database, and what was measured of it.
struct Side {
    db: ScratchDatabase,
    engine: Engine,
    /// When each `Stamp` step started, by event id.
    started: mpsc::UnboundedReceiver<(String, Instant)>,
    figures: RunFigures,
    claims: Vec<Duration>,
    next_due: Vec<Duration>,
    active: Vec<Duration>,
    counts: Vec<Duration>,
    wakes: Vec<Duration>,
    dispatches: Vec<Duration>,
    idle_cpu: Duration,
    idle_ticks: Duration,
    idle_wall: f64,
    idle_naps: u64,
}

impl Side {
    async fn open(base: Option<&str>, tag: &str) -> Result<Self, BoxError> {
        let db = ScratchDatabase::create(base, tag).await?;
        let store = match tickmark::connect(&db.url).await {
            Ok(store) => store,
            Err(error) => {
                db.remove().await?;
                return Err(error.into());
            }
        };
        let (times, started) = StartTimes::channel();
        let engine = Engine::new(store, handlers())?.with_resource(times);
        Ok(Self {
            db,
            engine,
            started,
            figures: RunFigures::default(),
            claims: Vec::new(),
            next_due: Vec::new(),
            active: Vec::new(),
            counts: Vec::new(),
            wakes: Vec::new(),
            dispatches: Vec::new(),
            idle_cpu: Duration::ZERO,
            idle_ticks: Duration::ZERO,
            idle_wall: 0.0,
            idle_naps: 0,
        })
    }

    /// Percentiles and rates from the samples.
    fn finish(&mut self) -> RunFigures {
        let f = &mut self.figures;
        f.claim_p50_ms = stats::percentile_ms(&mut self.claims, 50.0);
        f.claim_p99_ms = stats::percentile_ms(&mut self.claims, 99.0);
        f.next_due_p50_ms = stats::percentile_ms(&mut self.next_due, 50.0);
        f.count_active_p50_ms = stats::percentile_ms(&mut self.active, 50.0);
        f.event_counts_p50_ms = stats::percentile_ms(&mut self.counts, 50.0);
        if self.idle_wall > 0.0 {
            f.idle_cpu_pct = self.idle_cpu.as_secs_f64() / self.idle_wall * 100.0;
            f.idle_cpu_pct_ticks = self.idle_ticks.as_secs_f64() / self.idle_wall * 100.0;
            f.idle_naps_per_s = self.idle_naps as f64 / self.idle_wall;
        }
        f.wake_p50_ms = stats::percentile_ms(&mut self.wakes, 50.0);
        f.wake_p99_ms = stats::percentile_ms(&mut self.wakes, 99.0);
        f.dispatch_p50_ms = stats::percentile_ms(&mut self.dispatches, 50.0);
        f.dispatch_p99_ms = stats::percentile_ms(&mut self.dispatches, 99.0);
        std::mem::take(f)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let base = args.database_url.as_deref();
    let mut a = Side::open(base, "none").await?;
    let mut b = match Side::open(base, "waiting").await {
        Ok(b) => b,
        Err(error) => {
            a.db.remove().await?;
            return Err(error);
        }
    };
    let backend = if a.db.is_postgres() {
        "postgres"
    } else {
        "sqlite"
    };
    let measured = measure(&args, &mut a, &mut b).await;
    let (none, with_waiting) = (a.finish(), b.finish());
    a.db.remove().await?;
    b.db.remove().await?;
    measured?;

    let pairs: [(&'static str, f64, f64); 13] = [
        ("claim_p50", none.claim_p50_ms, with_waiting.claim_p50_ms),
        ("claim_p99", none.claim_p99_ms, with_waiting.claim_p99_ms),
        (
            "claim_first",
            none.claim_first_ms,
            with_waiting.claim_first_ms,
        ),
        (
            "next_due_p50",
            none.next_due_p50_ms,
            with_waiting.next_due_p50_ms,
        ),
        (
            "count_active_p50",
            none.count_active_p50_ms,
            with_waiting.count_active_p50_ms,
        ),
        (
            "event_counts_p50",
            none.event_counts_p50_ms,
            with_waiting.event_counts_p50_ms,
        ),
        ("idle_cpu", none.idle_cpu_pct, with_waiting.idle_cpu_pct),
        (
            "idle_naps_per_s",
            none.idle_naps_per_s,
            with_waiting.idle_naps_per_s,
        ),
        ("wake_p50", none.wake_p50_ms, with_waiting.wake_p50_ms),
        ("wake_p99", none.wake_p99_ms, with_waiting.wake_p99_ms),
        (
            "dispatch_p50",
            none.dispatch_p50_ms,
            with_waiting.dispatch_p50_ms,
        ),
        (
            "dispatch_p99",
            none.dispatch_p99_ms,
            with_waiting.dispatch_p99_ms,
        ),
        ("db_mb", none.db_mb, with_waiting.db_mb),
    ];
    let ratios = pairs
        .iter()
        .map(|&(name, a, b)| (name, ratio(a, b)))
        .collect();
    let figures = Figures {
        backend: backend.to_owned(),
        waiting: args.waiting,
        idle_secs: args.idle_secs,
        claims: args.claims,
        wakes: args.wakes,
        vacuum: args.vacuum,
        none,
        with_waiting,
        ratios,
        rss_mb: process::peak_rss_mb(),
    };
    print_table(&figures);
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

/// (b)/(a); NaN when (a) is zero.
fn ratio(a: f64, b: f64) -> f64 {
    if a > 0.0 {
        b / a
    } else {
        f64::NAN
    }
}

async fn measure(args: &Args, a: &mut Side, b: &mut Side) -> Result<(), BoxError> {
    eprintln!(
        "[1/4] (b): accepting {} orders and running them to their wait",
        args.waiting
    );
    if args.waiting > 0 {
        let setup = Instant::now();
        accept_orders(&b.engine, (0..args.waiting).collect()).await?;
        run_to_waiting(&b.engine, args.waiting).await?;
        b.figures.setup_s = setup.elapsed().as_secs_f64();
        eprintln!("      done in {:.1} s", b.figures.setup_s);
    }
    for side in [&mut *a, &mut *b] {
        if args.vacuum && side.db.is_postgres() {
            vacuum(&side.db).await?;
        }
        side.figures.waiting = side.engine.store().event_counts().await?.waiting;
        side.figures.db_mb = database_mb(&side.db).await?;
    }

    eprintln!(
        "[2/4] claims that find nothing due: {} per side, and the other queries",
        args.claims
    );
    warm_up_claims(a).await?;
    warm_up_claims(b).await?;
    let per_round = args.claims.div_ceil(CLAIM_ROUNDS);
    for round in 0..CLAIM_ROUNDS {
        let (first, second) = in_turn(round, a, b);
        time_claims(first, per_round).await?;
        time_claims(second, per_round).await?;
    }
    for round in 0..QUERY_ROUNDS {
        let (first, second) = in_turn(round, a, b);
        time_queries(first).await?;
        time_queries(second).await?;
    }

    if args.idle_secs > 0 {
        eprintln!(
            "[3/4] idle CPU: 4 idle workers, {} s per side in two windows",
            args.idle_secs
        );
        let window = Duration::from_secs_f64(args.idle_secs as f64 / 2.0);
        for round in 0..2 {
            let (first, second) = in_turn(round, a, b);
            idle_window(first, window).await?;
            idle_window(second, window).await?;
        }
    }

    if args.wakes > 0 {
        // Side (a) has nothing to wake: orders of its own, waiting like (b)'s.
        let own: Vec<usize> = (0..args.wakes).collect();
        accept_orders(&a.engine, own.clone()).await?;
        run_to_waiting(&a.engine, args.wakes).await?;
        let sample = {
            let mut rng = rand::thread_rng();
            rand::seq::index::sample(&mut rng, args.waiting, args.wakes.min(args.waiting))
                .into_vec()
        };
        let orders = [own, sample];
        eprintln!(
            "[4/4] wake latency: {} orders per side, and as many plain dispatches, {} ms apart",
            args.wakes,
            SAMPLE_GAP.as_millis()
        );
        wake_and_dispatch(a, b, &orders).await?;
    }
    Ok(())
}

/// The two sides in the order of this round: a, b, then b, a, and so on.
fn in_turn<'s>(round: usize, a: &'s mut Side, b: &'s mut Side) -> (&'s mut Side, &'s mut Side) {
    if round % 2 == 0 {
        (a, b)
    } else {
        (b, a)
    }
}

/// Accept one `order.created` per id, 16 accepters at once.
async fn accept_orders(engine: &Engine, ids: Vec<usize>) -> Result<(), BoxError> {
    let ids = Arc::new(ids);
    let accepters = 16;
    let mut tasks = Vec::new();
    for a in 0..accepters {
        let (engine, ids) = (engine.clone(), Arc::clone(&ids));
        tasks.push(tokio::spawn(async move {
            for &id in ids.iter().skip(a).step_by(accepters) {
                engine
                    .accept(NewEvent::with_id(
                        SOURCE,
                        order_id(id),
                        "order.created",
                        serde_json::json!({ "id": id, "total": 1200 }),
                    ))
                    .await?;
            }
            Ok::<_, tickmark::StoreError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

fn order_id(id: usize) -> String {
    format!("order_{id:06}")
}

/// Run a default worker until only waiting events remain; check that
/// `expected` wait.
async fn run_to_waiting(engine: &Engine, expected: usize) -> Result<(), BoxError> {
    engine
        .worker(WorkerConfig::default().with_name("setup"))?
        .run_until_idle()
        .await?;
    let counts = engine.store().event_counts().await?;
    if counts.waiting != expected as i64 {
        return Err(format!(
            "expected {expected} waiting orders, found {} ({:?})",
            counts.waiting, counts.by_state
        )
        .into());
    }
    Ok(())
}

fn state_count(counts: &EventCounts, state: EventState) -> i64 {
    counts
        .by_state
        .iter()
        .filter(|(s, _)| *s == state)
        .map(|(_, n)| n)
        .sum()
}

/// One probe claim, which must find nothing due.
async fn probe_claim(side: &Side) -> Result<Duration, BoxError> {
    let params = ClaimParams::new("probe", 16, Duration::from_secs(30));
    let started = Instant::now();
    let claimed = side.engine.store().event_claim_many(&params).await?;
    let took = started.elapsed();
    if !claimed.is_empty() {
        return Err(format!(
            "a probe claim took {} events: none should be due",
            claimed.len()
        )
        .into());
    }
    Ok(took)
}

async fn warm_up_claims(side: &mut Side) -> Result<(), BoxError> {
    side.figures.claim_first_ms = probe_claim(side).await?.as_secs_f64() * 1000.0;
    for _ in 1..WARM_UP_CLAIMS {
        probe_claim(side).await?;
    }
    Ok(())
}

async fn time_claims(side: &mut Side, n: usize) -> Result<(), BoxError> {
    for _ in 0..n {
        let took = probe_claim(side).await?;
        side.claims.push(took);
    }
    Ok(())
}

/// The other queries of an idle engine and its operators: the idle loop's
/// next due time, `run_until_idle`'s active count, the `/metrics` counts.
async fn time_queries(side: &mut Side) -> Result<(), BoxError> {
    let store = side.engine.store();
    let started = Instant::now();
    store.event_next_due().await?;
    side.next_due.push(started.elapsed());
    let started = Instant::now();
    let active = store.event_count_active().await?;
    side.active.push(started.elapsed());
    if active != 0 {
        return Err(format!("{active} events are active: none should be").into());
    }
    let started = Instant::now();
    store.event_counts().await?;
    side.counts.push(started.elapsed());
    Ok(())
}

/// Four idle default workers for `window` (after a second to settle): this
/// process's CPU, and how often their claim loops went idle (each time: one
/// claim, one next-due query).
async fn idle_window(side: &mut Side, window: Duration) -> Result<(), BoxError> {
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    let mut stats: Vec<watch::Receiver<WorkerStats>> = Vec::new();
    for n in 0..4 {
        let worker = side
            .engine
            .worker(WorkerConfig::default().with_name(format!("idle-{n}")))?;
        stats.push(worker.stats());
        workers.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let naps = |stats: &[watch::Receiver<WorkerStats>]| -> u64 {
        stats.iter().map(|s| s.borrow().idle_waits).sum()
    };
    let naps_before = naps(&stats);
    let threads = ThreadCpu::start();
    let ticks = process::cpu_time();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    side.idle_wall += started.elapsed().as_secs_f64();
    side.idle_cpu += threads.used();
    side.idle_ticks += process::cpu_time().saturating_sub(ticks);
    side.idle_naps += naps(&stats) - naps_before;
    shutdown.cancel();
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

/// With one default worker per side: in turn, a plain event dispatched
/// (accept → its step starts) and an order woken (accept its `order.paid`
/// → the order's `fulfil` step starts), `SAMPLE_GAP` after each.
async fn wake_and_dispatch(
    a: &mut Side,
    b: &mut Side,
    orders: &[Vec<usize>; 2],
) -> Result<(), BoxError> {
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for side in [&mut *a, &mut *b] {
        side.figures.wake_waiting = side.engine.store().event_counts().await?.waiting;
        let worker = side
            .engine
            .worker(WorkerConfig::default().with_name("wake"))?;
        workers.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let rounds = orders[0].len().max(orders[1].len());
    for round in 0..rounds {
        let b_first = round % 2 == 1;
        for turn in 0..2 {
            let (side, which) = if (turn == 0) != b_first {
                (&mut *a, 0)
            } else {
                (&mut *b, 1)
            };
            let ping = format!("ping_{round:06}");
            let event = NewEvent::with_id("dispatch", &ping, "ping", serde_json::json!({}));
            match time_to_stamp(side, event, &ping).await? {
                Some(took) => side.dispatches.push(took),
                None => side.figures.dispatch_missed += 1,
            }
            tokio::time::sleep(SAMPLE_GAP).await;
            let Some(&id) = orders[which].get(round) else {
                continue;
            };
            let paid = NewEvent::with_id(
                SOURCE,
                format!("paid_{id:06}"),
                "order.paid",
                serde_json::json!({ "id": id }),
            );
            match time_to_stamp(side, paid, &order_id(id)).await? {
                Some(took) => side.wakes.push(took),
                None => side.figures.wake_missed += 1,
            }
            tokio::time::sleep(SAMPLE_GAP).await;
        }
    }
    // Let the last marks land before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    for worker in workers {
        worker.await??;
    }
    for (side, orders) in [(&mut *a, &orders[0]), (&mut *b, &orders[1])] {
        let f = &side.figures;
        if f.wake_missed + f.dispatch_missed > 0 {
            eprintln!(
                "      missed (no step within {} s): {} wakes, {} dispatches",
                GIVE_UP.as_secs(),
                f.wake_missed,
                f.dispatch_missed
            );
        }
        let done = state_count(&side.engine.store().event_counts().await?, EventState::Done);
        let expected = (orders.len() - f.wake_missed + rounds - f.dispatch_missed) as i64;
        if done != expected {
            return Err(format!(
                "{expected} events should be done (woken orders, dispatched pings), {done} are"
            )
            .into());
        }
    }
    Ok(())
}

/// Accept `event` and wait until the `Stamp` step of event `expected`
/// starts: how long that took, or `None` after `GIVE_UP`.
async fn time_to_stamp(
    side: &mut Side,
    event: NewEvent,
    expected: &str,
) -> Result<Option<Duration>, BoxError> {
    let accepted_at = Instant::now();
    side.engine.accept(event).await?;
    let deadline = tokio::time::Instant::now() + GIVE_UP;
    loop {
        match tokio::time::timeout_at(deadline, side.started.recv()).await {
            Ok(Some((ran, at))) if ran == expected => return Ok(Some(at - accepted_at)),
            Ok(Some(_late)) => continue,
            Ok(None) => return Err("the worker stopped".into()),
            Err(_) => return Ok(None),
        }
    }
}

/// `VACUUM ANALYZE` the engine's busy tables (PostgreSQL).
async fn vacuum(db: &ScratchDatabase) -> Result<(), BoxError> {
    let pool = sqlx::PgPool::connect(&db.url).await?;
    sqlx::query("VACUUM ANALYZE tickmark_events, tickmark_steps, tickmark_match_keys")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// The database's size in MB: the engine's tables and their indexes
/// (PostgreSQL), or the pages of the file (SQLite).
async fn database_mb(db: &ScratchDatabase) -> Result<f64, BoxError> {
    let bytes = if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await?;
        let bytes: Option<i64> = sqlx::query_scalar(
            "SELECT sum(pg_total_relation_size(c.oid))::bigint
             FROM pg_class AS c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'",
        )
        .fetch_one(&pool)
        .await?;
        pool.close().await;
        bytes.unwrap_or(0) as u64
    } else {
        // The pages in use, committed ones still in the WAL included.
        let pool = sqlx::SqlitePool::connect(&db.url).await?;
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&pool)
            .await?;
        let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&pool)
            .await?;
        pool.close().await;
        (pages * page_size) as u64
    };
    Ok(bytes as f64 / (1024.0 * 1024.0))
}

/// This process's CPU time in ns, per thread (`/proc/self/task/*/schedstat`),
/// so that a quiet span is measured to the nanosecond rather than in 10 ms
/// ticks. A thread that ends during the span loses its share.
struct ThreadCpu {
    at_start: HashMap<String, u64>,
}

impl ThreadCpu {
    fn start() -> Self {
        Self {
            at_start: thread_times(),
        }
    }

    fn used(&self) -> Duration {
        let ns: u64 = thread_times()
            .iter()
            .map(|(tid, &now)| now.saturating_sub(self.at_start.get(tid).copied().unwrap_or(0)))
            .sum();
        Duration::from_nanos(ns)
    }
}

fn thread_times() -> HashMap<String, u64> {
    let Ok(tasks) = std::fs::read_dir(Path::new("/proc/self/task")) else {
        return HashMap::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| {
            let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let ns = schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
            Some((task.file_name().to_string_lossy().into_owned(), ns))
        })
        .collect()
}

fn print_table(f: &Figures) {
    let (a, b) = (&f.none, &f.with_waiting);
    println!();
    println!(
        "backend {} · (a) no waiting event · (b) {} waiting orders · {} claims · idle {} s · {} wakes{}",
        f.backend,
        f.waiting,
        f.claims,
        f.idle_secs,
        f.wakes,
        if f.vacuum { " · vacuumed" } else { "" }
    );
    println!("  {:<44} {:>10} {:>10} {:>8}", "", "(a)", "(b)", "(b)/(a)");
    let rows: [(&str, f64, f64, usize); 19] = [
        ("waiting events", a.waiting as f64, b.waiting as f64, 0),
        (
            "claim, nothing due: p50 ms",
            a.claim_p50_ms,
            b.claim_p50_ms,
            3,
        ),
        (
            "claim, nothing due: p99 ms",
            a.claim_p99_ms,
            b.claim_p99_ms,
            3,
        ),
        (
            "next-due query (idle loop) p50 ms",
            a.next_due_p50_ms,
            b.next_due_p50_ms,
            3,
        ),
        (
            "active count (run_until_idle) p50 ms",
            a.count_active_p50_ms,
            b.count_active_p50_ms,
            3,
        ),
        (
            "event_counts (/metrics) p50 ms",
            a.event_counts_p50_ms,
            b.event_counts_p50_ms,
            3,
        ),
        (
            "idle CPU % of one core (4 workers)",
            a.idle_cpu_pct,
            b.idle_cpu_pct,
            3,
        ),
        (
            "idle CPU % (10 ms ticks, as bench)",
            a.idle_cpu_pct_ticks,
            b.idle_cpu_pct_ticks,
            3,
        ),
        (
            "idle naps/s (4 workers)",
            a.idle_naps_per_s,
            b.idle_naps_per_s,
            2,
        ),
        (
            "waiting when woken",
            a.wake_waiting as f64,
            b.wake_waiting as f64,
            0,
        ),
        (
            "wake p50 ms (accept → next step)",
            a.wake_p50_ms,
            b.wake_p50_ms,
            2,
        ),
        ("wake p99 ms", a.wake_p99_ms, b.wake_p99_ms, 2),
        (
            "wakes missed",
            a.wake_missed as f64,
            b.wake_missed as f64,
            0,
        ),
        (
            "plain dispatch p50 ms (accept → step)",
            a.dispatch_p50_ms,
            b.dispatch_p50_ms,
            2,
        ),
        (
            "plain dispatch p99 ms",
            a.dispatch_p99_ms,
            b.dispatch_p99_ms,
            2,
        ),
        (
            "dispatches missed",
            a.dispatch_missed as f64,
            b.dispatch_missed as f64,
            0,
        ),
        ("database MB after setup", a.db_mb, b.db_mb, 2),
        ("setup s (accept, run to the wait)", a.setup_s, b.setup_s, 1),
        (
            "claim, nothing due: first ms",
            a.claim_first_ms,
            b.claim_first_ms,
            3,
        ),
    ];
    for (name, a, b, digits) in rows {
        println!(
            "  {:<44} {:>10.digits$} {:>10.digits$} {:>8.2}",
            name,
            a,
            b,
            ratio(a, b)
        );
    }
    println!("  peak RSS MB {:.1}", f.rss_mb);
}
