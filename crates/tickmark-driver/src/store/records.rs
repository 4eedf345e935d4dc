//! The params and rows that cross the [`Store`](super::Store) trait.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::event::{Event, EventState, StepState};
use crate::trace_context::TraceContext;
use crate::wait::{OnTimeout, WaitOutcome};

/// An event to insert into the inbox.
#[derive(Debug, Clone)]
pub struct EventInsert<'a> {
    /// Where it came from.
    pub source: &'a str,
    /// Provider id or `sha256:` body hash.
    pub dedup_key: &'a str,
    /// A second unique key within the source, when the provider's signature
    /// does not cover the id (see [`NewEvent::replay_key`](crate::NewEvent::replay_key)).
    pub replay_key: Option<&'a str>,
    /// Event type.
    pub kind: &'a str,
    /// Body as JSON text.
    pub payload_json: &'a str,
    /// The handler's plan as JSON text.
    pub plan_json: &'a str,
    /// Steps in the plan.
    pub step_count: i32,
    /// `Pending` when a handler exists, `Ignored` otherwise.
    pub state: EventState,
    /// Run not before this time.
    pub not_before: Option<DateTime<Utc>>,
    /// `{source}:{resource id}` when the handler orders events per resource.
    pub resource_key: Option<&'a str>,
    /// The event's sequence for its resource, when stale events are skipped.
    pub resource_seq: Option<i64>,
    /// `{source}:{value}` when the handler limits how many events of a key
    /// run at once, fleet-wide (`Handler::concurrency_per`).
    pub limit_key: Option<&'a str>,
    /// That limit: at most this many events of `limit_key` running at once.
    pub limit_n: Option<i32>,
    /// The tenant whose fair share the event is claimed from
    /// (`Handler::tenant_key`); `None`: claimed in due order, outside any
    /// tenant's share.
    pub tenant_key: Option<&'a str>,
    /// Claimed as if due this many milliseconds earlier (`Handler::head_start`):
    /// its rank in the claim order is its due time less this. 0: none.
    pub head_start_ms: i32,
    /// The trace context of the span that accepted it (the engine's `otel`
    /// feature): every run of the event continues that trace.
    pub trace: Option<&'a TraceContext>,
    /// The keyed hashes of the event's subjects, separated by spaces
    /// (docs/privacy.md): what `erase --subject` finds it by.
    pub subjects: Option<&'a str>,
    /// Coalesce with the waiting events of a key (debounce): inserted in a
    /// transaction of its own, not batched.
    pub debounce: Option<DebounceInsert<'a>>,
    /// The keys a waiting event may match this event by
    /// (`Handler::wait`): recorded with the event, and
    /// the events waiting on them are woken, in the insert's transaction (of
    /// its own, not batched).
    pub match_keys: &'a [String],
}

/// How an accepted event is coalesced with the waiting events of its key
/// (`Handler::debounce_per`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebounceInsert<'a> {
    /// `{source}:{value}`.
    pub key: &'a str,
    /// The event (or the one that takes its place) runs once the key has
    /// been quiet this long...
    pub window: Duration,
    /// ...but no later than this after the first event of the burst.
    pub max_wait: Duration,
}

impl EventInsert<'_> {
    /// An owned copy, for a group-commit queue.
    pub fn to_owned_insert(&self) -> OwnedEventInsert {
        OwnedEventInsert {
            source: self.source.to_owned(),
            dedup_key: self.dedup_key.to_owned(),
            replay_key: self.replay_key.map(str::to_owned),
            kind: self.kind.to_owned(),
            payload_json: self.payload_json.to_owned(),
            plan_json: self.plan_json.to_owned(),
            step_count: self.step_count,
            state: self.state,
            not_before: self.not_before,
            resource_key: self.resource_key.map(str::to_owned),
            resource_seq: self.resource_seq,
            limit_key: self.limit_key.map(str::to_owned),
            limit_n: self.limit_n,
            tenant_key: self.tenant_key.map(str::to_owned),
            head_start_ms: self.head_start_ms,
            trace: self.trace.cloned(),
            subjects: self.subjects.map(str::to_owned),
            #[cfg(feature = "sqlite")]
            match_keys: self.match_keys.to_vec(),
        }
    }
}

