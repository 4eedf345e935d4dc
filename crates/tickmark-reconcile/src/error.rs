//! What can stop a reconcile run. A run that stops keeps its cursor where
//! the last whole page left it, so the next run resumes there.

use std::time::Duration;

use tickmark_driver::store::StoreError;

/// Why a reconcile run, or its set-up, did not finish.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The provider's API could not be reached, or kept failing (5xx,
    /// connection refused or reset, no answer in time), after every retry.
    #[error("{what}: {reason} (tried {attempts} times); the provider's API is unreachable or failing — the next run resumes from the cursor")]
    Unreachable {
        /// The request, as `GET https://api.stripe.com/v1/events` (no secrets).
        what: String,
        /// The last failure.
        reason: String,
        /// How many times it was sent.
        attempts: u32,
    },
    /// The provider asked for a pause longer than a run waits.
    #[error("{what}: rate limited for {wait:?}, longer than a run waits; the next run resumes from the cursor")]
    RateLimited {
        /// The request.
        what: String,
        /// How long the provider asked to wait.
        wait: Duration,
    },
    /// The provider refused the request (a 4xx other than 429): a wrong key,
    /// a missing permission, a hook that does not exist.
    #[error("{what}: answered {status}: {message}; {hint}")]
    Refused {
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The provider's own message.
        message: String,
        /// What to check.
        hint: &'static str,
    },
    /// The answer was not what the provider documents.
    #[error("{what}: the answer is not what the API documents: {reason}")]
    Malformed {
        /// The request.
        what: String,
        /// What did not parse.
        reason: String,
    },
    /// The provider's API answered without progress: a page that repeats,
    /// a cursor that does not move or goes backward, an empty page that
    /// claims more. Reading on would never end.
    #[error("{what}: the answer makes no progress: {reason}; the run stopped with the cursor at what was fully read — if this repeats, the provider's API (or a proxy in between) is broken: check the base URL")]
    NoProgress {
        /// The request.
        what: String,
        /// What did not move.
        reason: String,
    },
    /// The run reached its page or time cap ([`RunLimits`](super::RunLimits)).
    /// [`Reconciler::run`](super::Reconciler::run) turns it into a summary
    /// that is not complete: the next run continues from the cursor.
    #[error("the run reached its {cap}; the next run continues from the cursor (raise RunLimits to read more per run)")]
    CapReached {
        /// Which cap: `page cap (500 pages)`, `time cap (10m)`.
        cap: String,
    },
    /// The run panicked (a bug, or a token source of the caller's): it ended
    /// there, its lease given back; the next run resumes from the cursor.
    #[error("the reconcile run panicked: {message}; the next run resumes from the cursor (please report this)")]
    Panicked {
        /// What the panic said.
        message: String,
    },
    /// The provider's API answered for another account or mode than the
    /// source's (a test-mode key where the source takes live events, another
    /// account's key): the run stopped before recording any of it.
    #[error("source `{source_name}`: {found}, but {expected}: the API key is of another account or mode. Nothing of it was recorded; {fix}")]
    ForeignAccount {
        /// The source (not `source`: thiserror takes that for the cause).
        source_name: String,
        /// What the provider answered.
        found: String,
        /// What the source takes, and why we think so.
        expected: String,
        /// What to do.
        fix: String,
    },
    /// Another process holds this source's reconcile lease: one reconciler
    /// in the fleet at a time.
    #[error("another process is reconciling `{source_name}` right now (it holds the lease); try again when its run ends, or see `tickmark reconcile --status`")]
    Busy {
        /// The source (not `source`: thiserror takes that for the cause).
        source_name: String,
    },
    /// No reconciler is configured for this source.
    #[error("no reconciler is configured for source `{source_name}` (configured: {configured}); add one with Reconciler::stripe / github / shopify")]
    UnknownSource {
        /// The source asked for.
        source_name: String,
        /// The sources that are configured, comma-separated.
        configured: String,
    },
    /// A setting the reconciler cannot work with.
    #[error("reconcile configuration: {0}")]
    Config(String),
    /// The run was told to stop (shutdown) before it finished.
    #[error(
        "the reconcile run was stopped before it finished; the next run resumes from the cursor"
    )]
    Cancelled,
    /// The inbox or the cursor could not be written or read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ReconcileError {
    /// Whether this process lost the source's lease to another (which then
    /// goes on from the cursor): not a failure of the fleet.
    pub fn is_lease_lost(&self) -> bool {
        matches!(
            self,
            ReconcileError::Store(StoreError::ReconcileLeaseLost { .. })
        )
    }
}
