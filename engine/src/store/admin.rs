//! Operator reads and actions: what `tickmark` (the CLI) and the dashboard
//! need. Every action is a named transition whose SQL filters on the expected
//! state, bumps the fencing token (so a worker still holding an old lease can
//! change nothing), and writes an audit row in the same transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{EventRecord, StoreError};
use crate::event::EventState;

/// Who does an operator action, and why.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The operator (`$USER@host` by default in the CLI, `dashboard` for the web page).
    pub who: &'a str,
    /// Why, in their words (required for skip and mark-done).
    pub reason: Option<&'a str>,
}

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

/// Re-queue an event.
#[derive(Debug, Clone)]
pub struct RetryRequest<'a> {
    /// The event.
    pub event_seq: i64,
    /// Re-run from this step (by name); earlier done steps stay done and keep
    /// their idempotency keys. `None`: resume at the first unfinished step.
    pub from_step: Option<&'a str>,
    /// Allow retrying a running event whose lease has expired.
    pub force: bool,
    /// Who and why.
    pub actor: Actor<'a>,
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

/// Why an operator action was not done.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No such event.
    #[error("no event {0}; `tickmark events list` shows the events")]
    NotFound(String),
    /// The event's state does not allow the action; the message says what would.
    #[error("refused: {0}")]
    Refused(String),
    /// The event's plan has no step of that name.
    #[error("event {event_seq} has no step `{step}`; its steps are: {known}")]
    UnknownStep {
        /// The event.
        event_seq: i64,
        /// The name asked for.
        step: String,
        /// The names it has.
        known: String,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AdminError {
    fn from(error: sqlx::Error) -> Self {
        AdminError::Store(error.into())
    }
}

/// The operator side of a store. Both stores implement it.
#[async_trait::async_trait]
pub trait Admin: Send + Sync {
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

    /// Re-queue a dead, parked, cancelled or done event (or, with `force`, a
    /// running one whose lease expired).
    async fn event_retry(&self, request: &RetryRequest<'_>) -> Result<EventRecord, AdminError>;

    /// Cancel an event that has not finished; a worker holding it loses its lease.
    async fn event_cancel(
        &self,
        event_seq: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// Skip the event's current step (it is not running) and re-queue the rest.
    async fn step_skip(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// Record the event's current step as done by hand (a fix made outside
    /// the system) and re-queue the rest.
    async fn step_mark_done_by_hand(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// Delete up to `batch` finished events (done, ignored, cancelled; and dead
    /// when `include_dead`) received more than `older_than` ago, with their
    /// steps and audit rows. Returns how many were deleted (0: nothing left).
    async fn event_prune(
        &self,
        older_than: Duration,
        include_dead: bool,
        batch: u32,
    ) -> Result<u64, StoreError>;

    /// The sources that have events (for prune's safety check).
    async fn sources(&self) -> Result<Vec<String>, StoreError>;
}
