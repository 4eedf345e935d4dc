//! The operator side of a store: the reads `tickmark` (the CLI) and the
//! dashboard show, and one write, [`Admin::event_transition`]: a fenced,
//! audited transition of one event.
//!
//! The store enforces, it does not decide. Which transition an operator's
//! action may make in each state, and the words an operator reads when it may
//! not, belong to the `operator` module above the store; it hands its
//! decision in as a closure. The store reads the event locked, asks that
//! closure, and applies the answer with an `UPDATE` whose `WHERE` filters on
//! the states the transition allows, so the database stays the judge.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::privacy::{ErasedBatch, RegisteredKey, Reseal, StoredValues, SubjectErase};
use super::{EventRecord, StoreError};
use crate::event::{EventState, StepState};

/// Which events to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this state.
    pub state: Option<EventState>,
    /// Only this source.
    pub source: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only events received within this long.
    pub since: Option<Duration>,
    /// At most this many.
    pub limit: u32,
}

/// A tenant of fair claiming (`Handler::tenant_key`), as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantRow {
    /// The tenant's key (a shop, a connected account).
    pub tenant: String,
    /// Its weight (1 unless set).
    pub weight: f64,
    /// Its events waiting to run (due now or later).
    pub pending: i64,
    /// Its events running now.
    pub running: i64,
    /// Due since when, its oldest event due now and not running.
    pub oldest_due_at: Option<DateTime<Utc>>,
}

/// Who holds the slots of a concurrency-limited event's key
/// (`Handler::concurrency_per`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeySlots {
    /// `{source}:{value}`.
    pub key: String,
    /// At most this many of the key's events run at once.
    pub limit: i32,
    /// The key's running events: (row number, event id).
    pub holders: Vec<(i64, String)>,
}

impl KeySlots {
    /// Whether every slot is held: an event of the key waits for one.
    pub fn is_full(&self) -> bool {
        self.holders.len() >= usize::try_from(self.limit).unwrap_or(0)
    }
}

/// One audit row: a manual action on an event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Row number.
    pub id: i64,
    /// The event acted on.
    pub event_seq: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// What: `retry`, `cancel`, `skip`, `mark_done`.
    pub action: String,
    /// The step acted on, if any.
    pub step: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// What changed, in words (e.g. "dead → pending from step send_receipt").
    pub detail: Option<String>,
}

/// The overview `tickmark status` prints and the dashboard shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatusReport {
    /// Event counts by (state, source).
    pub counts: Vec<(EventState, String, i64)>,
    /// How long the oldest due, unclaimed event has waited.
    pub oldest_pending_age: Option<Duration>,
    /// Events whose lease expired without a mark (their worker died or stalled).
    pub stuck: i64,
    /// Events finished (done) per minute, for each of the last `minutes` minutes, newest first.
    pub done_per_minute: Vec<i64>,
}

/// The operator side of a store. Both stores implement it; sealed, as
/// [`Store`](super::Store) is.
#[async_trait::async_trait]
pub trait Admin: super::sealed::Sealed + Send + Sync {
    /// Counts by state and source, oldest pending age, stuck events, and
    /// events done per minute over the last `minutes` minutes.
    async fn status(&self, minutes: u32) -> Result<StatusReport, StoreError>;

