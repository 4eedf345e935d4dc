//! The `Step` trait: one unit of a handler's work. What it returns is in
//! `outcome.rs` beside it.
//!
//! A step is a plain Rust struct. Its fields are its configuration; they are
//! serialised with `typetag` into the event's stored plan when the event is
//! accepted, so a resumed event runs exactly the steps it was accepted with.
//! Every step type has a stable name chosen by its author
//! (`#[typetag::serde(name = "credit_account")]`), never a Rust type path, so
//! moving or renaming the struct does not strand stored plans.

mod outcome;

use std::fmt;

use crate::context::StepContext;
pub use outcome::{output, FailureKind, StepError, StepResult, TerminalExt};

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
    /// Do the work. A plain `?` on any error is a retryable failure (but a
    /// `serde_json` decode error parks the event); return
    /// [`StepError::terminal`] to dead-letter the event at once.
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult;

    /// The earlier steps of the handler whose outputs this step reads, by
    /// their names in the handler. `Engine::new` refuses a handler in which
    /// one of them is not the name of an earlier step
    /// ([`HandlerConfigError::UnknownOutput`](crate::handler::HandlerConfigError::UnknownOutput)),
    /// so a typo or a reordering is found at start-up, not on the first
    /// event. [`StepContext::output_of`] reads only what is declared here;
    /// the untyped `output` and `output_as` read any name, unchecked.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// use tickmark::Output;
    /// # use tickmark::{Step, StepContext, StepResult};
    ///
    /// #[derive(Debug, Serialize, Deserialize)]
    /// struct Credit {
    ///     credited: i64,
    /// }
    ///
    /// /// The output of the handler's `credit_account` step.
    /// const CREDIT: Output<Credit> = Output::new("credit_account");
    ///
    /// #[derive(Debug, Serialize, Deserialize)]
    /// struct SendReceipt;
    ///
    /// #[typetag::serde(name = "step_doc_send_receipt")]
    /// #[async_trait::async_trait]
    /// impl Step for SendReceipt {
    ///     fn reads(&self) -> Vec<&str> {
    ///         vec![CREDIT.step()]
    ///     }
    ///
    ///     async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
    ///         let credit = ctx.output_of(CREDIT)?;
    ///         tickmark::output(&serde_json::json!({ "sent_for": credit.credited }))
    ///     }
    /// }
    /// ```
    fn reads(&self) -> Vec<&str> {
        Vec::new()
    }

    /// Whether the step writes to the engine's own database inside the engine's
    /// transaction ([`StepContext::transaction`]), so that its writes commit
    /// together with its mark: an exactly-once effect. Such a step holds a
    /// database transaction while it runs, so it should only do database work.
    fn transactional(&self) -> bool {
        false
    }
}
