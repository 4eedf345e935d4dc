//! What an operator asks for: who acts and why, and what a retry re-runs.

/// Who does an operator action, and why.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The operator (`$USER@host` by default in the CLI, `dashboard` for the web page).
    pub who: &'a str,
    /// Why, in their words (required for skip and mark-done).
    pub reason: Option<&'a str>,
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