/// [`EventInsert`], owned.
#[derive(Debug, Clone)]
pub struct OwnedEventInsert {
    #[doc(hidden)]
    pub source: String,
    #[doc(hidden)]
    pub dedup_key: String,
    #[doc(hidden)]
    pub replay_key: Option<String>,
    #[doc(hidden)]
    pub kind: String,
    #[doc(hidden)]
    pub payload_json: String,
    #[doc(hidden)]
    pub plan_json: String,
    #[doc(hidden)]
    pub step_count: i32,
    #[doc(hidden)]
    pub state: EventState,
    #[doc(hidden)]
    pub not_before: Option<DateTime<Utc>>,
    #[doc(hidden)]
    pub resource_key: Option<String>,
    #[doc(hidden)]
    pub resource_seq: Option<i64>,
    #[doc(hidden)]
    pub limit_key: Option<String>,
    #[doc(hidden)]
    pub limit_n: Option<i32>,
    #[doc(hidden)]
    pub tenant_key: Option<String>,
    #[doc(hidden)]
    pub head_start_ms: i32,
    #[doc(hidden)]
    pub trace: Option<TraceContext>,
    #[doc(hidden)]
    pub subjects: Option<String>,
    /// Only SQLite batches accepts with match keys; PostgreSQL gives them
    /// a transaction of their own (`store/postgres/wait.rs`).
    #[cfg(feature = "sqlite")]
    pub match_keys: Vec<String>,
}

/// The dedup decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "event_seq")]
pub enum InsertOutcome {
    /// First time this (source, dedup key) — and (source, replay key), when
    /// given — was seen: inserted with this row number.
    New(i64),
    /// Already in the inbox, by either key: nothing was written.
    Duplicate,
}

/// What a worker asks for when it claims.
#[derive(Debug, Clone)]
pub struct ClaimParams<'a> {
    /// The worker's name, stored as the lease owner.
    pub worker: &'a str,
    /// At most this many events.
    pub limit: u32,
    /// Lease length.
    pub lease_for: Duration,
    /// Sources this worker runs as many events of as it may: skip them.
    pub skip_sources: &'a [String],
    /// (source, kind) pairs likewise, each as `source` + U+001F + `kind`.
    pub skip_kinds: &'a [String],
    /// A claim *alone*: the claimer holds no other lease and starts nothing
    /// else until this event's run ends, so a crash during it is this
    /// event's own. It leases one event at most, and is the only claim that
    /// takes a *suspect*: an expired lease that was taken alone, or whose
    /// step was already interrupted once in a batch; and, until its step is
    /// marked, a suspect so taken and given back (a shutdown, a snooze, a
    /// throttle). A batch claim (`false`) leases pending events that are not
    /// suspects, and takes over an expired batch lease once (its second
    /// chance, uncharged). A takeover charges an attempt only if the expired
    /// lease was taken alone. Default: `limit == 1`.
    pub alone: bool,
    /// Whether pending events that are not suspects may be leased. `false`
    /// with `alone`: suspects only, nothing else (a worker with nothing in
    /// hand looks for one to run alone, and would otherwise run an ordinary
    /// event alone for nothing). Default: `true`.
    pub pending: bool,
}

impl<'a> ClaimParams<'a> {
    /// Claim up to `limit` events for `worker`, leased for `lease_for`.
    pub fn new(worker: &'a str, limit: u32, lease_for: Duration) -> Self {
        Self {
            worker,
            limit,
            lease_for,
            skip_sources: &[],
            skip_kinds: &[],
            alone: limit == 1,
            pending: true,
        }
    }

    /// The most events this claim may lease: one when it is alone.
    pub fn batch_limit(&self) -> u32 {
        if self.alone {
            self.limit.min(1)
        } else {
            self.limit
        }
    }
}

/// The separator of a (source, kind) pair in [`ClaimParams::skip_kinds`].
pub const KIND_SEPARATOR: char = '\u{1f}';

