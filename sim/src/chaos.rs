//! The faults a run injects while its chaos lasts: crashes, pauses past the
//! lease, clock jumps and operator actions, each drawn from the seed. (The
//! store's own faults, failing calls, are drawn in `sim_store.rs`.)

use std::time::Duration;

use tickmark::operator::{Actor, Operations, RetryRequest};
use tickmark::store::Store;
use tickmark::EventState;
use tokio::time::Instant;

use crate::journal::Fault;
use crate::steps::{PAYMENT, SYNC};
use crate::world::{Run, LEASE};
use crate::SimError;

/// The step an operator re-runs a done payment from: its receipt (an
/// external call, deduplicated by its key; re-running the transactional
/// ledger step would write its row again, by request).
const RERUN_FROM: (i32, &str) = (2, "receipt");

/// Faults are injected for this long.
pub const CHAOS_FOR: Duration = Duration::from_secs(90);

/// Inject faults for `CHAOS_FOR`.
pub async fn chaos(run: &Run) -> Result<(), SimError> {
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
        EventState::Done if record.event.kind == PAYMENT && dice.chance(0.3) => {
            // Re-run the last step on purpose; it keeps its idempotency key.
            let request = RetryRequest {
                event_seq: seq,
                from_step: Some(RERUN_FROM.1),
                force: false,
                actor,
            };
            let rerun = db.block(store.event_retry(&request)).map(|_| ());
            if rerun.is_ok() {
                journal.operator_rerun(seq, RERUN_FROM.0);
            }
            (Fault::OperatorRetryFromStep, rerun)
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
        (SYNC, _) => "sync",
        _ => "apply",
    }
}
