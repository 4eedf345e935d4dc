//! One simulated run, decided by its seed: three worker processes on one
//! SQLite file, a stream of deliveries (some duplicated, delayed and out of
//! order), and, for the first minutes, faults: crashes, pauses past the
//! lease, failing store calls, clock jumps and operator actions. Then the
//! faults stop, crashed processes restart, and every event must reach a
//! final state in bounded simulated time. The invariants are checked at
//! the end (and some as the run goes, in the journal).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tickmark::store::sqlite::{SqliteOptions, SqliteStore};
use tickmark::store::Store;
use tickmark::{Engine, WorkerConfig};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::chaos::chaos;
use crate::clock::SimClock;
use crate::db::DbThread;
use crate::deliveries::{plan_deliveries, send, Workload};
use crate::dice::Dice;
use crate::invariants::check;
use crate::journal::Journal;
use crate::process::{FaultSwitch, ProcessState};
use crate::sim_store::{SimStore, World};
use crate::steps::{handlers, SimContext, LEDGER_TABLE};
use crate::variant::Variant;
use crate::{RunReport, SimError};

/// How many worker processes share the file.
const PROCESSES: usize = 3;
/// After the faults stop, every event must be final within this long.
const SETTLE_WITHIN: Duration = Duration::from_secs(30 * 60);
/// The workers' lease.
pub const LEASE: Duration = Duration::from_secs(10);

/// One process slot: its current incarnation.
pub struct Slot {
    /// The incarnation's life.
    pub state: Arc<ProcessState>,
    /// Its engine (deliveries are accepted through it).
    pub engine: Engine,
    /// Its worker's task.
    pub task: JoinHandle<()>,
    /// How many times the process has started before.
    pub incarnation: u32,
}

/// Everything a run shares between its tasks.
#[derive(Clone)]
pub struct Run {
    /// What the processes' stores share.
    pub world: World,
    /// Each process slot's store, kept across its incarnations.
    pub stores: Vec<Arc<SqliteStore>>,
    /// The processes.
    pub slots: Arc<Mutex<Vec<Slot>>>,
    /// The simulated clock.
    pub clock: SimClock,
}

impl Run {
    pub fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start incarnation `incarnation` of process `index`.
    pub fn start(&self, index: usize, incarnation: u32) -> Result<Slot, SimError> {
        let name = format!("p{index}.{incarnation}");
        let state = ProcessState::new(name.clone());
        let inner = Arc::clone(&self.stores[index]);
        let store: Arc<dyn Store> = Arc::new(SimStore::new(
            Arc::clone(&inner),
            Arc::clone(&state),
            self.world.clone(),
        ));
        let engine = Engine::new(store, handlers(self.world.variant, self.world.workload))?
            .with_resource(SimContext {
                journal: self.world.journal.clone(),
                process: Arc::clone(&state),
                dice: self.world.dice.clone(),
                db: Arc::clone(&self.world.db),
                pool: inner.pool().clone(),
            });
        let config = WorkerConfig::default()
            .with_name(name.clone())
            .with_lease(LEASE)
            .with_concurrency(2)
            .with_poll_every(Duration::from_secs(1));
        let worker = engine.worker(config)?;
        let journal = self.world.journal.clone();
        journal.note(format!("{name} starts"));
        let task = tokio::spawn(async move {
            if let Err(error) = worker.run(CancellationToken::new()).await {
                journal.note(format!("{name} worker stopped: {error}"));
            }
        });
        Ok(Slot {
            state,
            engine,
            task,
            incarnation,
        })
    }

    /// A process that can take a delivery now (alive and not paused).
    pub fn receiver(&self) -> Option<(Engine, Arc<ProcessState>)> {
        let slots = self.slots();
        let up: Vec<usize> = (0..slots.len())
            .filter(|&i| !slots[i].state.is_crashed() && !slots[i].state.is_paused())
            .collect();
        let index = *self.world.dice.pick(&up)?;
        Some((slots[index].engine.clone(), Arc::clone(&slots[index].state)))
    }
}

/// Run seed `seed` against `variant`, with every kind of delivery.
pub fn run(seed: u64, variant: Variant) -> Result<RunReport, SimError> {
    run_with(seed, variant, Workload::Everything)
}