/// A lease: the event and the fencing token of the claim that took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The event's row number.
    pub event_seq: i64,
    /// The fencing token; every later change filters on it.
    pub token: i64,
}

/// An event handed to a worker by a claim.
#[derive(Debug, Clone)]
pub struct ClaimedEvent {
    /// The event.
    pub event: Event,
    /// Its stored plan (JSON).
    pub plan_json: String,
    /// The first unfinished step.
    pub next_step: i32,
    /// The run of that step this claim starts (1-based): every claim
    /// counts one, as the step-status table shows.
    pub attempt: i32,
    /// Runs of that step that ended with their worker gone while it held
    /// other events too, so the crash is not known to be this event's: not
    /// charged (docs/guarantees.md, exact blame). Included in `attempt`.
    pub interrupted: i32,
    /// The lease.
    pub lease: Lease,
    /// Whether this claim took over an expired lease of another worker.
    pub took_over: bool,
    /// Its resource, when ordered.
    pub resource_key: Option<String>,
    /// Its sequence, when stale events are skipped.
    pub resource_seq: Option<i64>,
    /// The trace its runs continue (see [`EventInsert::trace`]).
    pub trace: Option<TraceContext>,
}

impl ClaimedEvent {
    /// The attempts charged to its step: the runs not [`interrupted`](Self::interrupted)
    /// beside other events. This, not `attempt`, is held against `max_attempts`.
    pub fn charged_attempt(&self) -> i32 {
        (self.attempt - self.interrupted).max(1)
    }
}

/// How a leased event is given back without finishing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Release<'a> {
    /// Give back the attempt the claim (or last mark) counted: the step did
    /// not really run (shutdown before it started, a snooze).
    pub refund_attempt: bool,
    /// Due again after this long (zero: at once).
    pub delay: Duration,
    /// The step asked for the delay (a snooze), as opposed to a shutdown.
    pub snoozed: bool,
    /// Shown as the event's last error (why it waits).
    pub note: Option<&'a str>,
    /// The rate-limit bucket it waits on, when the step found it empty
    /// (the step-status table shows it as `throttled`).
    pub throttled_by: Option<&'a str>,
}

impl Release<'static> {
    /// Give the event back at once (shutdown); refund when the step never started.
    pub fn now(refund_attempt: bool) -> Self {
        Self {
            refund_attempt,
            delay: Duration::ZERO,
            snoozed: false,
            note: None,
            throttled_by: None,
        }
    }
}

impl<'a> Release<'a> {
    /// Give the event back until `delay` has passed, refunding the attempt
    /// (the step asked to wait, or could not start yet); `note` says why.
    pub fn snoozed(delay: Duration, note: &'a str) -> Self {
        Self {
            refund_attempt: true,
            delay,
            snoozed: true,
            note: Some(note),
            throttled_by: None,
        }
    }
}

/// One token asked of a fleet-wide token bucket (GCRA: one number per
/// bucket, the theoretical arrival time of the next request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateTake<'a> {
    /// `{limit name}:{key}`.
    pub bucket: &'a str,
    /// The time one token takes to refill.
    pub refill_every: Duration,
    /// How many tokens the bucket holds when full.
    pub burst: u32,
}

impl RateTake<'_> {
    /// The refill time in microseconds, as the buckets' SQL counts.
    pub fn refill_micros(&self) -> i64 {
        i64::try_from(self.refill_every.as_micros()).unwrap_or(i64::MAX)
    }

    /// The burst, at least one token.
    pub fn burst_tokens(&self) -> i64 {
        i64::from(self.burst.max(1))
    }
}

/// The bucket's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateTaken {
    /// A token was taken: go on.
    Granted,
    /// The bucket is empty; the next token is due after this long (by the
    /// database's clock). Nothing was taken.
    Empty {
        /// How long until a take can succeed.
        next_in: Duration,
    },
}

