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

use tickmark::operator::{Actor, Operations, RetryRequest};
use tickmark::store::sqlite::{SqliteOptions, SqliteStore};
use tickmark::store::Store;
use tickmark::{Engine, EventState, NewEvent, WorkerConfig};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::SimClock;
use crate::db::DbThread;
use crate::dice::Dice;
use crate::invariants::{check, Delivered};
use crate::journal::{Fault, Journal};
use crate::process::{FaultSwitch, ProcessState, SimStore, World};
use crate::steps::{handlers, SimContext, LEDGER_TABLE, ORDERED, PAYMENT, SOURCE};
use crate::variant::Variant;
use crate::{RunReport, SimError};

/// How many worker processes share the file.
const PROCESSES: usize = 3;
/// Deliveries arrive within this long of the start.
const DELIVERIES_WITHIN: Duration = Duration::from_secs(60);
/// Faults are injected for this long.
const CHAOS_FOR: Duration = Duration::from_secs(90);
/// After the faults stop, every event must be final within this long.
const SETTLE_WITHIN: Duration = Duration::from_secs(30 * 60);
/// The workers' lease.
const LEASE: Duration = Duration::from_secs(10);

/// One process slot: its current incarnation.
struct Slot {
    state: Arc<ProcessState>,
    engine: Engine,
    task: JoinHandle<()>,
    incarnation: u32,
}

/// Everything a run shares between its tasks.
#[derive(Clone)]
struct Run {
    world: World,
    stores: Vec<Arc<SqliteStore>>,
    slots: Arc<Mutex<Vec<Slot>>>,
    clock: SimClock,
}

