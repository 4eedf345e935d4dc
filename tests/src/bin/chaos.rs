//! `chaos`: prove under faults that nothing is lost and nothing is done twice.
//!
//! ```text
//! cargo build -p tickmark-tests --release --bin chaos --bin tickmark-chaos-node
//! target/release/chaos [--events M] [--nodes N] [--duration S] \
//!     [--backend postgres|sqlite] [--seed N] [--lease-ms N] [--render-ms N]
//! target/release/chaos --failover sync|async [--promote-after-ms N] …
//! target/release/chaos --failover auto …
//! ```
//!
//! It starts its own database (a throwaway PostgreSQL cluster, or a SQLite
//! file), a stand-in receipt service, and N `tickmark-chaos-node` processes
//! (the payments app). It delivers M Stripe events, each 1 to 5 times, and
//! meanwhile SIGKILLs a random node every 1–3 s (restarting it), freezes one
//! node past its lease (PostgreSQL), and restarts PostgreSQL once with
//! `-m immediate`. With `--failover`, the database is a primary and a
//! streaming standby instead, the nodes get both in one multi-host URL, and
//! the only fault is the failover: the primary is killed (`-m immediate`)
//! while deliveries continue, and the standby promoted; it counts the
//! acknowledged deliveries the promoted standby does not have, and the time
//! until deliveries are accepted again (docs/failover.md). With
//! `--failover auto` the database is a pg_auto_failover formation (a
//! monitor and two nodes) and nothing is promoted by hand: the primary's
//! machine dies (keeper and PostgreSQL, SIGKILL), pg_auto_failover promotes
//! the standby, and the old primary's keeper, started again, rejoins as a
//! standby that must end with exactly the new primary's rows
//! (docs/deploying.md).
//! Then it lets the nodes drain, stops them with SIGTERM,
//! prints the figures as a table and one JSON line, and exits 1 if a check
//! failed (2 if the run itself could not be made). `docs/chaos.md` defines
//! every figure and check.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use rand::Rng;
use tickmark_examples::payments;
use tickmark_tests::chaos::auto_failover::{self, AutoFailover};
use tickmark_tests::chaos::database::{ChaosDatabase, Judge};
use tickmark_tests::chaos::nodes::{LogCounts, Node, NodeSpec};
use tickmark_tests::chaos::orphans::{Cause, Orphans};
use tickmark_tests::chaos::plan::Plan;
use tickmark_tests::chaos::provider::{Delivered, Provider, SendTally, Targets};
use tickmark_tests::chaos::receipts::ReceiptService;
use tickmark_tests::chaos::report::{FailoverFigures, Figures};
use tickmark_tests::chaos::STRIPE_SECRET;
use tickmark_tests::pg_auto_failover::Formation;
use tickmark_tests::pg_cluster::{PgCluster, StopMode};
use tickmark_tests::pg_replica::{ReplicaPair, Replication};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The chaos run's settings.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "chaos",
    version,
    about = "Kill, freeze and cut off tickmark nodes while they process webhooks; then check nothing was lost or done twice."
)]
struct Args {
    /// Distinct events to send (each delivered 1 to 5 times).
    #[arg(long, default_value_t = 300)]
    events: usize,
    /// Node processes running at a time.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Length of the chaos phase, in seconds (deliveries start in its first 70%).
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// The database the nodes share.
    #[arg(long, value_enum, default_value_t = BackendArg::Postgres)]
    backend: BackendArg,
    /// The seed of the plan (events, customers, amounts, delivery times);
    /// random when not given, and printed.
    #[arg(long)]
    seed: Option<u64>,
    /// The nodes' lease, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    lease_ms: u64,
    /// How long `render_invoice` works, in milliseconds.
    #[arg(long, default_value_t = 800)]
    render_ms: u64,
    /// Events each node runs at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Customers the events are spread over.
    #[arg(long, default_value_t = 40)]
    customers: usize,
    /// Most seconds to wait, after the chaos, for every delivery and event to finish.
    #[arg(long, default_value_t = 120)]
    drain: u64,
    /// Most deliveries in flight at once.
    #[arg(long, default_value_t = 48)]
    in_flight: usize,
    /// The node binary (default: `tickmark-chaos-node` next to this one).
    #[arg(long)]
    node_bin: Option<PathBuf>,
    /// Keep the work folder (node logs, invoices) even when the run passes.
    #[arg(long)]
    keep: bool,
    /// Fail the database over instead of the usual chaos: a primary and a
    /// standby with synchronous or asynchronous replication; the primary is
    /// killed half-way through and the standby promoted (no node kills, no
    /// zombie). `auto`: a pg_auto_failover formation decides and carries
    /// out the failover, and the old primary rejoins as a standby. Implies
    /// `--backend postgres`.
    #[arg(long, value_enum)]
    failover: Option<ReplicationArg>,
    /// With `--failover`: how long after the kill the standby is promoted,
    /// in milliseconds (what an HA manager takes to decide).
    #[arg(long, default_value_t = 2000)]
    promote_after_ms: u64,
    /// With `--failover`: cut the standby off from the primary this many
    /// milliseconds before the kill, as a lagging network would (0: no cut).
    /// Asynchronous replication then loses what the primary acknowledged
    /// meanwhile; synchronous replication acknowledges nothing meanwhile.
    #[arg(long, default_value_t = 0)]
    cut_standby_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Postgres,
    Sqlite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ReplicationArg {
    /// `synchronous_standby_names` names the standby.
    Sync,
    /// No synchronous standby.
    Async,
    /// A pg_auto_failover formation (Debian's pg-auto-failover-cli and
    /// postgresql-<major>-auto-failover): its monitor promotes the standby.
    Auto,
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    // Bounded: startup, the chaos phase, the drain, and the final stop.
    let bound = Duration::from_secs(args.duration + args.drain + 180);
    match tokio::time::timeout(bound, run(args)).await {
        Ok(Ok(true)) => ExitCode::SUCCESS,
        Ok(Ok(false)) => ExitCode::from(1),
        Ok(Err(message)) => {
            eprintln!("chaos: {message}");
            ExitCode::from(2)
        }
        Err(_) => {
            eprintln!("chaos: the run did not end within {bound:?}");
            ExitCode::from(2)
        }
    }
}

/// One node slot: the running generation, if any.
#[derive(Debug)]
struct Slot {
    node: Option<Node>,
    generation: u32,
    /// SIGSTOPped: not a target for deliveries or kills.
    frozen: bool,
    /// Not killed before this time (a resumed zombie shows its fencing first).
    protected_until: Instant,
}

/// What the chaos tasks share.
struct Chaos {
    spec: NodeSpec,
    slots: Mutex<Vec<Slot>>,
    targets: Arc<Targets>,
    judge: Judge,
    orphans: Arc<Orphans>,
    /// Every node generation's log counts.
    all_counts: std::sync::Mutex<Vec<Arc<LogCounts>>>,
    kills: AtomicU64,
    zombie_fenced: AtomicU64,
    zombies: AtomicU64,
    db_restarts: AtomicU64,
    db_down_ms: AtomicU64,
    /// What the failover cost (`--failover`).
    failover: std::sync::Mutex<Option<FailoverFigures>>,
    /// With `--failover auto`: the formation's old primary, once it rejoined.
    old_primary: std::sync::Mutex<Option<usize>>,
}

impl Chaos {
    /// Start generation `generation` in `slot`, retrying a failed start.
    async fn start_node(&self, slot: usize, generation: u32) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..3 {
            match self.spec.start(slot, generation).await {
                Ok(node) => {
                    self.all_counts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Arc::clone(&node.counts));
                    self.targets.set(slot, Some(node.addr));
                    let mut slots = self.slots.lock().await;
                    slots[slot].node = Some(node);
                    slots[slot].generation = generation;
                    return Ok(());
                }
                Err(error) => last = error.to_string(),
            }
        }
        Err(format!("node slot {slot} would not start: {last}"))
    }

    /// Every few seconds, SIGKILL a random node and start it again.
    async fn killer(self: Arc<Self>, stop: CancellationToken) -> Result<(), String> {
        let mut restarts: JoinSet<Result<(), String>> = JoinSet::new();
        loop {
            let nap = Duration::from_millis(rand::thread_rng().gen_range(1000..3000));
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(nap) => {}
            }
            let victim = {
                let mut slots = self.slots.lock().await;
                let now = Instant::now();
                let candidates: Vec<usize> = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.node.is_some() && !s.frozen && s.protected_until <= now)
                    .map(|(i, _)| i)
                    .collect();
                if candidates.is_empty() {
                    continue;
                }
                let slot = candidates[rand::thread_rng().gen_range(0..candidates.len())];
                // Its address stays a target until the restart begins: like a
                // provider, the sender meets refused connections and retries.
                let generation = slots[slot].generation;
                slots[slot].node.take().map(|node| (slot, generation, node))
            };
            let Some((slot, generation, node)) = victim else {
                continue;
            };
            let owner = node.name.clone();
            let killed_at = Instant::now();
            node.kill().await;
            self.kills.fetch_add(1, Ordering::Relaxed);
            let held = self.held_by(&owner).await;
            self.orphans.add(&owner, &held, killed_at, Cause::Kill);
            let chaos = Arc::clone(&self);
            restarts.spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                chaos.targets.set(slot, None);
                chaos.start_node(slot, generation + 1).await
            });
            while let Some(done) = restarts.try_join_next() {
                done.map_err(|e| e.to_string())??;
            }
        }
        while let Some(done) = restarts.join_next().await {
            done.map_err(|e| e.to_string())??;
        }
        Ok(())
    }

    /// The events `owner` holds; retried while the database is down.
    async fn held_by(&self, owner: &str) -> Vec<i64> {
        for _ in 0..40 {
            if let Ok(held) = self.judge.held_by(owner).await {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Vec::new()
    }

    /// Freeze a node that holds events past its lease, then resume it: a
    /// zombie whose marks must be refused.
    async fn zombie(&self, lease: Duration) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let chosen = loop {
            let candidates: Vec<(usize, String)> = {
                let slots = self.slots.lock().await;
                slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.node.as_ref().map(|n| (i, n.name.clone())))
                    .collect()
            };
            let mut found = None;
            for (slot, name) in candidates {
                if !self
                    .judge
                    .held_by(&name)
                    .await
                    .unwrap_or_default()
                    .is_empty()
                {
                    found = Some(slot);
                    break;
                }
            }
            if let Some(slot) = found {
                // Freeze it, unless it was killed meanwhile.
                let mut slots = self.slots.lock().await;
                if let Some(node) = slots[slot].node.as_ref() {
                    node.stop().map_err(|e| e.to_string())?;
                    let frozen = (
                        slot,
                        node.name.clone(),
                        Arc::clone(&node.counts),
                        Instant::now(),
                    );
                    // It stays a target: deliveries to it wait in its
                    // listen backlog until it wakes up.
                    slots[slot].frozen = true;
                    break Some(frozen);
                }
            }
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let Some((slot, name, counts, frozen_at)) = chosen else {
            eprintln!("chaos: no node held an event to freeze; no zombie this run");
            return Ok(());
        };
        self.zombies.fetch_add(1, Ordering::Relaxed);
        let held = self.held_by(&name).await;
        self.orphans.add(&name, &held, frozen_at, Cause::Freeze);
        let fenced_before = counts.fenced();
        tokio::time::sleep(lease * 2 + Duration::from_secs(1)).await;
        {
            let mut slots = self.slots.lock().await;
            if let Some(node) = slots[slot].node.as_ref() {
                node.resume().map_err(|e| e.to_string())?;
            }
            slots[slot].frozen = false;
            slots[slot].protected_until = Instant::now() + Duration::from_secs(5);
        }
        // What it says in the next seconds: its marks refused, its leases lost.
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.zombie_fenced
            .store(counts.fenced() - fenced_before, Ordering::Relaxed);
        Ok(())
    }

    /// Stop PostgreSQL as a crash would, keep it down a few seconds (one
    /// extra delivery is sent meanwhile, to see the 503), and start it again.
    async fn restart_database(
        &self,
        cluster: &Mutex<Option<PgCluster>>,
        provider: &Provider,
        body: &str,
        give_up: &CancellationToken,
    ) -> Result<(), String> {
        let mut guard = cluster.lock().await;
        let Some(cluster) = guard.as_mut() else {
            return Ok(());
        };
        cluster
            .stop(StopMode::Immediate)
            .await
            .map_err(|e| e.to_string())?;
        let down_at = Instant::now();
        let extra = {
            let (provider, body, give_up) = (provider.clone(), body.to_owned(), give_up.clone());
            tokio::spawn(async move { provider.deliver(&body, &give_up).await })
        };
        tokio::time::sleep(Duration::from_secs(4)).await;
        cluster.start_again().await.map_err(|e| e.to_string())?;
        let down = down_at.elapsed();
        self.db_restarts.fetch_add(1, Ordering::Relaxed);
        self.db_down_ms.store(
            u64::try_from(down.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        drop(guard);
        let _ = extra.await;
        Ok(())
    }
}

/// What [`Chaos::fail_over`] needs from the run.
struct FailoverPlan<'a> {
    pair: &'a Mutex<Option<ReplicaPair>>,
    provider: &'a Provider,
    tally: &'a SendTally,
    /// Events answered 2xx so far, by index in the plan, and when.
    acked: &'a std::sync::Mutex<Vec<(usize, Instant)>>,
    plan: &'a Plan,
    promote_after: Duration,
    cut_standby: Duration,
    give_up: &'a CancellationToken,
}

impl Chaos {
    /// Kill the primary while deliveries continue (one extra delivery is
    /// sent meanwhile, to see the 503), count what the standby lacks of what
    /// was acknowledged, promote it, and repoint the judge.
    async fn fail_over(&self, how: FailoverPlan<'_>) -> Result<(), String> {
        let mut guard = how.pair.lock().await;
        let Some(pair) = guard.as_mut() else {
            return Ok(());
        };
        if !how.cut_standby.is_zero() {
            pair.cut_standby().await.map_err(|e| e.to_string())?;
            tokio::time::sleep(how.cut_standby).await;
        }
        pair.kill_primary().await.map_err(|e| e.to_string())?;
        let killed_at = Instant::now();
        *how.tally
            .fault_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(killed_at);
        let extra = match how.plan.events.first() {
            Some(event) => {
                let (provider, body, give_up) = (
                    how.provider.clone(),
                    event.body.clone(),
                    how.give_up.clone(),
                );
                Some(tokio::spawn(async move {
                    provider.deliver(&body, &give_up).await
                }))
            }
            None => None,
        };
        pair.wait_for_replay().await.map_err(|e| e.to_string())?;
        tokio::time::sleep_until(killed_at + how.promote_after).await;
        // Every 2xx so far came from the old primary: nothing else accepted
        // writes. The standby is read-only and has replayed all it received.
        let acked: std::collections::BTreeSet<String> = how
            .acked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|&(i, _)| how.plan.events[i].id.clone())
            .collect();
        let on_standby = Judge::connect(&pair.standby.url())
            .await
            .map_err(|e| e.to_string())?;
        let kept: std::collections::BTreeSet<String> = on_standby
            .event_ids()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
        on_standby.close().await;
        let lost: Vec<String> = acked.difference(&kept).cloned().collect();
        pair.promote().await.map_err(|e| e.to_string())?;
        let promoted = killed_at.elapsed();
        self.judge
            .repoint(&pair.standby.url())
            .map_err(|e| e.to_string())?;
        *self
            .failover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(FailoverFigures {
            replication: pair.replication().as_str().to_owned(),
            standby_cut_ms: u64::try_from(how.cut_standby.as_millis()).unwrap_or(u64::MAX),
            acked_before_kill: acked.len() as u64,
            acked_lost: lost.len() as u64,
            acked_lost_samples: lost.iter().take(10).cloned().collect(),
            kill_to_promoted_ms: u64::try_from(promoted.as_millis()).unwrap_or(u64::MAX),
            kill_to_accepted_ms: None,
            rejoin: None,
        });
        drop(guard);
        if let Some(extra) = extra {
            let _ = extra.await;
        }
        Ok(())
    }
}

