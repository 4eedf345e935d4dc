//! The store one simulated process talks through. [`SimStore`] wraps the
//! real SQLite store: every call waits while the process is paused, takes a
//! seeded moment of latency (a point where the simulation may do something
//! else, or crash the process), may fail before reaching the database or
//! after committing, runs to completion on the database thread, and is
//! traced and checked as it returns.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tickmark::store::sqlite::SqliteStore;
use tickmark::store::{AppConnection, Backend, StepTransaction, Store, StoreError};
use tickmark_driver::store::admin::{
    Admin, AuditEntry, Decide, EventFilter, KeySlots, PruneBatch, StatusReport, TenantRow,
    TransitionError,
};
use tickmark_driver::store::privacy::{
    ErasedBatch, RegisteredKey, Reseal, StoredValues, SubjectErase,
};
use tickmark_driver::store::{
    ClaimParams, ClaimedEvent, EventCounts, EventInsert, EventRecord, InsertOutcome, Lease,
    MarkDone, MarkFailed, PlanGroup, RateTake, RateTaken, ReconcileCursor, ReconcileLease, Release,
    SequenceCheck, StepStatus, WaitSettled, WaitStep, Wakeups,
};

use crate::db::DbThread;
use crate::deliveries::Workload;
use crate::dice::Dice;
use crate::journal::{Charge, Fault, Journal};
use crate::process::{FaultSwitch, ProcessState};
use crate::steps::{tenant_of, SYNC};
use crate::variant::Variant;

/// What every process's store shares.
#[derive(Debug, Clone)]
pub struct World {
    /// The database thread.
    pub db: Arc<DbThread>,
    /// The seeded dice.
    pub dice: Dice,
    /// The journal.
    pub journal: Journal,
    /// Fault rates, and whether they apply now.
    pub faults: Arc<FaultSwitch>,
    /// Which store variant runs.
    pub variant: Variant,
    /// What the run delivers.
    pub workload: Workload,
}

/// The store one process incarnation talks through.
#[derive(Debug)]
pub struct SimStore {
    inner: Arc<SqliteStore>,
    process: Arc<ProcessState>,
    world: World,
}

fn injected(what: &str) -> StoreError {
    StoreError::Unavailable(sqlx::Error::Protocol(format!(
        "simulated failure of {what}"
    )))
}

impl SimStore {
    /// `process`'s view of the shared store `inner`.
    pub fn new(inner: Arc<SqliteStore>, process: Arc<ProcessState>, world: World) -> Self {
        Self {
            inner,
            process,
            world,
        }
    }

    fn journal(&self) -> &Journal {
        &self.world.journal
    }

    /// Everything before the call reaches the database: a crashed process
    /// must not get here; a paused one waits; then a seeded moment of
    /// latency, and perhaps a failure.
    async fn before(&self, what: &str, latency: bool) -> Result<(), StoreError> {
        if latency {
            self.process.await_running().await;
            self.process.sleep(self.world.dice.millis(0..4)).await;
        }
        if self.process.is_crashed() {
            if self.process.crashed_before_now() {
                self.journal().violation(format!(
                    "{} called the store ({what}) after it crashed: a task of it outlived the crash",
                    self.process.name
                ));
            }
            std::future::pending::<()>().await
        }
        if self.world.faults.is_on() && self.world.dice.chance(self.world.faults.fail_before) {
            self.journal().fault(
                Fault::StoreFailsBefore,
                format!("{} {what}", self.process.name),
            );
            return Err(injected(what));
        }
        Ok(())
    }

    /// After a write: it may be reported failed although it committed.
    fn after<T>(&self, what: &str, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if result.is_ok()
            && self.world.faults.is_on()
            && self.world.dice.chance(self.world.faults.fail_after)
        {
            self.journal().fault(
                Fault::StoreFailsAfterCommit,
                format!("{} {what}", self.process.name),
            );
            return Err(injected(what));
        }
        result
    }

