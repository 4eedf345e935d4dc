//! The deliveries of a run: which events, how many copies of each, and when
//! each copy arrives (duplicated, delayed, out of order), and the sender
//! that retries a copy, as providers do, until a process answers. Among
//! them, one shop floods the inbox while a few quiet shops send one or two
//! events each (fair share across tenants).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tickmark::NewEvent;

use crate::dice::Dice;
use crate::journal::{Fault, Journal};
use crate::steps::{ORDERED, PAYMENT, SOURCE, SYNC};
use crate::world::Run;

/// Deliveries arrive within this long of the start.
const DELIVERIES_WITHIN: Duration = Duration::from_secs(60);

/// One event of the run and when each copy of it is delivered.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Its provider id (the dedup key).
    pub id: String,
    /// Its kind.
    pub kind: String,
    /// Its body.
    pub payload: serde_json::Value,
    /// When each copy is sent, from the start.
    pub copies: Vec<Duration>,
}

/// What a run delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workload {
    /// Payments, ordered events, and the shops' syncs (fair share).
    #[default]
    Everything,
    /// Payments and ordered events only, with no `sync` handler: the runs
    /// of the simulator before the shops joined it, draw for draw. The
    /// seeds that found bugs then (`sim/tests/simulation.rs`) replay their
    /// schedules with it.
    WithoutShops,
}

/// The events of a run and when each copy of each is delivered: payments
/// and ordered events at random moments of the first minute, then (with
/// [`Workload::Everything`]) one shop's flood of syncs with a few quiet
/// shops' syncs arriving behind it.
pub fn plan_deliveries(dice: &Dice, journal: &Journal, workload: Workload) -> Vec<Delivered> {
    let count = 12 + dice.below(0..13) as usize;
    let mut next_seq = [0i64; 2];
    // Each event's draws, its copies' included, before the next event's:
    // the order the runs before the shops drew in (`Workload::WithoutShops`
    // replays those runs draw for draw).
    let mut planned: Vec<Delivered> = (0..count)
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
            let first = dice.millis(0..DELIVERIES_WITHIN.as_millis() as u64);
            delivered(dice, journal, i, kind, payload, first)
        })
        .collect();
    if workload == Workload::Everything {
        let shops = plan_shops(dice);
        for (i, (kind, payload, first)) in (count..).zip(shops) {
            planned.push(delivered(dice, journal, i, kind, payload, first));
        }
    }
    planned
}

/// Event `evt_{i}`, first delivered at `first`, and its further copies
/// (duplicated deliveries, each at a random moment of the first minute).
fn delivered(
    dice: &Dice,
    journal: &Journal,
    i: usize,
    kind: &str,
    payload: serde_json::Value,
    first: Duration,
) -> Delivered {
    let mut copies = vec![first];
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
}

/// How many syncs the loud shop's flood holds (a bulk import).
const FLOOD: Range<u64> = 6..10;
/// The flood begins at a moment of this span from the start...
const FLOOD_WITHIN: Duration = Duration::from_secs(30);
/// ...and all of it arrives within this many milliseconds.
const FLOOD_SPREAD_MS: u64 = 500;
/// How many quiet shops there are; each sends one or two syncs.
const QUIET_SHOPS: Range<u64> = 2..4;
/// A quiet shop's sync arrives this long after the flood began, while the
/// flood is queued.
const QUIET_AFTER_MS: Range<u64> = 200..5_000;

/// The syncs of the tenants (`steps::SYNC`): the loud shop's flood, and
/// the quiet shops' syncs behind it, with when each is first delivered.
fn plan_shops(dice: &Dice) -> Vec<(&'static str, serde_json::Value, Duration)> {
    let flood_at = dice.millis(0..FLOOD_WITHIN.as_millis() as u64);
    let mut planned: Vec<_> = (0..dice.below(FLOOD))
        .map(|n| {
            let at = flood_at + dice.millis(0..FLOOD_SPREAD_MS);
            (SYNC, serde_json::json!({ "shop": "loud", "n": n }), at)
        })
        .collect();
    for shop in 0..dice.below(QUIET_SHOPS) {
        for n in 0..dice.below(1..3) {
            let at = flood_at + dice.millis(QUIET_AFTER_MS);
            let payload = serde_json::json!({ "shop": format!("quiet_{shop}"), "n": n });
            planned.push((SYNC, payload, at));
        }
    }
    planned
}

/// Send one copy of a delivery at `at`, retrying (as providers do) until a
/// process answers.
pub async fn send(run: Run, delivery: Delivered, at: Duration, acknowledged: Arc<AtomicUsize>) {
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