/// The answer of a sequence check before an ordered event's first step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Newer than the last applied: it is now the last applied; run it.
    Apply,
    /// Not newer: the event is now `stale` and must not run.
    Stale {
        /// The last applied sequence for the resource.
        last_seq: i64,
    },
}

/// A step finished: record it done.
#[derive(Debug, Clone)]
pub struct MarkDone<'a> {
    /// The lease it ran under.
    pub lease: Lease,
    /// Step position in the plan.
    pub position: i32,
    /// Step name.
    pub step: &'a str,
    /// Attempt that succeeded.
    pub attempt: i32,
    /// When the attempt started.
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
    /// Its output as JSON text.
    pub output_json: &'a str,
    /// Recorded `skipped`, not `done`: the step is on the branch of a wait's
    /// outcome that was not taken, and did not run.
    pub skipped: bool,
}

impl MarkDone<'_> {
    /// An owned copy, for a group-commit queue.
    pub fn to_owned_mark(&self) -> OwnedMarkDone {
        OwnedMarkDone {
            lease: self.lease,
            position: self.position,
            step: self.step.to_owned(),
            attempt: self.attempt,
            started_at: self.started_at,
            finished_at: self.finished_at,
            output_json: self.output_json.to_owned(),
        }
    }
}

impl OwnedMarkDone {
    /// Borrow it back as a [`MarkDone`].
    #[cfg(feature = "sqlite")]
    pub fn as_mark(&self) -> MarkDone<'_> {
        MarkDone {
            lease: self.lease,
            position: self.position,
            step: &self.step,
            attempt: self.attempt,
            started_at: self.started_at,
            finished_at: self.finished_at,
            output_json: &self.output_json,
            skipped: false,
        }
    }
}

/// [`MarkDone`], owned.
#[derive(Debug, Clone)]
pub struct OwnedMarkDone {
    #[doc(hidden)]
    pub lease: Lease,
    #[doc(hidden)]
    pub position: i32,
    #[doc(hidden)]
    pub step: String,
    #[doc(hidden)]
    pub attempt: i32,
    #[doc(hidden)]
    pub started_at: DateTime<Utc>,
    #[doc(hidden)]
    pub finished_at: DateTime<Utc>,
    #[doc(hidden)]
    pub output_json: String,
}

/// A leased event has reached a wait step: settle the wait (a match, a
/// timeout) or give the event back to wait, in one transaction
/// ([`Store::step_wait`](super::Store::step_wait)).
#[derive(Debug, Clone)]
pub struct WaitStep<'a> {
    /// The lease the event is held under.
    pub lease: Lease,
    /// The wait's position in the plan.
    pub position: i32,
    /// The wait step's name.
    pub step: &'a str,
    /// The attempt the claim counted (refunded when the event goes back to wait).
    pub attempt: i32,
    /// What it waits on (`tickmark::wait` match key); `None` for a timer.
    pub key: Option<&'a str>,
    /// Matching events accepted this long before the wait began count too
    /// (`None`: any still in the inbox, i.e. within the dedup window).
    pub lookback: Option<Duration>,
    /// When the wait ends, the first time it starts (kept from then on).
    pub deadline: WaitDeadline,
    /// What the deadline does to a wait for an event.
    pub on_timeout: OnTimeout,
    /// Shown as the step's `last_error` while it waits.
    pub waiting_note: &'a str,
    /// The dead-letter reason when a timeout dead-letters.
    pub timeout_error: &'a str,
}

/// When a wait ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitDeadline {
    /// This long after the wait first started (by the database's clock).
    After(Duration),
    /// At this time.
    At(DateTime<Utc>),
}

/// How a [`WaitStep`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitSettled {
    /// The wait step was marked done with `output`; the lease is still
    /// held, and the run goes on with the next step.
    Done {
        /// The stored output ([`WaitOutput`](crate::wait::WaitOutput)).
        output: serde_json::Value,
        /// Matched or timed out (`None` for a timer).
        outcome: Option<WaitOutcome>,
    },
    /// The wait timed out and the event was dead-lettered.
    Dead,
    /// Nothing settled it yet: the event was given back, due at `until`
    /// (or sooner, when a matching event is accepted). No lease is held.
    Waiting {
        /// The deadline.
        until: DateTime<Utc>,
    },
}