    /// One write of this process, as the simulation wraps it: pauses,
    /// latency and an injected failure before; the call, run to completion;
    /// its trace line (`said`: `None` for one not worth a line); the check
    /// of its fencing and what `observe` records; perhaps a failure reported
    /// although it committed; latency after.
    async fn write<T, Fut>(
        &self,
        write: Write<'_>,
        call: impl FnOnce() -> Fut,
        said: impl FnOnce(&T) -> Option<String>,
        observe: impl FnOnce(&T, u64),
    ) -> Result<T, StoreError>
    where
        T: Send,
        Fut: Future<Output = Result<T, StoreError>> + Send,
    {
        self.before(&write.what, write.latency).await?;
        let result = self.world.db.block(call());
        let line = match &result {
            Ok(value) => said(value),
            Err(_) => Some(outcome_of(&result)),
        };
        let entry = match line {
            Some(line) => self.trace(format!("{} -> {line}", write.what)),
            None => 0,
        };
        if let Ok(value) = &result {
            if let Some((lease, kind)) = write.fenced {
                self.journal()
                    .fenced_write_succeeded(lease.event_seq, lease.token, kind);
            }
            observe(value, entry);
        }
        let result = self.after(&write.what, result);
        self.process.sleep(self.world.dice.millis(0..3)).await;
        result
    }

    fn trace(&self, line: String) -> u64 {
        self.journal().note(format!("{} {line}", self.process.name))
    }

    fn current_token(&self, seq: i64) -> Option<i64> {
        let pool = self.inner.pool();
        self.world
            .db
            .block(
                sqlx::query_scalar::<_, i64>(
                    "SELECT lease_token FROM tickmark_events WHERE id = ?",
                )
                .bind(seq)
                .fetch_optional(pool),
            )
            .ok()
            .flatten()
    }

    fn lease_until(&self, lease_for: Duration) -> DateTime<Utc> {
        self.journal().now() + chrono::Duration::from_std(lease_for).unwrap_or_default()
    }
}

/// A step's transaction on its way to its mark. If the mark never gets it
/// (an injected failure before the call), it is dropped on the database
/// thread: sqlx then rolls it back and returns its connection there, in
/// the call, rather than in a task of the simulation's runtime that would
/// finish in real time.
struct HeldTransaction {
    db: Arc<DbThread>,
    transaction: Option<StepTransaction>,
}

impl HeldTransaction {
    fn take(mut self) -> Option<StepTransaction> {
        self.transaction.take()
    }
}

impl Drop for HeldTransaction {
    fn drop(&mut self) {
        if let Some(transaction) = self.transaction.take() {
            self.db.block(async move { drop(transaction) });
        }
    }
}

/// How the simulation wraps one write (see [`SimStore::write`]).
struct Write<'a> {
    what: String,
    latency: bool,
    /// The lease the write is fenced by, and what it is: when the write
    /// succeeds, that lease must be the current one.
    fenced: Option<(Lease, &'a str)>,
}

impl<'a> Write<'a> {
    fn new(what: String) -> Self {
        Self {
            what,
            latency: true,
            fenced: None,
        }
    }

    fn fenced(self, lease: Lease, kind: &'a str) -> Self {
        Self {
            fenced: Some((lease, kind)),
            ..self
        }
    }

    fn without_latency_if(self, no_latency: bool) -> Self {
        Self {
            latency: !no_latency,
            ..self
        }
    }
}

/// The trace says "ok" for a write with nothing more to say.
fn ok<T>(_: &T) -> Option<String> {
    Some("ok".to_owned())
}

/// The tenants with an event a batch claim could take at `now`: due and
/// pending, or running under a lease that expired by `now` and was claimed
/// in a batch and never interrupted; not a suspect (the store's `claimable`
/// for a batch claim, for the `sync` handler's events, which are neither
/// ordered nor limited). The tenant is read from the payload, where the
/// handler names it, not from the store's column.
async fn tenants_waiting(
    pool: &sqlx::SqlitePool,
    now: DateTime<Utc>,
) -> Result<BTreeSet<String>, sqlx::Error> {
    let now = now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let payloads: Vec<String> = sqlx::query_scalar(
        "SELECT payload FROM tickmark_events
         WHERE kind = ?1 AND due_at <= ?2 AND NOT suspect
           AND (state = 'pending'
                OR (state = 'running' AND NOT claimed_alone AND interrupted = 0))",
    )
    .bind(SYNC)
    .bind(now)
    .fetch_all(pool)
    .await?;
    Ok(payloads
        .iter()
        .filter_map(|payload| {
            let payload: serde_json::Value = serde_json::from_str(payload).ok()?;
            tenant_of(&payload).map(str::to_owned)
        })
        .collect())
}

fn outcome_of<T>(result: &Result<T, StoreError>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(StoreError::LeaseLost { .. }) => "lease lost".to_owned(),
        Err(StoreError::ReconcileLeaseLost { .. }) => "reconcile lease lost".to_owned(),
        Err(error) if error.is_transient() => "failed (transient)".to_owned(),
        Err(error) => format!("error: {error}"),
    }
}