impl Run {
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start incarnation `incarnation` of process `index`.
    fn start(&self, index: usize, incarnation: u32) -> Result<Slot, SimError> {
        let name = format!("p{index}.{incarnation}");
        let state = ProcessState::new(name.clone());
        let inner = Arc::clone(&self.stores[index]);
        let store: Arc<dyn Store> = Arc::new(SimStore::new(
            Arc::clone(&inner),
            Arc::clone(&state),
            self.world.clone(),
        ));
        let engine = Engine::new(store, handlers(self.world.variant))?.with_resource(SimContext {
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
    fn receiver(&self) -> Option<(Engine, Arc<ProcessState>)> {
        let slots = self.slots();
        let up: Vec<usize> = (0..slots.len())
            .filter(|&i| !slots[i].state.is_crashed() && !slots[i].state.is_paused())
            .collect();
        let index = *self.world.dice.pick(&up)?;
        Some((slots[index].engine.clone(), Arc::clone(&slots[index].state)))
    }
}

/// Run seed `seed` against `variant`.
pub fn run(seed: u64, variant: Variant) -> Result<RunReport, SimError> {
    tickmark::jitter::seed_this_thread(Some(seed.rotate_left(17) ^ 0x5eed));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let report = runtime.block_on(run_in_runtime(seed, variant));
    // The processes' tasks (hung crashed ones included) go with the runtime.
    runtime.shutdown_background();
    tickmark::jitter::seed_this_thread(None);
    report
}

async fn run_in_runtime(seed: u64, variant: Variant) -> Result<RunReport, SimError> {
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
        },
        stores,
        slots: Arc::default(),
        clock: clock.clone(),
    };
    for index in 0..PROCESSES {
        let slot = run.start(index, 0)?;
        run.slots().push(slot);
    }

    let deliveries = plan_deliveries(&dice, &journal);
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

/// The events of a run and when each copy of each is delivered.
fn plan_deliveries(dice: &Dice, journal: &Journal) -> Vec<Delivered> {
    let count = 12 + dice.below(0..13) as usize;
    let mut next_seq = [0i64; 2];
    (0..count)
        .map(|i| {
            let ordered = dice.chance(0.3);
            let (kind, payload) = if ordered {
                let account = dice.below(0..2) as usize;
                next_seq[account] += 1;
                (
                    ORDERED,
                    serde_json::json!({ "account": format!("acct_{account}"), "seq": next_seq[account] }),
                )
            } else {
                (PAYMENT, serde_json::json!({ "amount": 100 + i }))
            };
            let mut copies = vec![dice.millis(0..DELIVERIES_WITHIN.as_millis() as u64)];
            while copies.len() < 3 && dice.chance(0.3) {
                copies.push(dice.millis(0..DELIVERIES_WITHIN.as_millis() as u64));
            }
            let id = format!("evt_{i}");
            if copies.len() > 1 {
                journal.fault(
                    Fault::DuplicateDelivery,
                    format!("{id} is delivered {} times", copies.len()),
                );
            }
            Delivered {
                id,
                kind: kind.to_owned(),
                payload,
                copies,
            }
        })
        .collect()
}

/// Send one copy of a delivery at `at`, retrying (as providers do) until a
/// process answers.
async fn send(run: Run, delivery: Delivered, at: Duration, acknowledged: Arc<AtomicUsize>) {
    tokio::time::sleep(at).await;
    let journal = &run.world.journal;
    loop {
        let Some((engine, process)) = run.receiver() else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let event = NewEvent::with_id(
            SOURCE,
            &delivery.id,
            &delivery.kind,
            delivery.payload.clone(),
        );
        let name = &process.name;
        // A crash breaks the connection: the sender sees an error, not a hang.
        let answer = tokio::select! {
            biased;
            answer = engine.accept(event) => answer.map_err(|error| error.to_string()),
            _ = process.died().cancelled() => Err("connection reset: the process crashed".to_owned()),
        };
        match answer {
            Ok(accepted) => {
                if accepted.is_new() {
                    journal.answered_new(&delivery.id);
                }
                journal.note(format!(
                    "deliver {} to {name}: 200 ({})",
                    delivery.id,
                    if accepted.is_new() {
                        "new"
                    } else {
                        "duplicate"
                    }
                ));
                acknowledged.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Err(error) => {
                journal.note(format!(
                    "deliver {} to {name}: 503 ({error}); the sender retries",
                    delivery.id
                ));
                tokio::time::sleep(run.world.dice.millis(500..3_000)).await;
            }
        }
    }
}

/// Inject faults for `CHAOS_FOR`.
async fn chaos(run: &Run) -> Result<(), SimError> {
    let dice = &run.world.dice;
    let journal = &run.world.journal;
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let start = Instant::now();
    while start.elapsed() < CHAOS_FOR {
        tokio::time::sleep(dice.millis(300..5_000)).await;
        let now = Instant::now();
        let due: Vec<usize> = restarts
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|&(_, i)| i)
            .collect();
        restarts.retain(|(at, _)| *at > now);
        for index in due {
            let incarnation = run.slots()[index].incarnation + 1;
            let slot = run.start(index, incarnation)?;
            run.slots()[index] = slot;
        }
        let roll = dice.below(0..100);
        match roll {
            0..=24 => {
                let alive: Vec<usize> = {
                    let slots = run.slots();
                    (0..slots.len())
                        .filter(|&i| !slots[i].state.is_crashed())
                        .collect()
                };
                if let Some(&index) = dice.pick(&alive) {
                    let slots = run.slots();
                    journal.fault(Fault::Crash, &slots[index].state.name);
                    slots[index].state.crash();
                    slots[index].task.abort();
                    restarts.push((now + dice.millis(500..15_000), index));
                }
            }
            25..=39 => {
                let slots = run.slots();
                let up: Vec<usize> = (0..slots.len())
                    .filter(|&i| !slots[i].state.is_crashed() && !slots[i].state.is_paused())
                    .collect();
                if let Some(&index) = dice.pick(&up) {
                    let pause = dice.millis(LEASE.as_millis() as u64 + 1_000..40_000);
                    journal.fault(
                        Fault::Pause,
                        format!(
                            "{} for {:.1}s",
                            slots[index].state.name,
                            pause.as_secs_f64()
                        ),
                    );
                    slots[index].state.pause_until(now + pause);
                }
            }
            40..=47 => {
                let by = dice.millis(2_000..30_000);
                journal.fault(
                    Fault::ClockJump,
                    format!("wall clock +{:.1}s", by.as_secs_f64()),
                );
                run.clock.jump(by);
            }
            48..=79 => operator_action(run).await?,
            _ => {}
        }
    }
    Ok(())
}

/// An operator acts on a random event, as `tickmark events …` would.
async fn operator_action(run: &Run) -> Result<(), SimError> {
    let dice = &run.world.dice;
    let journal = &run.world.journal;
    let store = &run.stores[0];
    let db = &run.world.db;
    let last: Option<i64> = db
        .block(sqlx::query_scalar("SELECT max(id) FROM tickmark_events").fetch_one(store.pool()))?;
    let Some(last) = last else { return Ok(()) };
    let seq = 1 + dice.below(0..last as u64) as i64;
    let Some(record) = db.block(store.event_get(seq))? else {
        return Ok(());
    };
    let actor = Actor {
        who: "sim-operator",
        reason: Some("simulated"),
    };
    let (fault, done) = match record.state {
        EventState::Dead if dice.chance(0.5) => {
            let request = RetryRequest {
                event_seq: seq,
                from_step: None,
                force: false,
                actor,
            };
            (
                Fault::OperatorRetry,
                db.block(store.event_retry(&request)).map(|_| ()),
            )
        }
        EventState::Dead => {
            let step = current_step_name(&record.event.kind, record.next_step);
            (
                Fault::OperatorSkip,
                db.block(store.step_skip(seq, step, actor)).map(|_| ()),
            )
        }
        EventState::Pending | EventState::Running if dice.chance(0.3) => (
            Fault::OperatorCancel,
            db.block(store.event_cancel(seq, actor)).map(|_| ()),
        ),
        _ => return Ok(()),
    };
    match done {
        Ok(()) => {
            journal.operator_changed(seq);
            journal.fault(fault, format!("e{seq} ({}): done", record.state.as_str()));
        }
        Err(error) => {
            journal.note(format!(
                "operator {} on e{seq} refused: {error}",
                fault.name()
            ));
        }
    }
    Ok(())
}

fn current_step_name(kind: &str, next_step: i32) -> &'static str {
    match (kind, next_step) {
        (PAYMENT, 0) => "charge",
        (PAYMENT, 1) => "ledger",
        (PAYMENT, _) => "receipt",
        _ => "apply",
    }
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
