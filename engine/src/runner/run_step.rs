//! Run one step: build its context, open the engine's transaction if it is
//! transactional, and race it against the event's cancellation. A panic in a
//! step is a retryable failure, not a dead worker.

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::context::{StepContext, StepOutputs};
use crate::event::Event;
use crate::plan::PlannedStep;
use crate::resources::Resources;
use crate::step::{StepError, StepResult};
use crate::store::{StepTransaction, Store, StoreError};

/// How a step's run ended.
pub(crate) enum StepRun {
    /// It returned (or panicked). A transactional step's transaction is still
    /// open: the mark commits it, a failure drops (rolls back) it.
    Finished {
        result: StepResult,
        transaction: Option<StepTransaction>,
    },
    /// The event was cancelled (lease lost, or shutdown past the grace period)
    /// before the step returned. Its outcome is unknown.
    Cancelled,
}

pub(crate) async fn run_step(
    store: &dyn Store,
    planned: &PlannedStep,
    event: &Event,
    outputs: &StepOutputs,
    attempt: u32,
    cancel: &CancellationToken,
    resources: &Resources,
) -> Result<StepRun, StoreError> {
    let mut transaction = if planned.step.transactional() {
        Some(store.step_transaction_begin().await?)
    } else {
        None
    };
    let result = {
        let mut ctx = StepContext::new(
            event,
            &planned.name,
            outputs,
            attempt,
            cancel.clone(),
            transaction.as_mut(),
            resources,
        );
        let run = AssertUnwindSafe(planned.step.run(&mut ctx)).catch_unwind();
        tokio::select! {
            biased;
            finished = run => finished.unwrap_or_else(|panic| {
                Err(StepError::retryable(format!("step panicked: {}", panic_message(&*panic))))
            }),
            _ = cancel.cancelled() => return Ok(StepRun::Cancelled),
        }
    };
    Ok(StepRun::Finished {
        result,
        transaction,
    })
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string panic payload")
}
