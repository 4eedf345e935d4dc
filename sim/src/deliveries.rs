//! The deliveries of a run: which events, how many copies of each, and when
//! each copy arrives (duplicated, delayed, out of order), and the sender
//! that retries a copy, as providers do, until a process answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tickmark::NewEvent;

use crate::dice::Dice;
use crate::journal::{Fault, Journal};
use crate::steps::{ORDERED, PAYMENT, SOURCE};
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

/// The events of a run and when each copy of each is delivered.
pub fn plan_deliveries(dice: &Dice, journal: &Journal) -> Vec<Delivered> {
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