// The simulator is tickmark's own: it may implement the sealed `Store`.
impl tickmark_driver::store::unstable::StoreImplementation for SimStore {}

#[async_trait::async_trait]
impl Store for SimStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.world.db.block(self.inner.migrate())
    }

    /// Straight through to the file, with no fault: the simulator's
    /// processes accept through `event_insert`.
    async fn event_insert_in(
        &self,
        conn: AppConnection<'_>,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        self.inner.event_insert_in(conn, event).await
    }

    async fn event_insert(&self, event: &EventInsert<'_>) -> Result<InsertOutcome, StoreError> {
        let write = Write::new(format!("insert {}", event.dedup_key));
        self.write(
            write,
            || self.inner.event_insert(event),
            |outcome| {
                Some(match outcome {
                    InsertOutcome::New(seq) => format!("new, event {seq}"),
                    InsertOutcome::Duplicate => "duplicate".to_owned(),
                })
            },
            |_, _| {},
        )
        .await
    }

    async fn event_claim_many(
        &self,
        params: &ClaimParams<'_>,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        // The tenants a batch claim that leased events left waiting (for the
        // fair-share check), read as it ends, at its time, before anything
        // else reaches the database. The claim changed only the events it
        // leased, so every tenant it did not serve waited as it began (the
        // check needs no more of a tenant it served), and an idle worker's
        // empty poll costs no read.
        let waiting: Mutex<Option<Result<BTreeSet<String>, sqlx::Error>>> = Mutex::default();
        let seen_waiting = &waiting;
        let claim = || {
            if self.world.variant == Variant::ClaimIgnoresExpiry {
                // Broken on purpose: every running lease looks expired.
                let expire = sqlx::query(
                    "UPDATE tickmark_events SET due_at = '2000-01-01T00:00:00.000Z' \
                     WHERE state = 'running'",
                );
                let _ = self.world.db.block(expire.execute(self.inner.pool()));
            }
            if self.world.variant == Variant::ChargesTheBatch {
                // Broken on purpose: every lease looks claimed alone, so a
                // takeover charges every event a dead worker held.
                let alone = sqlx::query(
                    "UPDATE tickmark_events SET claimed_alone = 1 WHERE state = 'running'",
                );
                let _ = self.world.db.block(alone.execute(self.inner.pool()));
            }
            if self.world.variant == Variant::ClaimsInDueOrder {
                // Broken on purpose: no event has a tenant, so the claim
                // takes the oldest due events, whoever they are for.
                let untenanted = sqlx::query(
                    "UPDATE tickmark_events SET tenant_key = NULL WHERE tenant_key IS NOT NULL",
                );
                let _ = self.world.db.block(untenanted.execute(self.inner.pool()));
            }
            let now = self.journal().now();
            async move {
                let claimed = self.inner.event_claim_many(params).await;
                if !params.alone && claimed.as_ref().is_ok_and(|c| !c.is_empty()) {
                    let tenants = tenants_waiting(self.inner.pool(), now).await;
                    *seen_waiting.lock().unwrap_or_else(|p| p.into_inner()) = Some(tenants);
                }
                claimed
            }
        };
        let until = || self.lease_until(params.lease_for);
        self.write(
            Write::new("claim".to_owned()),
            claim,
            |claimed| {
                let listed: Vec<String> = claimed
                    .iter()
                    .map(|c| {
                        let over = if c.took_over { " (took over)" } else { "" };
                        let tenant = tenant_of(&c.event.payload)
                            .map(|tenant| format!(" [{tenant}]"))
                            .unwrap_or_default();
                        format!(
                            "e{}@{} step {}{tenant}{over}",
                            c.lease.event_seq, c.lease.token, c.next_step
                        )
                    })
                    .collect();
                // An empty claim is an idle worker's poll: not worth a line.
                (!listed.is_empty()).then(|| listed.join(", "))
            },
            |claimed, _| {
                let until = until();
                for c in claimed {
                    let charge = Charge {
                        alone: params.alone,
                        charged: c.charged_attempt(),
                        next_step: c.next_step,
                    };
                    self.journal().claimed(
                        c.lease.event_seq,
                        c.lease.token,
                        until,
                        c.took_over,
                        charge,
                    );
                }
                let waiting = waiting.lock().unwrap_or_else(|p| p.into_inner()).take();
                match waiting {
                    Some(Ok(waiting)) => {
                        let leased = claimed
                            .iter()
                            .filter_map(|c| {
                                let tenant = tenant_of(&c.event.payload)?;
                                Some((c.lease.event_seq, tenant.to_owned()))
                            })
                            .collect();
                        self.journal().batch_claimed(waiting, leased);
                    }
                    Some(Err(error)) => self.journal().violation(format!(
                        "harness: the fairness check could not read the waiting tenants: {error}"
                    )),
                    _ => {}
                }
            },
        )
        .await
    }

    async fn event_heartbeat_many(
        &self,
        leases: &[Lease],
        lease_for: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let mut sorted: Vec<Lease> = leases.to_vec();
        sorted.sort_by_key(|l| l.event_seq);
        self.write(
            Write::new("heartbeat".to_owned()),
            || self.inner.event_heartbeat_many(leases, lease_for),
            |renewed| {
                let listed: Vec<String> = sorted
                    .iter()
                    .map(|l| {
                        let lost = if renewed.contains(&l.event_seq) {
                            ""
                        } else {
                            " lost"
                        };
                        format!("e{}@{}{lost}", l.event_seq, l.token)
                    })
                    .collect();
                Some(listed.join(", "))
            },
            |renewed, _| {
                let until = self.lease_until(lease_for);
                for lease in sorted.iter().filter(|l| renewed.contains(&l.event_seq)) {
                    self.journal().renewed(lease.event_seq, lease.token, until);
                }
            },
        )
        .await
    }

    async fn event_release(&self, lease: &Lease, release: &Release<'_>) -> Result<(), StoreError> {
        let write = Write::new(format!("release e{}@{}", lease.event_seq, lease.token))
            .fenced(*lease, "a release");
        self.write(
            write,
            || self.inner.event_release(lease, release),
            ok,
            |_, _| {},
        )
        .await
    }

    async fn rate_take(&self, take: &RateTake<'_>) -> Result<RateTaken, StoreError> {
        self.before("rate take", true).await?;
        self.world.db.block(self.inner.rate_take(take))
    }

    async fn step_wait(&self, wait: &WaitStep<'_>) -> Result<WaitSettled, StoreError> {
        self.before("wait", true).await?;
        self.world.db.block(self.inner.step_wait(wait))
    }

    async fn event_progress(
        &self,
        lease: &Lease,
        fraction: f32,
        message: &str,
    ) -> Result<(), StoreError> {
        self.before("progress", true).await?;
        self.world
            .db
            .block(self.inner.event_progress(lease, fraction, message))
    }

    async fn event_sequence_check(
        &self,
        lease: &Lease,
        resource_key: &str,
        resource_seq: i64,
    ) -> Result<SequenceCheck, StoreError> {
        let write = Write::new(format!(
            "sequence check e{}@{} {resource_key}#{resource_seq}",
            lease.event_seq, lease.token
        ))
        .fenced(*lease, "a sequence check");
        self.write(
            write,
            || {
                self.inner
                    .event_sequence_check(lease, resource_key, resource_seq)
            },
            |checked| {
                Some(match checked {
                    SequenceCheck::Apply => "apply".to_owned(),
                    SequenceCheck::Stale { last_seq } => format!("stale (last {last_seq})"),
                })
            },
            |_, _| {},
        )
        .await
    }

    async fn event_park(&self, lease: &Lease, reason: &str) -> Result<(), StoreError> {
        let write = Write::new(format!(
            "park e{}@{} ({reason})",
            lease.event_seq, lease.token
        ))
        .fenced(*lease, "a park");
        self.write(
            write,
            || self.inner.event_park(lease, reason),
            ok,
            |_, _| {},
        )
        .await
    }

    async fn event_next_due(&self) -> Result<Option<Duration>, StoreError> {
        self.before("next due", true).await?;
        self.world.db.block(self.inner.event_next_due())
    }

    async fn event_suspect_waits(&self) -> Result<Option<Duration>, StoreError> {
        self.before("suspect waits", true).await?;
        self.world.db.block(self.inner.event_suspect_waits())
    }

    async fn event_count_active(&self) -> Result<i64, StoreError> {
        self.world.db.block(self.inner.event_count_active())
    }

    async fn event_counts(&self) -> Result<EventCounts, StoreError> {
        self.world.db.block(self.inner.event_counts())
    }

    async fn plans_unfinished(&self) -> Result<Vec<PlanGroup>, StoreError> {
        self.world.db.block(self.inner.plans_unfinished())
    }

    async fn event_get(&self, event_seq: i64) -> Result<Option<EventRecord>, StoreError> {
        self.world.db.block(self.inner.event_get(event_seq))
    }

    async fn event_find(
        &self,
        source: &str,
        dedup_key: &str,
    ) -> Result<Option<EventRecord>, StoreError> {
        self.world
            .db
            .block(self.inner.event_find(source, dedup_key))
    }

    async fn event_find_by_replay_key(
        &self,
        source: &str,
        replay_key: &str,
    ) -> Result<Option<EventRecord>, StoreError> {
        self.world
            .db
            .block(self.inner.event_find_by_replay_key(source, replay_key))
    }

    async fn step_outputs(
        &self,
        event_seq: i64,
    ) -> Result<Vec<(i32, serde_json::Value)>, StoreError> {
        self.before("load outputs", true).await?;
        self.world.db.block(self.inner.step_outputs(event_seq))
    }

    async fn step_transaction_begin(&self) -> Result<StepTransaction, StoreError> {
        self.before("begin", true).await?;
        let result = self.world.db.block(self.inner.step_transaction_begin());
        self.trace(format!("begin step transaction -> {}", outcome_of(&result)));
        result
    }

    async fn step_mark_done(
        &self,
        mark: &MarkDone<'_>,
        transaction: Option<StepTransaction>,
    ) -> Result<(), StoreError> {
        let lease = mark.lease;
        let done = if mark.skipped { "skipped" } else { "done" };
        let what = format!(
            "mark e{}@{} step {} ({}) {done}",
            lease.event_seq, lease.token, mark.position, mark.step
        );
        // A transactional step's mark follows its writes with no pause: the
        // open transaction holds the database's write lock, which every
        // other call of the simulation, on this one thread, would wait for.
        let write = Write::new(what)
            .fenced(lease, "a mark")
            .without_latency_if(transaction.is_some());
        let transaction = HeldTransaction {
            db: Arc::clone(&self.world.db),
            transaction,
        };
        let mark_done = || {
            let transaction = transaction.take();
            let mut sent = mark.clone();
            if self.world.variant == Variant::MarkIgnoresFence {
                // Broken on purpose: mark with whatever token the event has now.
                if let Some(token) = self.current_token(lease.event_seq) {
                    sent.lease.token = token;
                }
            }
            let inner = Arc::clone(&self.inner);
            async move { inner.step_mark_done(&sent, transaction).await }
        };
        let marked = |_: &(), entry| {
            self.journal()
                .marked_done(lease.event_seq, mark.position, entry)
        };
        self.write(write, mark_done, ok, marked).await
    }

    async fn step_mark_failed(&self, mark: &MarkFailed<'_>) -> Result<(), StoreError> {
        let lease = mark.lease;
        let write = Write::new(format!(
            "mark e{}@{} step {} ({}) failed, {:?}",
            lease.event_seq, lease.token, mark.position, mark.step, mark.then
        ))
        .fenced(lease, "a failure mark");
        let marked = |_: &(), _| self.journal().marked_failed(lease.event_seq);
        self.write(write, || self.inner.step_mark_failed(mark), ok, marked)
            .await
    }

    async fn step_status(&self, event_seq: i64) -> Result<Vec<StepStatus>, StoreError> {
        self.world.db.block(self.inner.step_status(event_seq))
    }

    async fn wakeups(&self) -> Result<Wakeups, StoreError> {
        self.world.db.block(self.inner.wakeups())
    }

    // Reconciliation: the writes wrapped as every write is (latency,
    // injected failures before and after the commit, a trace line).

    async fn reconcile_lease_take(
        &self,
        source: &str,
        owner: &str,
        lease_for: Duration,
    ) -> Result<Option<ReconcileLease>, StoreError> {
        self.write(
            Write::new(format!("reconcile take {source} for {owner}")),
            || self.inner.reconcile_lease_take(source, owner, lease_for),
            |taken| {
                Some(match taken {
                    Some(lease) => format!("fence {}", lease.fence),
                    None => "held by another".to_owned(),
                })
            },
            |_, _| {},
        )
        .await
    }

    async fn reconcile_cursor_advance(
        &self,
        lease: &ReconcileLease,
        cursor: &str,
        cursor_at: Option<DateTime<Utc>>,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        self.write(
            Write::new(format!(
                "reconcile advance {}@{} to {cursor}",
                lease.source, lease.fence
            )),
            || {
                self.inner
                    .reconcile_cursor_advance(lease, cursor, cursor_at, lease_for)
            },
            ok,
            |_, _| {},
        )
        .await
    }

    async fn reconcile_lease_extend(
        &self,
        lease: &ReconcileLease,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        self.write(
            Write::new(format!("reconcile extend {}@{}", lease.source, lease.fence)),
            || self.inner.reconcile_lease_extend(lease, lease_for),
            ok,
            |_, _| {},
        )
        .await
    }

    async fn reconcile_lease_release(
        &self,
        lease: &ReconcileLease,
        summary: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write(
            Write::new(format!(
                "reconcile release {}@{}",
                lease.source, lease.fence
            )),
            || self.inner.reconcile_lease_release(lease, summary),
            ok,
            |_, _| {},
        )
        .await
    }

    async fn reconcile_cursors(&self) -> Result<Vec<ReconcileCursor>, StoreError> {
        self.world.db.block(self.inner.reconcile_cursors())
    }

    async fn reconcile_cursor_reset(&self, source: &str) -> Result<bool, StoreError> {
        self.write(
            Write::new(format!("reconcile reset {source}")),
            || self.inner.reconcile_cursor_reset(source),
            |reset| Some(if *reset { "reset" } else { "leased" }.to_owned()),
            |_, _| {},
        )
        .await
    }
}

