//! What can go wrong in a test of a handler, each with what to do next.

use std::time::Duration;

use tickmark_core::handler::HandlerConfigError;
use tickmark_core::runner::WorkerConfigError;
use tickmark_driver::event::{EventState, StepState};
use tickmark_driver::store::StoreError;

use super::findings::Findings;
use super::ledger::LedgerViolation;

/// A boxed error from the test's own code (its setup, its end-state query).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A test kit failure: the handler under test broke a promise, or the test
/// could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The handlers do not compile into plans.
    #[error("the handlers are refused: {0}")]
    Handlers(#[from] HandlerConfigError),
    /// The test database failed.
    #[error("the test database failed: {0}")]
    Store(#[from] StoreError),
    /// The kit's worker settings were refused.
    #[error("the test worker's settings are refused: {0}")]
    Worker(#[from] WorkerConfigError),
    /// The temp dir for the SQLite file, or the ledger's socket.
    #[error("{what}: {source}")]
    Io {
        /// What the kit was doing.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Events were still running or due when the time ran out.
    #[error(
        "not idle within {:.1} s: {active} event(s) still running or due; \
         a step that never returns, or a retry schedule longer than the test, keeps it busy \
         (give run_until_idle_within more time, or look at the step-status table)",
        within.as_secs_f64()
    )]
    NotIdle {
        /// The time given.
        within: Duration,
        /// How many events were running or due.
        active: i64,
    },
    /// No event `source`/`id` was accepted.
    #[error("no event {event_source}/{id} was accepted: deliver it first (TestEngine::deliver)")]
    NoSuchEvent {
        /// Its source.
        event_source: String,
        /// Its dedup key.
        id: String,
    },
    /// The event did not end as expected.
    #[error("event {event_source}/{id} is {actual}, not {expected}; its steps: {steps}")]
    EventState {
        /// Its source.
        event_source: String,
        /// Its dedup key.
        id: String,
        /// The state asserted.
        expected: EventState,
        /// The state it is in.
        actual: EventState,
        /// Each step's state and last error, as the step-status table shows them.
        steps: String,
    },
    /// A step did not end as expected.
    #[error("step `{step}` of event {event_source}/{id} is {actual}, not {expected}{}", last_error.as_deref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    StepState {
        /// Its event's source.
        event_source: String,
        /// Its event's dedup key.
        id: String,
        /// The step.
        step: String,
        /// The state asserted.
        expected: StepState,
        /// The state it is in.
        actual: StepState,
        /// Its last failure.
        last_error: Option<String>,
    },
    /// A step asserted on is not in the event's plan.
    #[error("event {event_source}/{id} has no step `{step}`; its steps are: {steps}")]
    NoSuchStep {
        /// Its source.
        event_source: String,
        /// Its dedup key.
        id: String,
        /// The step asked for.
        step: String,
        /// The steps it has.
        steps: String,
    },
    /// The fake clock moves the SQLite store's time only.
    #[error(
        "the fake clock needs the SQLite test engine (TestEngine::sqlite): PostgreSQL reads its own now()"
    )]
    FakeClockNeedsSqlite,
    /// The test's setup (the closure that builds a test engine) failed.
    #[error("the test's setup failed: {0}")]
    Setup(BoxError),
    /// The test's end-state query failed.
    #[error("the test's end-state query failed: {0}")]
    EndState(BoxError),
    /// The handler is not idempotent: each finding names the step, the
    /// crash or delivery that showed it, and the fix.
    #[error("{0}")]
    NotIdempotent(Findings),
    /// The effect ledger saw a double effect.
    #[error("the effect ledger saw a double effect:\n{}", list(.0))]
    DoubleEffect(Vec<LedgerViolation>),
}

fn list(violations: &[LedgerViolation]) -> String {
    violations
        .iter()
        .map(|violation| format!("  - {violation}"))
        .collect::<Vec<_>>()
        .join("\n")
}
