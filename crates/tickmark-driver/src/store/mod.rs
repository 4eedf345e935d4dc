//! Storage: one trait, one module per backend.
//!
//! Methods are named noun-then-verb and take params structs. Every state
//! transition of a leased event filters on the expected state **and** the
//! fencing token; zero rows changed is [`StoreError::LeaseLost`], never ignored.
//! A source's reconcile lease is fenced the same way
//! ([`StoreError::ReconcileLeaseLost`]; `reconcile.rs`).
//! The shared conformance suite in `tests/` runs against both backends.

pub mod admin;
pub mod app_connection;
mod clock;
pub mod debounce;
pub mod decode;
mod error;
pub mod group_commit;
pub mod migration;
pub mod portable_query;
pub mod privacy;
pub mod reconcile;
pub mod records;
pub mod tombstone;
pub mod transaction;
pub mod transient;
pub mod twin;
pub mod wait;
mod wakeups;

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

pub use app_connection::AppConnection;
pub use clock::Clock;
pub use error::StoreError;
pub use migration::MigrationError;
pub use portable_query::{PortableQuery, PortableRow, SqlValue};
pub use reconcile::{MissingSubscription, ReconcileCursor, ReconcileLease, ReconcileSummary};
pub use records::{
    AfterFailure, ClaimParams, ClaimedEvent, DebounceInsert, EventCounts, EventInsert, EventRecord,
    InsertOutcome, Lease, MarkDone, MarkFailed, PlanGroup, RateTake, RateTaken, Release,
    SequenceCheck, StepStatus, WaitDeadline, WaitSettled, WaitStep, KIND_SEPARATOR,
};
pub use transaction::StepTransaction;
pub use wakeups::Wakeups;

/// Seals [`Store`] and [`Admin`](admin::Admin).
pub mod sealed {
    /// Implemented through the hidden
    /// [`StoreImplementation`](super::unstable::StoreImplementation): by
    /// tickmark's two stores and the simulator's.
    pub trait Sealed {}
}

/// Not part of tickmark's API: no semver promise covers it.
#[doc(hidden)]
pub mod unstable {
    /// Lets tickmark's own simulator (the `tickmark-sim` crate, unpublished)
    /// implement [`Store`](super::Store) around a real store, to inject
    /// faults. Anything else that implements it may break in any release.
    pub trait StoreImplementation {}

    impl<T: StoreImplementation> super::sealed::Sealed for T {}
}

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One file, embedded: the default.
    Sqlite,
    /// A server shared by many worker processes on many machines.
    Postgres,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        })
    }
}

/// Everything the engine asks of a database; the operator side is the
/// [`Admin`](admin::Admin) supertrait.
///
/// Sealed: only tickmark's own stores implement it, so a new method in a
/// minor release breaks no one. Call it; do not implement it (the
/// simulator's fault-injecting store does, through a hidden trait outside
/// semver).
#[async_trait::async_trait]
pub trait Store: sealed::Sealed + admin::Admin + Send + Sync + fmt::Debug {
    /// Which database this is.
    fn backend(&self) -> Backend;