/// Every 30 s until `stop`, one line on stderr: where the run is.
async fn progress(
    chaos: Arc<Chaos>,
    tally: Arc<SendTally>,
    started: Instant,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        let rows = match chaos.judge.tallies().await {
            Ok(t) => format!(
                "{} accepted, {} done, {} takeovers",
                t.events, t.done, t.takeovers
            ),
            Err(_) => "database unreachable".to_owned(),
        };
        eprintln!(
            "chaos: {:>4.0} s: {} new + {} duplicate answers, {} 503s; {rows}; {} kills",
            started.elapsed().as_secs_f64(),
            SendTally::get(&tally.new),
            SendTally::get(&tally.duplicate),
            SendTally::get(&tally.unavailable_503),
            chaos.kills.load(Ordering::Relaxed),
        );
    }
}

async fn run(args: Args) -> Result<bool, String> {
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(rand::random);
    let node_bin = match &args.node_bin {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("tickmark-chaos-node"),
    };
    if !node_bin.exists() {
        return Err(format!(
            "no node binary at {}: build it with `cargo build -p tickmark-tests --bin tickmark-chaos-node` \
             (add --release for a release run), or pass --node-bin",
            node_bin.display()
        ));
    }
    let work = tempfile::Builder::new()
        .prefix("tickmark-chaos-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let log_dir = work.path().join("logs");
    let out_dir = work.path().join("invoices");
    std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let postgres = args.backend == BackendArg::Postgres || args.failover.is_some();
    let failing_over = args.failover.is_some();
    let automatic = args.failover == Some(ReplicationArg::Auto);
    let replication = args.failover.and_then(|r| match r {
        ReplicationArg::Sync => Some(Replication::Sync),
        ReplicationArg::Async => Some(Replication::Async),
        ReplicationArg::Auto => None,
    });
    if automatic && args.cut_standby_ms > 0 {
        return Err(
            "--cut-standby-ms is for --failover sync|async: pg_auto_failover disables \
             synchronous replication itself when its standby falls behind"
                .to_owned(),
        );
    }
    println!(
        "chaos: {} events, {} nodes, {} s of chaos on {}{}, seed {seed}; logs in {}",
        args.events,
        args.nodes,
        args.duration,
        if postgres { "postgres" } else { "sqlite" },
        match (replication, automatic) {
            (Some(r), _) => format!(", failing over to a {} standby", r.as_str()),
            (None, true) => ", failed over by pg_auto_failover".to_owned(),
            (None, false) => String::new(),
        },
        log_dir.display()
    );

    let receipts = ReceiptService::start().await;
    let database = if automatic {
        let formation = Formation::start()
            .await
            .map_err(|e| format!("cannot start a pg_auto_failover formation: {e}"))?;
        ChaosDatabase::AutoFailover(Box::new(formation))
    } else if let Some(replication) = replication {
        let pair = ReplicaPair::start(replication)
            .await
            .map_err(|e| format!("cannot start a throwaway primary and standby: {e}"))?;
        ChaosDatabase::Replicated(pair)
    } else if postgres {
        let cluster = PgCluster::start()
            .await
            .map_err(|e| format!("cannot start a throwaway PostgreSQL cluster: {e}"))?;
        ChaosDatabase::Postgres(cluster)
    } else {
        ChaosDatabase::Sqlite(tempfile::tempdir().map_err(|e| e.to_string())?)
    };
    let url = database.url();
    let judge_url = database.judge_url();
    // The schema and the app's tables, once, before the nodes race for them.
    drop(
        payments::open(&url)
            .await
            .map_err(|e| format!("cannot prepare the database: {e}"))?,
    );
    let pair = Arc::new(Mutex::new(None));
    let formation = Arc::new(Mutex::new(None));
    let (cluster, _sqlite_dir) = match database {
        ChaosDatabase::Postgres(cluster) => (Arc::new(Mutex::new(Some(cluster))), None),
        ChaosDatabase::Replicated(replicated) => {
            *pair.lock().await = Some(replicated);
            (Arc::new(Mutex::new(None)), None)
        }
        ChaosDatabase::AutoFailover(formed) => {
            *formation.lock().await = Some(*formed);
            (Arc::new(Mutex::new(None)), None)
        }
        ChaosDatabase::Sqlite(dir) => (Arc::new(Mutex::new(None)), Some(dir)),
    };
    let judge = Judge::connect(&judge_url)
        .await
        .map_err(|e| e.to_string())?;

    let chaos = Arc::new(Chaos {
        spec: NodeSpec {
            bin: node_bin,
            database_url: url.clone(),
            receipt_url: receipts.url(),
            render_ms: args.render_ms,
            lease_ms: args.lease_ms,
            concurrency: args.concurrency,
            out_dir: out_dir.clone(),
            log_dir: log_dir.clone(),
            secret: STRIPE_SECRET.to_owned(),
        },
        slots: Mutex::new(
            (0..args.nodes)
                .map(|_| Slot {
                    node: None,
                    generation: 0,
                    frozen: false,
                    protected_until: Instant::now(),
                })
                .collect(),
        ),
        targets: Arc::new(Targets::new(args.nodes)),
        judge: judge.clone(),
        orphans: Arc::new(Orphans::default()),
        all_counts: std::sync::Mutex::new(Vec::new()),
        kills: AtomicU64::new(0),
        zombie_fenced: AtomicU64::new(0),
        zombies: AtomicU64::new(0),
        db_restarts: AtomicU64::new(0),
        db_down_ms: AtomicU64::new(0),
        failover: std::sync::Mutex::new(None),
        old_primary: std::sync::Mutex::new(None),
    });
    let mut starting = JoinSet::new();
    for slot in 0..args.nodes {
        let chaos = Arc::clone(&chaos);
        starting.spawn(async move { chaos.start_node(slot, 0).await });
    }
    while let Some(started) = starting.join_next().await {
        started.map_err(|e| e.to_string())??;
    }

    // The deliveries, on the plan's schedule.
    let duration = Duration::from_secs(args.duration);
    let plan = Arc::new(Plan::new(
        seed,
        args.events,
        args.customers,
        duration.mul_f64(0.7),
    ));
    let tally = Arc::new(SendTally::default());
    let provider = Provider::new(
        STRIPE_SECRET,
        Arc::clone(&chaos.targets),
        Arc::clone(&tally),
    );
    let give_up = CancellationToken::new();
    let in_flight = Arc::new(Semaphore::new(args.in_flight.max(1)));
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let chaos_started = Instant::now();
    let mut deliveries = JoinSet::new();
    for delivery in plan.deliveries.iter().copied() {
        let (plan, provider, give_up, in_flight, acked) = (
            Arc::clone(&plan),
            provider.clone(),
            give_up.clone(),
            Arc::clone(&in_flight),
            Arc::clone(&acked),
        );
        deliveries.spawn(async move {
            tokio::time::sleep_until(chaos_started + delivery.at).await;
            let _permit = in_flight.acquire_owned().await;
            let delivered = provider
                .deliver(&plan.events[delivery.event].body, &give_up)
                .await;
            if delivered != Delivered::GaveUp {
                acked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((delivery.event, Instant::now()));
            }
            delivered
        });
    }

    // The chaos: kills all along; a zombie, then a database restart.
    let orphan_watch = CancellationToken::new();
    let watcher =
        tokio::spawn(Arc::clone(&chaos.orphans).watch(judge.clone(), orphan_watch.clone()));
    let stop_kills = CancellationToken::new();
    // A failover run has one fault: the database's.
    let killer = if !failing_over {
        tokio::spawn(Arc::clone(&chaos).killer(stop_kills.clone()))
    } else {
        tokio::spawn(async { Ok(()) })
    };
    let progress = tokio::spawn(progress(
        Arc::clone(&chaos),
        Arc::clone(&tally),
        chaos_started,
        orphan_watch.clone(),
    ));
    let incidents = {
        let (chaos, provider, plan, give_up, cluster, pair, formation, tally, acked) = (
            Arc::clone(&chaos),
            provider.clone(),
            Arc::clone(&plan),
            give_up.clone(),
            Arc::clone(&cluster),
            Arc::clone(&pair),
            Arc::clone(&formation),
            Arc::clone(&tally),
            Arc::clone(&acked),
        );
        let lease = Duration::from_millis(args.lease_ms);
        let promote_after = Duration::from_millis(args.promote_after_ms);
        let cut_standby = Duration::from_millis(args.cut_standby_ms);
        async move {
            if !postgres {
                return Ok::<(), String>(());
            }
            if automatic {
                tokio::time::sleep_until(chaos_started + duration.mul_f64(0.5)).await;
                let mut guard = formation.lock().await;
                let Some(formation) = guard.as_mut() else {
                    return Ok(());
                };
                let (old, figures) = auto_failover::fail_over(AutoFailover {
                    formation,
                    provider: &provider,
                    tally: &tally,
                    acked: &acked,
                    plan: &plan,
                    judge: &chaos.judge,
                    give_up: &give_up,
                })
                .await?;
                *chaos
                    .failover
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(figures);
                *chaos
                    .old_primary
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(old);
                return Ok(());
            }
            if replication.is_some() {
                tokio::time::sleep_until(chaos_started + duration.mul_f64(0.5)).await;
                return chaos
                    .fail_over(FailoverPlan {
                        pair: &pair,
                        provider: &provider,
                        tally: &tally,
                        acked: &acked,
                        plan: &plan,
                        promote_after,
                        cut_standby,
                        give_up: &give_up,
                    })
                    .await;
            }
            tokio::time::sleep_until(chaos_started + duration.mul_f64(0.2)).await;
            chaos.zombie(lease).await?;
            tokio::time::sleep_until(chaos_started + duration.mul_f64(0.6)).await;
            if let Some(event) = plan.events.first() {
                chaos
                    .restart_database(&cluster, &provider, &event.body, &give_up)
                    .await?;
            }
            Ok(())
        }
    };
    let (incidents, ()) = tokio::join!(
        incidents,
        tokio::time::sleep_until(chaos_started + duration)
    );
    stop_kills.cancel();
    incidents?;
    killer.await.map_err(|e| e.to_string())??;
    let chaos_secs = chaos_started.elapsed().as_secs_f64();

    // The drain: every slot runs a node, every delivery gets its 2xx, every
    // event finishes, every orphan is claimed again.
    let drain_started = Instant::now();
    let drain_deadline = drain_started + Duration::from_secs(args.drain);
    for slot in 0..args.nodes {
        let (empty, generation) = {
            let slots = chaos.slots.lock().await;
            (slots[slot].node.is_none(), slots[slot].generation)
        };
        if empty {
            chaos.start_node(slot, generation + 1).await?;
        }
    }
    let mut delivered = Vec::with_capacity(plan.deliveries.len());
    loop {
        let next = if give_up.is_cancelled() {
            deliveries.join_next().await
        } else {
            match tokio::time::timeout_at(drain_deadline, deliveries.join_next()).await {
                Ok(next) => next,
                Err(_) => {
                    eprintln!(
                        "chaos: deliveries still unanswered at the drain deadline; giving up on them"
                    );
                    give_up.cancel();
                    continue;
                }
            }
        };
        match next {
            Some(joined) => delivered.push(joined.map_err(|e| e.to_string())?),
            None => break,
        }
    }
    loop {
        let done = match judge.tallies().await {
            Ok(t) => t.active == 0 && t.events >= plan.events.len() as i64,
            Err(_) => false,
        };
        if (done && chaos.orphans.still_waiting() == 0) || Instant::now() >= drain_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let drain_secs = drain_started.elapsed().as_secs_f64();
    orphan_watch.cancel();
    let _ = watcher.await;
    let _ = progress.await;

    let mut clean_exits = 0;
    let nodes: Vec<Node> = {
        let mut slots = chaos.slots.lock().await;
        slots.iter_mut().filter_map(|s| s.node.take()).collect()
    };
    let mut stopping = JoinSet::new();
    for node in nodes {
        stopping.spawn(node.terminate(Duration::from_secs(20)));
    }
    while let Some(stopped) = stopping.join_next().await {
        if stopped.map_err(|e| e.to_string())?.0 {
            clean_exits += 1;
        }
    }

    // With pg_auto_failover: the old primary, a standby again, must hold
    // exactly what the new primary holds.
    let old_primary = *chaos
        .old_primary
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let (Some(old), Some(formation)) = (old_primary, formation.lock().await.as_ref()) {
        let mut failover = chaos
            .failover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(rejoin) = failover.as_mut().and_then(|f| f.rejoin.as_mut()) {
            auto_failover::verify_rejoined(formation, old, rejoin).await?;
        }
        *chaos
            .failover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = failover;
    }

    // The figures.
    let tallies = judge.tallies().await.map_err(|e| e.to_string())?;
    let balances = judge.balances().await.map_err(|e| e.to_string())?;
    let expected = plan.expected_balances();
    let (customers, ledger_mismatches) = compare_ledgers(&balances, &expected);
    let receipt = receipts.tally();
    let wanted_keys: std::collections::HashSet<String> = plan
        .events
        .iter()
        .map(|e| tickmark::idempotency_key("stripe", &e.id, "send_receipt"))
        .collect();
    let seen_keys: std::collections::HashSet<String> = receipt.keys.keys().cloned().collect();
    let accepted_ids: std::collections::HashSet<String> = judge
        .event_ids()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let sent_ids: std::collections::HashSet<String> =
        plan.events.iter().map(|e| e.id.clone()).collect();
    if accepted_ids != sent_ids {
        eprintln!(
            "chaos: accepted ids differ from sent ids: {} accepted, {} sent",
            accepted_ids.len(),
            sent_ids.len()
        );
    }
    let invoices = count_invoices(&out_dir);
    let logs = LogCounts::default();
    for counts in chaos
        .all_counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        logs.add(counts);
    }
    let (orphaned_by_kills, longest_kill) = chaos.orphans.summary(Cause::Kill);
    let (orphaned_by_freeze, longest_freeze) = chaos.orphans.summary(Cause::Freeze);
    let millis = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let figures = Figures {
        backend: if postgres { "postgres" } else { "sqlite" }.to_owned(),
        seed,
        nodes: args.nodes,
        lease_ms: args.lease_ms,
        render_ms: args.render_ms,
        chaos_secs,
        drain_secs,
        total_secs: started.elapsed().as_secs_f64(),
        events_sent: plan.events.len() as u64,
        deliveries: delivered.len() as u64 + get(&chaos.db_restarts) + u64::from(failing_over),
        attempts: SendTally::get(&tally.attempts),
        answered_new: SendTally::get(&tally.new),
        answered_duplicate: SendTally::get(&tally.duplicate),
        answers_503: SendTally::get(&tally.unavailable_503),
        connection_errors: SendTally::get(&tally.connection_errors),
        timeouts: SendTally::get(&tally.timeouts),
        unexpected_answers: SendTally::get(&tally.unexpected) + SendTally::get(&tally.other_2xx),
        unexpected_samples: tally
            .unexpected_samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        given_up: SendTally::get(&tally.given_up),
        kills: get(&chaos.kills),
        zombies: get(&chaos.zombies),
        zombie_fenced: get(&chaos.zombie_fenced),
        db_restarts: get(&chaos.db_restarts),
        db_down_ms: get(&chaos.db_down_ms),
        events_accepted: tallies.events,
        events_done: tallies.done,
        events_active: tallies.active,
        events_stuck: tallies.stuck,
        customers,
        ledger_mismatches,
        invoices,
        receipt_calls: receipt.calls + receipt.without_key,
        receipt_keys: receipt.keys.len() as u64,
        receipt_keys_match_events: seen_keys == wanted_keys && receipt.without_key == 0,
        steps_done: tallies.steps_done,
        steps_rerun: tallies.reruns,
        takeovers: tallies.takeovers,
        failed_attempts: get(&logs.steps_failed),
        marks_refused: get(&logs.mark_refused),
        leases_lost: get(&logs.lease_lost) + get(&logs.lease_expired),
        panics: get(&logs.panics),
        orphaned_by_kills,
        longest_wait_after_kill_ms: millis(longest_kill),
        orphaned_by_freeze,
        longest_wait_after_freeze_ms: millis(longest_freeze),
        orphans_left: chaos.orphans.still_waiting(),
        clean_exits,
        failover: chaos
            .failover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .map(|mut failover| {
                let fault_at = *tally
                    .fault_at
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let accepted_at = *tally
                    .first_2xx_after_fault
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                failover.kill_to_accepted_ms = fault_at.zip(accepted_at).map(|(fault, first)| {
                    u64::try_from((first - fault).as_millis()).unwrap_or(u64::MAX)
                });
                failover
            }),
    };
    judge.close().await;

    println!();
    print!("{}", figures.table());
    println!();
    let checks = figures.checks();
    for check in &checks {
        let mark = if check.ok { "ok  " } else { "FAIL" };
        println!("{mark} {}: {}", check.name, check.detail);
    }
    let ok = checks.iter().all(|c| c.ok);
    println!("{}", figures.json_line());
    if !ok || args.keep {
        let kept = work.keep();
        eprintln!("chaos: node logs and invoices kept in {}", kept.display());
    }
    // The throwaway clusters stop and are removed here.
    cluster.lock().await.take();
    pair.lock().await.take();
    formation.lock().await.take();
    Ok(ok)
}

/// How many customers appear in either ledger, and how many of them have
/// a balance other than the expected one (or none).
fn compare_ledgers(actual: &[(String, i64)], expected: &[(String, i64)]) -> (usize, usize) {
    let actual: std::collections::BTreeMap<&str, i64> =
        actual.iter().map(|(c, b)| (c.as_str(), *b)).collect();
    let expected: std::collections::BTreeMap<&str, i64> =
        expected.iter().map(|(c, b)| (c.as_str(), *b)).collect();
    let customers: std::collections::BTreeSet<&str> =
        actual.keys().chain(expected.keys()).copied().collect();
    let wrong = customers
        .iter()
        .filter(|customer| actual.get(*customer) != expected.get(*customer))
        .count();
    (customers.len(), wrong)
}

/// Invoice files in `dir` (not the temp files a killed render left behind).
fn count_invoices(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| {
                    let name = entry.file_name();
                    let name = name.to_string_lossy();
                    name.ends_with(".txt") && !name.starts_with('.')
                })
                .count()
        })
        .unwrap_or(0)
}
