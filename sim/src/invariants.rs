//! The checks made at the end of a run, against what the database holds
//! and what the journal saw. Each maps to a guarantee of
//! `docs/guarantees.md`; each failed check is a violation naming it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tickmark::store::sqlite::SqliteStore;

use crate::db::DbThread;
use crate::deliveries::Delivered;
use crate::journal::{BatchClaim, Journal};
use crate::steps::{LEDGER_POSITION, PAYMENT};
use crate::SimError;

/// The most events of any one tenant that batch claims lease while another
/// tenant waits, before they lease one of its own (every weight is 1 here).
///
/// Derived from the store's scheme (start-time fair queueing, in the claim:
/// `crates/tickmark-sqlite/src/fair.rs`, docs/flow_control.md). A tenant's
/// k-th candidate finishes at `max(pass, clock) + k/w`; a claim takes the
/// candidates in finish order, charges each tenant it served (`pass =
/// start + n/w`), and moves the clock to the start of the last event it
/// served, so no tenant's pass is ever more than `1/w` ahead of it. Say
/// tenant q waits from a claim at clock `c`: `pass_q <= c + 1/w_q`, and its
/// first candidate finishes at `F = max(pass_q, clock) + 1/w_q`. A claim
/// that leaves q out takes only candidates finishing by `F` (ties go by due
/// time), each starting by `max(pass_q, clock)`: the clock stays at most
/// `max(c, pass_q)`, and `F <= c + 2/w_q` all along. Another tenant x
/// starts no earlier than `c` and is served only what finishes by `F`: at
/// most `2 * w_x / w_q` events; 2 with equal weights. Whatever the batch
/// sizes, workers, number of tenants or order of the claims.
const FAIR_BOUND: usize = 2;

/// A tenant waiting for a batch claim to lease one of its events, and
/// what batch claims leased of other tenants meanwhile.
struct Wait<'a> {
    /// When it was first seen waiting (simulated seconds).
    since: f64,
    /// The events leased meanwhile, by tenant.
    leased: BTreeMap<&'a str, Vec<i64>>,
}

impl Wait<'_> {
    fn check(&self, tenant: &str, until: &str, checks: &mut Checks<'_>) {
        for (other, seqs) in &self.leased {
            checks.that(seqs.len() <= FAIR_BOUND, || {
                let seqs: Vec<String> = seqs.iter().map(|seq| format!("e{seq}")).collect();
                format!(
                    "fair share: tenant {tenant} waited from {:.3}s {until} while batch claims \
                     leased {} events of {other} ({}), more than {FAIR_BOUND}",
                    self.since,
                    seqs.len(),
                    seqs.join(", ")
                )
            });
        }
    }
}

/// Fair share across tenants: from the first batch claim that begins
/// while tenant q has an event it could take, until one leases an event of
/// q's, no other tenant gets more than [`FAIR_BOUND`] events leased. What
/// counts: batch claims that committed, the events they leased (takeovers
/// of expired leases included, and claims whose answer was lost); not the
/// claims that failed before reaching the store, nor claims alone (they
/// take suspects, never in fair shares). A claim that begins with q not
/// waiting (its event cancelled, say) ends the wait.
fn check_fair_share(claims: &[BatchClaim], checks: &mut Checks<'_>) {
    let mut waits: BTreeMap<&str, Wait<'_>> = BTreeMap::new();
    for claim in claims {
        let served: BTreeSet<&str> = claim.leased.iter().map(|(_, t)| t.as_str()).collect();
        let ended: Vec<&str> = waits
            .keys()
            .copied()
            .filter(|tenant| !claim.waiting.contains(*tenant) || served.contains(tenant))
            .collect();
        for tenant in ended {
            if let Some(wait) = waits.remove(tenant) {
                let until = if served.contains(tenant) {
                    format!("until {:.3}s", claim.at)
                } else {
                    format!("until it stopped waiting at {:.3}s", claim.at)
                };
                wait.check(tenant, &until, checks);
            }
        }
        for tenant in claim
            .waiting
            .iter()
            .filter(|t| !served.contains(t.as_str()))
        {
            let wait = waits.entry(tenant).or_insert_with(|| Wait {
                since: claim.at,
                leased: BTreeMap::new(),
            });
            for (seq, other) in &claim.leased {
                wait.leased.entry(other).or_default().push(*seq);
            }
        }
    }
    for (tenant, wait) in &waits {
        wait.check(tenant, "to the end", checks);
    }
}

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

    check_fair_share(&seen.batch_claims, &mut checks);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SimClock;

    fn claim(at: f64, waiting: &[&str], leased: &[(i64, &str)]) -> BatchClaim {
        BatchClaim {
            at,
            waiting: waiting.iter().map(|t| (*t).to_owned()).collect(),
            leased: leased.iter().map(|(s, t)| (*s, (*t).to_owned())).collect(),
        }
    }

    fn violations(claims: &[BatchClaim]) -> Vec<String> {
        let journal = Journal::new(SimClock::start());
        let mut checks = Checks {
            journal: &journal,
            made: 0,
        };
        check_fair_share(claims, &mut checks);
        journal.violations()
    }

    #[test]
    fn two_events_of_another_tenant_ahead_of_a_waiting_one_are_within_the_bound() {
        let claims = [
            claim(1.0, &["quiet"], &[(1, "loud")]),
            claim(2.0, &["quiet"], &[(2, "loud")]),
            claim(3.0, &[], &[(3, "quiet"), (4, "loud")]),
        ];
        assert_eq!(violations(&claims), Vec::<String>::new());
    }

    #[test]
    fn a_third_event_of_another_tenant_ahead_of_a_waiting_one_is_a_violation() {
        let claims = [
            claim(1.0, &["quiet"], &[(1, "loud"), (2, "loud")]),
            claim(2.0, &["quiet"], &[(3, "loud")]),
            claim(3.0, &[], &[(4, "quiet")]),
        ];
        let found = violations(&claims);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("3 events of loud (e1, e2, e3)"),
            "{found:?}"
        );
    }

    #[test]
    fn a_tenant_that_stopped_waiting_waits_afresh() {
        let claims = [
            claim(1.0, &["quiet"], &[(1, "loud"), (2, "loud")]),
            // Its event was cancelled: this claim begins with it not waiting.
            claim(2.0, &[], &[(3, "loud")]),
            claim(3.0, &["quiet"], &[(4, "loud"), (5, "loud")]),
        ];
        assert_eq!(violations(&claims), Vec::<String>::new());
    }
}