/// What happens to an event after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AfterFailure {
    /// Run the step again after this delay.
    RetryIn(Duration),
    /// Dead-letter the event.
    Dead,
}

/// A step failed: record the attempt and what follows.
#[derive(Debug, Clone)]
pub struct MarkFailed<'a> {
    /// The lease it ran under.
    pub lease: Lease,
    /// Step position in the plan.
    pub position: i32,
    /// Step name.
    pub step: &'a str,
    /// Attempt that failed.
    pub attempt: i32,
    /// When the attempt started.
    pub started_at: DateTime<Utc>,
    /// When it failed.
    pub finished_at: DateTime<Utc>,
    /// The failure, as operators will read it.
    pub error: &'a str,
    /// Retry or dead-letter.
    pub then: AfterFailure,
}

/// One row of `tickmark_events`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRecord {
    /// The event.
    pub event: Event,
    /// Its state.
    pub state: EventState,
    /// Steps in its plan.
    pub step_count: i32,
    /// First unfinished step.
    pub next_step: i32,
    /// Attempts of the step at `next_step`.
    pub attempt: i32,
    /// Retry time while pending, lease expiry while running.
    pub due_at: DateTime<Utc>,
    /// The worker that holds (or last held) the lease.
    pub lease_owner: Option<String>,
    /// The current fencing token.
    pub lease_token: i64,
    /// Claims that took over an expired lease.
    pub takeovers: i32,
    /// Runs of the step at `next_step` interrupted beside other events:
    /// counted in `attempt`, not charged (docs/guarantees.md, exact blame).
    pub interrupted: i32,
    /// The most recent failure or interruption.
    pub last_error: Option<String>,
    /// When it reached done, dead or parked.
    pub finished_at: Option<DateTime<Utc>>,
    /// The trace its runs continue, when it was accepted with tracing on.
    #[serde(skip)]
    pub trace: Option<TraceContext>,
    /// When its subject was erased (docs/privacy.md): its payload and its
    /// steps' outputs are gone; the row stays, so a redelivery is still a
    /// duplicate.
    pub erased_at: Option<DateTime<Utc>>,
}

/// One row of the step-status table (`tickmark_step_status`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepStatus {
    /// Position in the plan (0-based).
    pub position: i32,
    /// Step name.
    pub step: String,
    /// `{source}:{event id}:{step}`.
    pub idempotency_key: String,
    /// Stored or derived state.
    pub state: StepState,
    /// Attempts so far.
    pub attempts: i32,
    /// When the current or last attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it was marked done or skipped.
    pub finished_at: Option<DateTime<Utc>>,
    /// When the next attempt is due, while retrying.
    pub retry_at: Option<DateTime<Utc>>,
    /// When the lease expires, while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// The worker running it.
    pub worker: Option<String>,
    /// The most recent failure.
    pub last_error: Option<String>,
    /// The stored output, once done.
    pub output: Option<serde_json::Value>,
    /// While running: the fraction done the step last reported (0 to 1).
    pub progress: Option<f32>,
    /// While running: what the step last said it was doing.
    pub progress_message: Option<String>,
}

/// Unfinished events that share one stored plan (for `plans check`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanGroup {
    /// The stored plan, as JSON text.
    pub plan_json: String,
    /// How many unfinished events carry it.
    pub events: i64,
    /// The row number of one of them.
    pub example_seq: i64,
}

/// How many events are in each state, for metrics and `tickmark status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EventCounts {
    /// Rows per state (states with no rows are absent).
    pub by_state: Vec<(EventState, i64)>,
    /// Events coalesced by debounce, per (source, kind).
    pub superseded: Vec<(String, String, i64)>,
    /// Events waiting (for another event, or a time) at a wait step.
    pub waiting: i64,
    /// How long the oldest due, unclaimed event has waited.
    pub oldest_pending_age: Option<Duration>,
    /// Running events whose lease has expired without a mark.
    pub stuck: i64,
}