    /// Apply the schema (idempotent).
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Insert an event unless its (source, dedup key), or its (source, replay
    /// key) when it has one, exists: the dedup decision, in one statement.
    async fn event_insert(&self, event: &EventInsert<'_>) -> Result<InsertOutcome, StoreError>;

    /// [`event_insert`](Self::event_insert) on the application's connection,
    /// in its transaction: the same dedup decision, one insert (not
    /// batched), committed or rolled back with the caller's transaction.
    /// PostgreSQL: the workers' wake-up (`NOTIFY`) is sent in it too, and
    /// delivered at its commit; the transaction must run at READ COMMITTED.
    /// A debounced event is refused ([`StoreError::NotInCallerTransaction`]),
    /// as is a connection of the other backend.
    async fn event_insert_in(
        &self,
        conn: AppConnection<'_>,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError>;

    /// Lease up to `limit` due events to `worker`, each with a new fencing
    /// token, in one short transaction: pending events, and running ones
    /// whose lease expired (a takeover), as [`ClaimParams::alone`] allows.
    async fn event_claim_many(
        &self,
        params: &ClaimParams<'_>,
    ) -> Result<Vec<ClaimedEvent>, StoreError>;

    /// Extend the leases this worker still holds; returns the events whose
    /// leases were extended. A lease missing from the answer is lost.
    async fn event_heartbeat_many(
        &self,
        leases: &[Lease],
        lease_for: Duration,
    ) -> Result<Vec<i64>, StoreError>;

    /// Give a leased event back without finishing its step: on shutdown (at
    /// once), or because the step snoozed (after a delay, attempt refunded).
    async fn event_release(&self, lease: &Lease, release: &Release<'_>) -> Result<(), StoreError>;

    /// Take one token from a fleet-wide rate-limit bucket, or say when the
    /// next one is due. One statement; the bucket is shared by every worker
    /// on this database.
    async fn rate_take(&self, take: &RateTake<'_>) -> Result<RateTaken, StoreError>;

    /// A leased event reached a wait step. In one transaction: if a matching
    /// event is in the inbox (accepted since the wait began, or within its
    /// lookback before), mark the wait done with it; else, if the deadline
    /// has passed, settle the timeout (done as timed out, or dead); else
    /// give the event back, due at the deadline, waiting on the key. The
    /// accept of a matching event makes it due at once, so it comes back
    /// here. Accepts and waits on one key take turns, so none is missed.
    async fn step_wait(&self, wait: &WaitStep<'_>) -> Result<WaitSettled, StoreError>;

    /// Record what the running step reports about its progress.
    async fn event_progress(
        &self,
        lease: &Lease,
        fraction: f32,
        message: &str,
    ) -> Result<(), StoreError>;

    /// Before an ordered event's first step: make its sequence the last
    /// applied for its resource if it is newer, else mark the event stale.
    async fn event_sequence_check(
        &self,
        lease: &Lease,
        resource_key: &str,
        resource_seq: i64,
    ) -> Result<SequenceCheck, StoreError>;

    /// Stop a leased event whose plan this build cannot run; it waits for an operator.
    async fn event_park(&self, lease: &Lease, reason: &str) -> Result<(), StoreError>;

    /// How long until the earliest pending retry or running lease falls due
    /// (zero if one is due now); `None` when nothing is active.
    async fn event_next_due(&self) -> Result<Option<Duration>, StoreError>;

    /// How long the *suspect* that a claim alone would take now has been
    /// due, if there is one: an expired lease that was held alone or whose
    /// step was interrupted in a batch before, or an event given back since
    /// it was taken as a suspect whose step was not marked. Only a claim
    /// alone takes one over. Asked as that claim would be (by a worker
    /// holding nothing, so skipping no source or kind), with the claim's own
    /// filters: a suspect no claim alone could take now (its key at its
    /// limit, an earlier event of its resource unfinished) is not reported.
    async fn event_suspect_waits(&self) -> Result<Option<Duration>, StoreError>;

    /// How many events are pending or running: work for a worker now or
    /// later, except events that wait (for another event, or a time) and
    /// are not due; they hold nothing, and may wait for days.
    async fn event_count_active(&self) -> Result<i64, StoreError>;

    /// Events per state, and the age of the oldest due pending event.
    async fn event_counts(&self) -> Result<EventCounts, StoreError>;

    /// The distinct plans of events that may still run (pending, running,
    /// dead, parked), to check before a deploy that the new build knows
    /// every step type they name.
    async fn plans_unfinished(&self) -> Result<Vec<PlanGroup>, StoreError>;

    /// One event by its row number.
    async fn event_get(&self, event_seq: i64) -> Result<Option<EventRecord>, StoreError>;

    /// One event by its dedup key.
    async fn event_find(
        &self,
        source: &str,
        dedup_key: &str,
    ) -> Result<Option<EventRecord>, StoreError>;

    /// One event by its replay key (the key derived from the signature of a
    /// source whose signature does not cover the id): the event a replayed
    /// delivery duplicates.
    async fn event_find_by_replay_key(
        &self,
        source: &str,
        replay_key: &str,
    ) -> Result<Option<EventRecord>, StoreError>;

    /// The stored outputs of an event's done (or skipped) steps, by position.
    async fn step_outputs(
        &self,
        event_seq: i64,
    ) -> Result<Vec<(i32, serde_json::Value)>, StoreError>;

    /// Open the transaction a transactional step writes in and is marked in.
    async fn step_transaction_begin(&self) -> Result<StepTransaction, StoreError>;

    /// Mark a step done with its output, advancing the event (and finishing it
    /// after the last step). With `transaction`, the mark commits in it.
    async fn step_mark_done(
        &self,
        mark: &MarkDone<'_>,
        transaction: Option<StepTransaction>,
    ) -> Result<(), StoreError>;

    /// Record a failed attempt: schedule the retry, or dead-letter the event.
    async fn step_mark_failed(&self, mark: &MarkFailed<'_>) -> Result<(), StoreError>;

    /// The step-status table of one event, in step order.
    async fn step_status(&self, event_seq: i64) -> Result<Vec<StepStatus>, StoreError>;

    /// A subscription that wakes idle workers when events are accepted.
    async fn wakeups(&self) -> Result<Wakeups, StoreError>;

    /// Take `source`'s reconcile lease for `owner` for `lease_for`,
    /// creating the row on first use (fence 1). Granted when no one holds
    /// it or the holder's lease expired; every grant bumps the fence and
    /// sets `last_run_started_at`. `None` when a lease is held and
    /// unexpired, whoever holds it, `owner` included: each run takes the
    /// lease and gives it back.
    async fn reconcile_lease_take(
        &self,
        source: &str,
        owner: &str,
        lease_for: Duration,
    ) -> Result<Option<ReconcileLease>, StoreError>;

    /// Move `lease`'s source's cursor to `cursor` (the provider's id of the
    /// newest object now fully handled) and `cursor_at` (its creation time
    /// at the provider, or `None` when unknown: both are replaced), and
    /// extend the lease to `lease_for` from now. Fenced: only while the
    /// lease is held, unexpired, under this fence; otherwise nothing
    /// changes and the answer is [`StoreError::ReconcileLeaseLost`].
    async fn reconcile_cursor_advance(
        &self,
        lease: &ReconcileLease,
        cursor: &str,
        cursor_at: Option<DateTime<Utc>>,
        lease_for: Duration,
    ) -> Result<(), StoreError>;

    /// Extend `lease` to `lease_for` from now without moving the cursor (a
    /// long page), fenced as
    /// [`reconcile_cursor_advance`](Self::reconcile_cursor_advance) is.
    async fn reconcile_lease_extend(
        &self,
        lease: &ReconcileLease,
        lease_for: Duration,
    ) -> Result<(), StoreError>;

    /// Give `lease` back, recording the run's `summary` (JSON text) and
    /// `last_run_finished_at`; the source is free for anyone at once.
    /// Fenced on the lease's owner and fence: after another take, nothing
    /// changes and the answer is [`StoreError::ReconcileLeaseLost`]. A
    /// lease that expired but that no one took since is still this run's,
    /// and is given back (as an event's expired lease is, by
    /// [`event_release`](Self::event_release)).
    async fn reconcile_lease_release(
        &self,
        lease: &ReconcileLease,
        summary: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Every source's reconcile row, ordered by source (byte order, on
    /// either backend).
    async fn reconcile_cursors(&self) -> Result<Vec<ReconcileCursor>, StoreError>;

    /// Forget `source`'s cursor (the operator's `--from-scratch`): the next
    /// run starts from the provider's oldest listed object. Only when no
    /// unexpired lease is held: `false` when one is (nothing changed),
    /// `true` otherwise (also when the source has no row yet). The reset
    /// bumps the fence and clears an expired lease, so the run that held
    /// it can change nothing more.
    async fn reconcile_cursor_reset(&self, source: &str) -> Result<bool, StoreError>;
}

/// Which backend a database URL names, if any.
pub fn backend_of(url: &str) -> Option<Backend> {
    if url.starts_with("sqlite:") {
        Some(Backend::Sqlite)
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Some(Backend::Postgres)
    } else {
        None
    }
}