#[async_trait::async_trait]
impl Admin for SimStore {
    async fn status(&self, minutes: u32) -> Result<StatusReport, StoreError> {
        self.world.db.block(self.inner.status(minutes))
    }

    async fn event_list(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        self.world.db.block(self.inner.event_list(filter))
    }

    async fn event_lookup(
        &self,
        id: &str,
        source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.world.db.block(self.inner.event_lookup(id, source))
    }

    async fn audit_list(&self, event_seq: i64) -> Result<Vec<AuditEntry>, StoreError> {
        self.world.db.block(self.inner.audit_list(event_seq))
    }

    async fn event_plan(&self, event_seq: i64) -> Result<Option<serde_json::Value>, StoreError> {
        self.world.db.block(self.inner.event_plan(event_seq))
    }

    async fn event_key_slots(&self, event_seq: i64) -> Result<Option<KeySlots>, StoreError> {
        self.world.db.block(self.inner.event_key_slots(event_seq))
    }

    async fn event_transition(
        &self,
        event_seq: i64,
        decide: &Decide<'_>,
    ) -> Result<EventRecord, TransitionError> {
        self.world
            .db
            .block(self.inner.event_transition(event_seq, decide))
    }

    async fn event_prune(&self, prune: &PruneBatch) -> Result<u64, StoreError> {
        self.world.db.block(self.inner.event_prune(prune))
    }

