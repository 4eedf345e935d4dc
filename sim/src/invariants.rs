//! The checks made at the end of a run, against what the database holds
//! and what the journal saw. Each maps to a guarantee of
//! `docs/guarantees.md`; each failed check is a violation naming it.

use std::collections::{BTreeMap, HashMap};

use tickmark::store::sqlite::SqliteStore;

use crate::db::DbThread;
use crate::deliveries::Delivered;
use crate::journal::Journal;
use crate::steps::{LEDGER_POSITION, PAYMENT};
use crate::SimError;

/// Counts the checks made, and records the failed ones in the journal.
struct Checks<'a> {
    journal: &'a Journal,
    made: u64,
}

impl Checks<'_> {
    fn that(&mut self, holds: bool, violation: impl FnOnce() -> String) {
        self.made += 1;
        if !holds {
            self.journal.violation(violation());
        }
    }
}

/// Check every invariant; returns how many checks were made.
pub async fn check(
    store: &SqliteStore,
    db: &DbThread,
    journal: &Journal,
    deliveries: &[Delivered],
    settled: bool,
) -> Result<u64, SimError> {
    let pool = store.pool();
    let events: Vec<(i64, String, String, String, i32)> = db.block(
        sqlx::query_as("SELECT id, dedup_key, kind, state, step_count FROM tickmark_events")
            .fetch_all(pool),
    )?;
    let steps: Vec<(i64, i32, String)> = db.block(
        sqlx::query_as("SELECT event_seq, position, state FROM tickmark_steps").fetch_all(pool),
    )?;
    let ledger: Vec<(i64, i64)> = db.block(
        sqlx::query_as("SELECT event_seq, count(*) FROM sim_ledger GROUP BY event_seq")
            .fetch_all(pool),
    )?;
    let seen = journal.snapshot();
    let mut checks = Checks { journal, made: 0 };

    // 1, 2: every delivery is one event, answered `New` at most once.
    let mut rows_per_id: HashMap<&str, usize> = HashMap::new();
    for (_, id, ..) in &events {
        *rows_per_id.entry(id.as_str()).or_default() += 1;
    }
    for delivery in deliveries {
        let rows = rows_per_id.get(delivery.id.as_str()).copied().unwrap_or(0);
        checks.that(rows == 1, || {
            format!(
                "guarantee 1/2: delivery {} is {rows} events, not one",
                delivery.id
            )
        });
        let news = seen.new_answers.get(&delivery.id).copied().unwrap_or(0);
        checks.that(news <= 1, || {
            format!(
                "guarantee 2: delivery {} was answered `new` {news} times",
                delivery.id
            )
        });
    }

    // 3, 4: no attempt of a step starts after that step was marked done.
    for start in &seen.starts {
        if let Some(&marked) = seen.marked_done.get(&(start.seq, start.position)) {
            checks.that(start.at_entry < marked, || {
                format!(
                    "guarantee 4: step {} of e{} ran again after it was marked done",
                    start.position, start.seq
                )
            });
        }
    }

    // Every re-run of a step sent its effect with the same idempotency key.
    for ((seq, position), keys) in &seen.effects {
        checks.that(keys.len() == 1, || {
            format!(
                "idempotency: step {position} of e{seq} sent effects under {} keys",
                keys.len()
            )
        });
    }

    // 6: a transactional step's effect exists once if it was marked done,
    // else not at all.
    let status: HashMap<(i64, i32), &str> = steps
        .iter()
        .map(|(seq, pos, state)| ((*seq, *pos), state.as_str()))
        .collect();
    let ledger: HashMap<i64, i64> = ledger.into_iter().collect();
    for (seq, _, kind, ..) in &events {
        if kind != PAYMENT {
            continue;
        }
        let rows = ledger.get(seq).copied().unwrap_or(0);
        let want = i64::from(status.get(&(*seq, LEDGER_POSITION)) == Some(&"done"));
        checks.that(rows == want, || {
            format!("guarantee 6: e{seq}'s transactional ledger step left {rows} rows, not {want}")
        });
    }

    // 7: per account, an older sequence never runs after a newer one ran.
    for (account, runs) in &seen.ordered_runs {
        let mut newest = i64::MIN;
        for &sequence in runs {
            checks.that(sequence >= newest, || {
                format!("guarantee 7: {account}'s sequence {sequence} ran after {newest}")
            });
            newest = newest.max(sequence);
        }
    }

    // Liveness: once faults stopped, every event became final in bounded
    // time, and every done step of a done event sent its effect.
    checks.that(settled, || {
        let open: Vec<String> = events
            .iter()
            .filter(|(.., state, _)| {
                !matches!(state.as_str(), "done" | "dead" | "cancelled" | "stale")
            })
            .map(|(seq, _, _, state, _)| format!("e{seq} {state}"))
            .collect();
        format!(
            "liveness: not every event was final within the bound after the faults stopped: {}",
            open.join(", ")
        )
    });
    let mut done_steps: BTreeMap<i64, Vec<i32>> = BTreeMap::new();
    for (seq, position, state) in &steps {
        if state == "done" {
            done_steps.entry(*seq).or_default().push(*position);
        }
    }
    for (seq, _, kind, state, step_count) in &events {
        if state != "done" {
            continue;
        }
        let settled_steps = (0..*step_count)
            .filter(|p| matches!(status.get(&(*seq, *p)), Some(&"done" | &"skipped")))
            .count();
        checks.that(settled_steps == *step_count as usize, || {
            format!("liveness: e{seq} is done with {settled_steps} of {step_count} steps settled")
        });
        for &position in done_steps.get(seq).map(Vec::as_slice).unwrap_or_default() {
            let external = !(kind == PAYMENT && position == LEDGER_POSITION);
            if external {
                checks.that(seen.effects.contains_key(&(*seq, position)), || {
                    format!("accounting: step {position} of e{seq} is done but sent no effect")
                });
            }
        }
    }
    Ok(checks.made)
}
