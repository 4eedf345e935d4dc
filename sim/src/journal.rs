//! What a simulated run did and saw: the trace (one line per store call,
//! fault, step and operator action, stamped with simulated time), the faults
//! injected by kind, and the facts the invariants are checked against. The
//! checks that can be made the moment something happens (a stale lease that
//! marked, a live lease taken over, a crashed process still talking to the
//! database) are made here, as it happens.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::clock::SimClock;

/// The kinds of fault a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// A process dies at an await point; nothing of it runs afterwards.
    Crash,
    /// A process stops past its lease, then resumes (a zombie).
    Pause,
    /// A store call fails before it reaches the database.
    StoreFailsBefore,
    /// A store call commits, then its caller is told it failed (a timeout).
    StoreFailsAfterCommit,
    /// The wall clock jumps forward.
    ClockJump,
    /// A delivery is sent more than once.
    DuplicateDelivery,
    /// An operator cancels an event.
    OperatorCancel,
    /// An operator retries a dead event.
    OperatorRetry,
    /// An operator re-runs a done event from a step.
    OperatorRetryFromStep,
    /// An operator skips a dead event's failed step.
    OperatorSkip,
}

impl Fault {
    /// Its name in the summary.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Crash => "crash",
            Fault::Pause => "pause past the lease",
            Fault::StoreFailsBefore => "store call fails",
            Fault::StoreFailsAfterCommit => "store call fails after commit",
            Fault::ClockJump => "clock jump",
            Fault::DuplicateDelivery => "duplicate delivery",
            Fault::OperatorCancel => "operator cancel",
            Fault::OperatorRetry => "operator retry",
            Fault::OperatorRetryFromStep => "operator retry from a step",
            Fault::OperatorSkip => "operator skip",
        }
    }
}

/// One attempt of one step, as the step itself recorded it.
#[derive(Debug, Clone)]
pub struct StepStart {
    /// The event's row number.
    pub seq: i64,
    /// The step's position in the plan.
    pub position: i32,
    /// The journal entry number when it started (orders it against marks).
    pub at_entry: u64,
}

/// A batch claim that leased events, as the fairness check reads it.
#[derive(Debug, Clone)]
pub struct BatchClaim {
    /// Simulated time since the start, in seconds.
    pub at: f64,
    /// The tenants it did not serve that had an event it could take (as it
    /// ended: it changed none of theirs), and perhaps some it served.
    pub waiting: BTreeSet<String>,
    /// The events it leased that have a tenant: (row number, tenant).
    pub leased: Vec<(i64, String)>,
}

#[derive(Debug, Default)]
struct Facts {
    trace: Vec<String>,
    entries: u64,
    faults: BTreeMap<Fault, u64>,
    violations: Vec<String>,
    /// The token of each event's lease as the last claim issued it; `None`
    /// after an operator's transition (which bumps it).
    current_token: HashMap<i64, Option<i64>>,
    /// When each event's current lease expires, as granted.
    lease_until: HashMap<i64, DateTime<Utc>>,
    /// How each event's current lease was claimed, for the blame check.
    last_claim: HashMap<i64, Charge>,
    /// Per event, the runs of its current step lost with a lease claimed
    /// beside others (until a mark moves it on, or an operator acts).
    interrupted: HashMap<i64, u32>,
    /// The suspects: events whose lease was lost again after an
    /// interruption, or lost while claimed alone, and whose step has not
    /// been marked since. Only a claim alone may take one.
    suspects: HashSet<i64>,
    /// The journal entry at which each (event, position) was first marked done.
    marked_done: HashMap<(i64, i32), u64>,
    starts: Vec<StepStart>,
    /// Per (event, position), the idempotency keys its effects were sent with.
    effects: BTreeMap<(i64, i32), BTreeMap<String, u32>>,
    /// Per delivery id, how many accepts were answered `New`.
    new_answers: BTreeMap<String, u32>,
    /// Per ordered account, the sequences whose first step started, in order.
    ordered_runs: BTreeMap<String, Vec<i64>>,
    /// The batch claims that leased events, in order.
    batch_claims: Vec<BatchClaim>,
}

/// How a claim leased an event: what the blame check compares at a takeover.
#[derive(Debug, Clone, Copy)]
pub struct Charge {
    /// Claimed alone (the claimer held nothing else).
    pub alone: bool,
    /// The attempts charged to it after the claim (runs interrupted beside
    /// other events are not).
    pub charged: i32,
    /// The step it was claimed at.
    pub next_step: i32,
}

/// The run's journal, shared by the simulation's tasks.
#[derive(Debug, Clone)]
pub struct Journal {
    clock: SimClock,
    facts: Arc<Mutex<Facts>>,
}

impl Journal {
    /// An empty journal on `clock`.
    pub fn new(clock: SimClock) -> Self {
        Self {
            clock,
            facts: Arc::default(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Facts) -> T) -> T {
        let mut facts = self
            .facts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut facts)
    }