    async fn tombstone_prune(&self, dedup_window: Duration, batch: u32) -> Result<u64, StoreError> {
        self.world
            .db
            .block(self.inner.tombstone_prune(dedup_window, batch))
    }

    async fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.world.db.block(self.inner.sources())
    }

    async fn keys_registered(&self) -> Result<Vec<RegisteredKey>, StoreError> {
        self.world.db.block(self.inner.keys_registered())
    }

    async fn key_register(&self, key_id: &str, key_check: &str) -> Result<String, StoreError> {
        self.world
            .db
            .block(self.inner.key_register(key_id, key_check))
    }

    async fn key_retire(&self, key_id: &str) -> Result<(), StoreError> {
        self.world.db.block(self.inner.key_retire(key_id))
    }

    async fn values_page(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredValues>, StoreError> {
        self.world
            .db
            .block(self.inner.values_page(after_seq, limit))
    }

    async fn values_reseal(&self, reseals: &[Reseal<'_>]) -> Result<u64, StoreError> {
        self.world.db.block(self.inner.values_reseal(reseals))
    }

    async fn subject_erase(&self, erase: &SubjectErase<'_>) -> Result<ErasedBatch, StoreError> {
        self.world.db.block(self.inner.subject_erase(erase))
    }

    async fn subject_events(
        &self,
        subject_hash: &str,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.world
            .db
            .block(self.inner.subject_events(subject_hash, limit))
    }

    async fn tenant_weight_set(
        &self,
        tenant: &str,
        weight: tickmark_driver::flow::TenantWeight,
    ) -> Result<(), StoreError> {
        self.world
            .db
            .block(self.inner.tenant_weight_set(tenant, weight))
    }

    async fn tenants(&self, limit: u32) -> Result<Vec<TenantRow>, StoreError> {
        self.world.db.block(self.inner.tenants(limit))
    }
}
