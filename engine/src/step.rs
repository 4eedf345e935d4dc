//! The `Step` trait: one unit of a handler's work. What it returns is in
//! [`outcome`](crate::outcome) (re-exported here).
//!
//! A step is a plain Rust struct. Its fields are its configuration; they are
//! serialised with `typetag` into the event's stored plan when the event is
//! accepted, so a resumed event runs exactly the steps it was accepted with.
//! Every step type has a stable name chosen by its author
//! (`#[typetag::serde(name = "credit_account")]`), never a Rust type path, so
//! moving or renaming the struct does not strand stored plans.

use std::fmt;

use crate::context::StepContext;
pub use crate::outcome::{FailureKind, StepError, StepResult, TerminalExt};

/// One ordered unit of work in a handler.
///
/// The engine runs a step outside any lock or transaction (unless it is
/// [transactional](Step::transactional)), then marks it done in a short
/// transaction that checks the worker still holds the event's lease. A step that
/// was running when its worker died runs again with the same
/// [idempotency key](StepContext::idempotency_key), so external calls should
/// pass that key on.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tickmark::{Step, StepContext, StepResult};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// struct Shout {
///     volume: u8,
/// }
///
/// #[typetag::serde(name = "shout")]
/// #[async_trait::async_trait]
/// impl Step for Shout {
///     async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
///         let name = ctx.event().payload["name"].as_str().unwrap_or("nobody");
///         Ok(serde_json::json!({ "shouted": name.to_uppercase(), "volume": self.volume }))
///     }
/// }
/// ```
#[typetag::serde(tag = "type", content = "config")]
#[async_trait::async_trait]
pub trait Step: Send + Sync + fmt::Debug {
    /// Do the work. A plain `?` on any error is a retryable failure; return
    /// [`StepError::terminal`] to dead-letter the event at once.
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult;

    /// Whether the step writes to the engine's own database inside the engine's
    /// transaction ([`StepContext::transaction`]), so that its writes commit
    /// together with its mark: an exactly-once effect. Such a step holds a
    /// database transaction while it runs, so it should only do database work.
    fn transactional(&self) -> bool {
        false
    }
}