    /// Events matching `filter`, newest first.
    async fn event_list(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError>;

    /// Find events by operator input: a row number (`42`) or a dedup key
    /// (`evt_…`), optionally within one source. Several when a key is shared
    /// by sources.
    async fn event_lookup(
        &self,
        id: &str,
        source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError>;

    /// The audit trail of one event, oldest first.
    async fn audit_list(&self, event_seq: i64) -> Result<Vec<AuditEntry>, StoreError>;

    /// The stored plan of one event (JSON: its `retry` policy and its `steps`,
    /// each with `name` and typetag `type`), for explaining where it is.
    async fn event_plan(&self, event_seq: i64) -> Result<Option<serde_json::Value>, StoreError>;

    /// A concurrency-limited event's key, its limit, and the events that hold
    /// its slots now (running under a live lease; at most ten, oldest first).
    /// `None` when the event has no concurrency key.
    async fn event_key_slots(&self, event_seq: i64) -> Result<Option<KeySlots>, StoreError>;

    /// Change one event as `decide` says, fenced and audited, in one
    /// transaction: read the event locked, call `decide` with what was found,
    /// then run the [`Decision`]'s `UPDATE` (which filters on the states that
    /// transition allows and bumps the fencing token, so a worker still
    /// holding an older lease can change nothing), change the step rows it
    /// implies, and write the audit row. Returns the event as changed.
    ///
    /// A declined decision changes nothing ([`TransitionError::Declined`]);
    /// an `UPDATE` that changes no row is [`TransitionError::Unchanged`],
    /// never ignored. A re-queue wakes idle workers.
    async fn event_transition(
        &self,
        event_seq: i64,
        decide: &Decide<'_>,
    ) -> Result<EventRecord, TransitionError>;

    /// Delete up to `prune.batch` finished events (done, ignored, cancelled,
    /// stale, superseded; and dead when `prune.include_dead`) received more
    /// than `prune.older_than` ago, oldest first, with their steps and audit
    /// rows, leaving a tombstone per key of those received within
    /// `prune.dedup_window` ([`tombstone`](super::tombstone)). Returns how
    /// many events were deleted (fewer than the batch: nothing is left).
    async fn event_prune(&self, prune: &PruneBatch) -> Result<u64, StoreError>;

    /// Set `tenant`'s weight in fair claiming, fleet-wide from the next
    /// claim on.
    async fn tenant_weight_set(
        &self,
        tenant: &str,
        weight: crate::flow::TenantWeight,
    ) -> Result<(), StoreError>;

    /// The tenants with unfinished events, most unfinished first, and those
    /// whose weight was set; at most `limit`.
    async fn tenants(&self, limit: u32) -> Result<Vec<TenantRow>, StoreError>;

    /// Delete up to `batch` tombstones of events accepted more than
    /// `dedup_window` ago, oldest first: their keys may be accepted again.
    /// Returns how many were deleted (fewer than `batch`: none is left).
    async fn tombstone_prune(&self, dedup_window: Duration, batch: u32) -> Result<u64, StoreError>;

    /// The sources that have events or tombstones (for prune's safety check).
    async fn sources(&self) -> Result<Vec<String>, StoreError>;

    /// The keys that sealed this database's rows and are not retired.
    async fn keys_registered(&self) -> Result<Vec<RegisteredKey>, StoreError>;

    /// Record that `key_id` (with `key_check`) seals rows from now on;
    /// nothing changes when it is recorded already. Returns the check value
    /// recorded under that id, which differs from `key_check` when another
    /// key had that id.
    async fn key_register(&self, key_id: &str, key_check: &str) -> Result<String, StoreError>;

    /// Forget `key_id`: no row is sealed with it any more (a rotation
    /// checked), so an engine may start without it.
    async fn key_retire(&self, key_id: &str) -> Result<(), StoreError>;

    /// The stored payloads and outputs of up to `limit` events after row
    /// `after_seq`, in row order, erased events left out: a rotation's page.
    async fn values_page(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredValues>, StoreError>;

    /// Write re-sealed values, each only where the stored text is still
    /// the one read (a value changed since, by a mark or an erasure, is
    /// left alone). Returns how many were written.
    async fn values_reseal(&self, reseals: &[Reseal<'_>]) -> Result<u64, StoreError>;

    /// Erase up to `erase.batch` events of a subject, in one transaction:
    /// each loses its payload (JSON `null`), its steps' outputs and errors,
    /// its error and progress text and its audit rows' free text, and
    /// gains `erased_at` and an audit row; one that had not ended is
    /// cancelled (fenced: a worker holding an expired lease can change
    /// nothing after). Its row, dedup and replay keys, and step-status rows
    /// stay. Events running under a live lease are left, and reported.
    async fn subject_erase(&self, erase: &SubjectErase<'_>) -> Result<ErasedBatch, StoreError>;

    /// Up to `limit` events recorded with subject hash `subject_hash`, not
    /// erased, oldest first: what a data request is answered with.
    async fn subject_events(
        &self,
        subject_hash: &str,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError>;
}

/// One batch of [`Admin::event_prune`].
#[derive(Debug, Clone, Copy)]
pub struct PruneBatch {
    /// Events received longer ago than this lose their payload, plan and steps.
    pub older_than: Duration,
    /// Of those, the ones received within this window leave tombstones, so
    /// their redeliveries are still duplicates.
    pub dedup_window: Duration,
    /// Dead events too (they wait for an operator: deleting them gives them up).
    pub include_dead: bool,
    /// Most events deleted in this batch's transaction.
    pub batch: u32,
}

/// An event as a transition found it: read, locked, in the transition's
/// transaction, so nothing changes it before the transition's `UPDATE`.
#[derive(Debug, Clone)]
pub struct EventSnapshot {
    /// Its row number.
    pub seq: i64,
    /// Its state.
    pub state: EventState,
    /// The position of its current step (`step_count` when all are settled).
    pub next_step: i32,
    /// How many steps its plan has.
    pub step_count: i32,
    /// Attempts at its current step.
    pub attempt: i32,
    /// The retry time while pending, the lease expiry while running.
    pub due_at: DateTime<Utc>,
    /// `due_at` has passed, by the clock the store's leases use.
    pub lease_expired: bool,
    /// The worker holding (or last holding) its lease.
    pub lease_owner: Option<String>,
    /// The last error of its current step.
    pub last_error: Option<String>,
    /// When it ended, if it has.
    pub finished_at: Option<DateTime<Utc>>,
    /// The step names of its stored plan, in order.
    pub steps: Vec<String>,
    /// While its current step waits (for another event, or a time): the deadline.
    pub waiting_until: Option<DateTime<Utc>>,
}

impl EventSnapshot {
    /// The name of the step at `position` in its plan, if there is one.
    pub fn step_name(&self, position: i32) -> Option<&str> {
        usize::try_from(position)
            .ok()
            .and_then(|p| self.steps.get(p))
            .map(String::as_str)
    }
}

/// The decision a transition asks for: given the event as found, what to do
/// and what to write in the audit trail, or why not.
pub type Decide<'a> = dyn Fn(&EventSnapshot) -> Result<Verdict, Declined> + Send + Sync + 'a;

/// Why a decision declined to change the event: the decider's own error,
/// handed back untouched in [`TransitionError::Declined`] (the decider
/// downcasts it back to its type).
pub type Declined = Box<dyn std::error::Error + Send + Sync>;

/// What a decision settled on: the transition and its audit row.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The change to make.
    pub decision: Decision,
    /// The audit row to write with it.
    pub audit: AuditNote,
}

/// A transition the store knows as SQL. Each one's `UPDATE` filters on the
/// states it allows and bumps the fencing token: a decision chooses among
/// those states (its flags), it cannot make the `UPDATE` touch an event in a
/// state the transition never allows.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// End the wait of the event's current step now: its deadline becomes
    /// now and it is due, so a worker settles it as the plan says for a
    /// timeout (the timeout branch, or a dead letter). Only while it waits.
    EndWait,
    /// Make the event pending at step `resume_at`, due now, with a fresh
    /// attempt count, and forget the marks of the steps from `resume_at` on
    /// (they run again, with the same idempotency keys). Allowed from dead,
    /// parked, cancelled and stale (a stale event's sequence is cleared, so
    /// the check before its first step lets it through); from done only with
    /// `rerun_done`; from running only with `take_over_expired` and once its
    /// lease has expired.
    Requeue {
        /// The position to resume at.
        resume_at: i32,
        /// Allow re-queueing a done event.
        rerun_done: bool,
        /// Allow re-queueing a running event whose lease has expired.
        take_over_expired: bool,
    },
    /// Cancel the event: allowed from pending, running, dead and parked. A
    /// worker holding it loses its lease.
    Cancel,
    /// Give an ignored event (accepted when no handler took its kind) the
    /// plan of the handler that takes it now: pending at its first step,
    /// due now, with the keys that handler orders and limits it by. Only
    /// from ignored.
    Replan(Replan),
    /// Settle the event's current step `position` by hand (its step row
    /// records `as_state` with `output` and `last_error`) and move past it:
    /// done after the last step, otherwise pending and due now. Allowed from
    /// pending, dead and parked, and from running once the lease has expired.
    SettleStep {
        /// The position of the step; it must be the event's current step.
        position: i32,
        /// What the step row records.
        as_state: SettledAs,
        /// The step's stored output.
        output: serde_json::Value,
        /// The error kept on the step row.
        last_error: Option<String>,
    },
}

/// What [`Decision::Replan`] writes: what an accept would have recorded
/// had the handler been there.
#[derive(Debug, Clone, PartialEq)]
pub struct Replan {
    /// The handler's plan, encoded.
    pub plan_json: String,
    /// How many steps it has.
    pub step_count: i32,
    /// Ordering: the resource the event is about, and its sequence.
    pub resource_key: Option<String>,
    /// The resource's sequence number in this event, when ordered by one.
    pub resource_seq: Option<i64>,
    /// Concurrency: the key whose slots the event takes, and how many it has.
    pub limit_key: Option<String>,
    /// At most this many of the key's events run at once.
    pub limit_n: Option<i32>,
    /// Fair share: the tenant the event is claimed for.
    pub tenant_key: Option<String>,
    /// Priority: the head start of its claim, in milliseconds.
    pub head_start_ms: i32,
}

/// How a step settled by hand is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettledAs {
    /// Skipped: the rest runs without it.
    Skipped,
    /// Done by hand: a fix made outside the system.
    Done,
}

impl SettledAs {
    /// The step state stored for it.
    pub fn step_state(self) -> StepState {
        match self {
            SettledAs::Skipped => StepState::Skipped,
            SettledAs::Done => StepState::Done,
        }
    }
}

/// The audit row a transition writes.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditNote {
    /// Who.
    pub actor: String,
    /// What: `retry`, `cancel`, `skip`, `mark_done`, `replan`.
    pub action: String,
    /// The step acted on, if any.
    pub step: Option<String>,
    /// Why, in the actor's words.
    pub reason: Option<String>,
    /// What changed, in words.
    pub detail: String,
}

/// Why [`Admin::event_transition`] changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    /// No such event.
    #[error("no event {event_seq}")]
    NotFound {
        /// The row number asked for.
        event_seq: i64,
    },
    /// The decision declined; its error, untouched.
    #[error("{0}")]
    Declined(Declined),
    /// The decision named a step position outside the event's stored plan.
    #[error("event {event_seq} has no step at position {position}")]
    NotInPlan {
        /// The event.
        event_seq: i64,
        /// The position named.
        position: i32,
    },
    /// The transition's `UPDATE` changed no row: the event was not in a state
    /// the transition allows.
    #[error("event {event_seq} was not changed (it was {was})")]
    Unchanged {
        /// The event.
        event_seq: i64,
        /// Its state when read.
        was: EventState,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for TransitionError {
    fn from(error: sqlx::Error) -> Self {
        TransitionError::Store(error.into())
    }
}