/// Run seed `seed` against `variant`, delivering `workload`.
pub fn run_with(seed: u64, variant: Variant, workload: Workload) -> Result<RunReport, SimError> {
    tickmark_driver::jitter::seed_this_thread(Some(seed.rotate_left(17) ^ 0x5eed));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let report = runtime.block_on(run_in_runtime(seed, variant, workload));
    // The processes' tasks (hung crashed ones included) go with the runtime.
    runtime.shutdown_background();
    tickmark_driver::jitter::seed_this_thread(None);
    report
}

async fn run_in_runtime(
    seed: u64,
    variant: Variant,
    workload: Workload,
) -> Result<RunReport, SimError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("sim.db").display());
    let clock = SimClock::start();
    let db = Arc::new(DbThread::start(clock.clone())?);
    let journal = Journal::new(clock.clone());
    let dice = Dice::new(seed);
    let faults = FaultSwitch::new(0.03, 0.02);
    let mut stores = Vec::new();
    for _ in 0..PROCESSES {
        let options = SqliteOptions {
            clock: clock.for_store(),
            ..SqliteOptions::default()
        };
        stores.push(Arc::new(
            db.block(SqliteStore::connect_with(&url, options))?,
        ));
    }
    db.block(sqlx::query(LEDGER_TABLE).execute(stores[0].pool()))?;
    let run = Run {
        world: World {
            db: Arc::clone(&db),
            dice: dice.clone(),
            journal: journal.clone(),
            faults: Arc::clone(&faults),
            variant,
            workload,
        },
        stores,
        slots: Arc::default(),
        clock: clock.clone(),
    };
    for index in 0..PROCESSES {
        let slot = run.start(index, 0)?;
        run.slots().push(slot);
    }

    let deliveries = plan_deliveries(&dice, &journal, workload);
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let copies: usize = deliveries.iter().map(|d| d.copies.len()).sum();
    for delivery in &deliveries {
        for &at in &delivery.copies {
            tokio::spawn(send(
                run.clone(),
                delivery.clone(),
                at,
                Arc::clone(&acknowledged),
            ));
        }
    }

    chaos(&run).await?;
    faults.heal();
    journal.note("HEAL: faults stop; paused processes resume, crashed ones restart");
    let crashed: Vec<(usize, u32)> = run
        .slots()
        .iter()
        .enumerate()
        .filter_map(|(i, slot)| {
            slot.state.resume();
            slot.state.is_crashed().then_some((i, slot.incarnation + 1))
        })
        .collect();
    for (index, incarnation) in crashed {
        let slot = run.start(index, incarnation)?;
        run.slots()[index] = slot;
    }

    let healed_at = Instant::now();
    let settled = loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let all_sent = acknowledged.load(Ordering::SeqCst) == copies;
        if all_sent && unfinished(&run).await? == 0 {
            break true;
        }
        if healed_at.elapsed() > SETTLE_WITHIN {
            break false;
        }
    };
    if settled {
        journal.note("SETTLED: every event is final");
    } else {
        journal.note(format!(
            "NOT SETTLED within the bound; wall clock {}, acknowledged {} of {copies} deliveries",
            journal.now().format("%H:%M:%S%.3f"),
            acknowledged.load(Ordering::SeqCst)
        ));
        let open: Vec<(i64, String, String, Option<String>, i32)> = db.block(
            sqlx::query_as(
                "SELECT id, state, due_at, lease_owner, next_step FROM tickmark_events \
                 WHERE state NOT IN ('done', 'dead', 'cancelled', 'stale')",
            )
            .fetch_all(run.stores[0].pool()),
        )?;
        for (seq, state, due_at, owner, next_step) in open {
            journal.note(format!(
                "  open: e{seq} {state} at step {next_step}, due {due_at}, lease owner {}",
                owner.unwrap_or_default()
            ));
        }
    }
    for slot in run.slots().iter() {
        slot.task.abort();
    }
    let checked = check(&run.stores[0], &db, &journal, &deliveries, settled).await?;
    Ok(RunReport {
        seed,
        variant,
        digest: journal.digest(),
        violations: journal.violations(),
        faults: journal.faults(),
        invariants_checked: checked,
        events: deliveries.len(),
        simulated: clock.elapsed(),
        trace: journal.trace(),
    })
}

/// Events not yet in a final state.
async fn unfinished(run: &Run) -> Result<i64, SimError> {
    let pool = run.stores[0].pool();
    Ok(run.world.db.block(
        sqlx::query_scalar(
            "SELECT count(*) FROM tickmark_events WHERE state NOT IN ('done', 'dead', 'cancelled', 'stale')",
        )
        .fetch_one(pool),
    )?)
}