    /// The simulated wall clock now.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.elapsed();
        self.clock.now()
    }

    /// Add a line to the trace; returns its entry number.
    pub fn note(&self, line: impl AsRef<str>) -> u64 {
        let elapsed = self.clock.elapsed().as_secs_f64();
        self.with(|facts| {
            facts.entries += 1;
            let entry = facts.entries;
            facts
                .trace
                .push(format!("{elapsed:>9.3}s  {}", line.as_ref()));
            entry
        })
    }

    /// Count an injected fault and trace it.
    pub fn fault(&self, fault: Fault, detail: impl AsRef<str>) {
        self.with(|facts| *facts.faults.entry(fault).or_default() += 1);
        self.note(format!("FAULT {}: {}", fault.name(), detail.as_ref()));
    }

    /// Record a broken invariant (and trace it).
    pub fn violation(&self, what: impl Into<String>) {
        let what = what.into();
        self.note(format!("VIOLATION {what}"));
        let elapsed = self.clock.elapsed().as_secs_f64();
        self.with(|facts| facts.violations.push(format!("at {elapsed:.3}s: {what}")));
    }

    /// A claim leased `seq` with `token` until `until`; `took_over` says it
    /// took an earlier lease over, which must have expired.
    ///
    /// Exact blame: a takeover charges an attempt only if the lost lease was
    /// claimed alone; one claimed beside others is refunded (the charged
    /// attempts stay what that claim made them, or 1 if a mark moved the
    /// event on). And only a claim alone takes a suspect (an event lost
    /// again after an interruption, or lost while claimed alone), until a
    /// mark of its step, however often it was given back meanwhile.
    pub fn claimed(
        &self,
        seq: i64,
        token: i64,
        until: DateTime<Utc>,
        took_over: bool,
        charge: Charge,
    ) {
        let now = self.now();
        let (live, misblamed, suspect_in_a_batch) = self.with(|facts| {
            let previous = facts.lease_until.insert(seq, until);
            let operator_changed = matches!(facts.current_token.get(&seq), Some(None));
            facts.current_token.insert(seq, Some(token));
            let lost = facts.last_claim.insert(seq, charge);
            let taken_over = lost.filter(|_| took_over && !operator_changed);
            let interrupted = facts.interrupted.get(&seq).copied().unwrap_or(0);
            let suspect = facts.suspects.contains(&seq)
                || taken_over.is_some_and(|lost| lost.alone || interrupted > 0);
            if taken_over.is_some_and(|lost| !lost.alone) {
                facts.interrupted.insert(seq, interrupted + 1);
            }
            if suspect && charge.alone {
                facts.suspects.insert(seq);
            } else {
                facts.suspects.remove(&seq);
            }
            let misblamed = taken_over.and_then(|lost| {
                let base = if lost.next_step == charge.next_step {
                    lost.charged
                } else {
                    1
                };
                let expected = base + i32::from(lost.alone);
                (charge.charged != expected).then_some((lost, expected))
            });
            (
                previous.filter(|expiry| took_over && *expiry > now),
                misblamed,
                suspect && !charge.alone,
            )
        });
        if suspect_in_a_batch {
            self.violation(format!(
                "blame: a batch claim took suspect event {seq} (lost again after an interruption, \
                 or lost while claimed alone, and not marked since)"
            ));
        }
        if let Some(expiry) = live {
            self.violation(format!(
                "event {seq}: a claim took over a lease that was still live (until {expiry}, now {now})"
            ));
        }
        if let Some((lost, expected)) = misblamed {
            let how = if lost.alone { "alone" } else { "beside others" };
            self.violation(format!(
                "blame: event {seq}'s lease, claimed {how} with {} attempt(s) charged, was taken over with {} charged instead of {expected}",
                lost.charged, charge.charged
            ));
        }
    }

    /// A heartbeat renewed `seq`'s lease `token` until `until`.
    pub fn renewed(&self, seq: i64, token: i64, until: DateTime<Utc>) {
        self.fenced_write_succeeded(seq, token, "heartbeat renewed");
        self.with(|facts| facts.lease_until.insert(seq, until));
    }

    /// A write fenced by `seq`'s lease `token` succeeded: it must be the
    /// current lease.
    pub fn fenced_write_succeeded(&self, seq: i64, token: i64, what: &str) {
        let current = self.with(|facts| facts.current_token.get(&seq).copied().flatten());
        if current != Some(token) {
            let holder = current.map_or("none (an operator changed the event)".to_owned(), |t| {
                t.to_string()
            });
            self.violation(format!(
                "event {seq}: {what} with a stale lease (token {token}; the current lease is {holder})"
            ));
        }
    }

    /// An operator's transition of `seq` committed: every earlier lease is
    /// void, and the event starts afresh (no interruption, no suspicion).
    pub fn operator_changed(&self, seq: i64) {
        self.with(|facts| {
            facts.current_token.insert(seq, None);
            facts.lease_until.remove(&seq);
            facts.interrupted.remove(&seq);
            facts.suspects.remove(&seq);
        });
    }

    /// An operator asked `seq` to run again from step `from`: those steps
    /// may start again, by request, and are marked anew.
    pub fn operator_rerun(&self, seq: i64, from: i32) {
        self.operator_changed(seq);
        self.with(|facts| facts.marked_done.retain(|&(s, p), _| s != seq || p < from));
    }

    /// Step `position` of `seq` was marked done (journal entry `entry`):
    /// the next step starts with no interruption, and no suspicion.
    pub fn marked_done(&self, seq: i64, position: i32, entry: u64) {
        self.with(|facts| {
            facts.marked_done.entry((seq, position)).or_insert(entry);
            facts.interrupted.remove(&seq);
            facts.suspects.remove(&seq);
        });
    }

    /// A failed attempt of `seq`'s step was marked: it ran to its end, so
    /// the event is no suspect (its interruptions still count).
    pub fn marked_failed(&self, seq: i64) {
        self.with(|facts| facts.suspects.remove(&seq));
    }

    /// A step attempt started (recorded by the step).
    pub fn step_started(&self, seq: i64, position: i32, line: String) {
        let entry = self.note(line);
        self.with(|facts| {
            facts.starts.push(StepStart {
                seq,
                position,
                at_entry: entry,
            })
        });
    }

    /// An ordered event's first step started.
    pub fn ordered_run(&self, account: &str, sequence: i64) {
        self.with(|facts| {
            facts
                .ordered_runs
                .entry(account.to_owned())
                .or_default()
                .push(sequence)
        });
    }

    /// Step `position` of `seq` sent its external effect with `key` (an
    /// idempotent API applies the first).
    pub fn effect(&self, seq: i64, position: i32, key: &str) {
        self.with(|facts| {
            *facts
                .effects
                .entry((seq, position))
                .or_default()
                .entry(key.to_owned())
                .or_default() += 1
        });
    }

    /// A batch claim committed and leased events (`leased`: those with a
    /// tenant), while `waiting` tenants had an event it could take.
    pub fn batch_claimed(&self, waiting: BTreeSet<String>, leased: Vec<(i64, String)>) {
        let at = self.clock.elapsed().as_secs_f64();
        self.with(|facts| {
            facts.batch_claims.push(BatchClaim {
                at,
                waiting,
                leased,
            })
        });
    }

    /// An accept of delivery `id` was answered `New`.
    pub fn answered_new(&self, id: &str) {
        self.with(|facts| *facts.new_answers.entry(id.to_owned()).or_default() += 1);
    }

    /// What the end-of-run checks read.
    pub fn snapshot(&self) -> JournalSnapshot {
        self.with(|facts| JournalSnapshot {
            marked_done: facts.marked_done.clone(),
            starts: facts.starts.clone(),
            effects: facts.effects.clone(),
            new_answers: facts.new_answers.clone(),
            ordered_runs: facts.ordered_runs.clone(),
            batch_claims: facts.batch_claims.clone(),
        })
    }

    /// The violations recorded so far.
    pub fn violations(&self) -> Vec<String> {
        self.with(|facts| facts.violations.clone())
    }

    /// Faults injected, by kind.
    pub fn faults(&self) -> BTreeMap<Fault, u64> {
        self.with(|facts| facts.faults.clone())
    }

    /// The whole trace.
    pub fn trace(&self) -> Vec<String> {
        self.with(|facts| facts.trace.clone())
    }

    /// A digest of the trace: two runs of one seed must agree on it.
    pub fn digest(&self) -> String {
        self.with(|facts| {
            let mut hasher = Sha256::new();
            for line in &facts.trace {
                hasher.update(line.as_bytes());
                hasher.update(b"\n");
            }
            let mut short = String::new();
            for byte in &hasher.finalize()[..8] {
                let _ = write!(short, "{byte:02x}");
            }
            short
        })
    }
}

/// The facts the end-of-run checks need, copied out.
#[derive(Debug, Clone)]
pub struct JournalSnapshot {
    /// The entry at which each (event, position) was first marked done.
    pub marked_done: HashMap<(i64, i32), u64>,
    /// Every step attempt's start.
    pub starts: Vec<StepStart>,
    /// Per (event, position), how often its effect was sent with each key.
    pub effects: BTreeMap<(i64, i32), BTreeMap<String, u32>>,
    /// `New` answers per delivery id.
    pub new_answers: BTreeMap<String, u32>,
    /// Ordered events' first-step starts per account.
    pub ordered_runs: BTreeMap<String, Vec<i64>>,
    /// The batch claims that leased events, in order.
    pub batch_claims: Vec<BatchClaim>,
}
