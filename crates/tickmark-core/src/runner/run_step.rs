//! Run one step: build its context, open the engine's transaction if it is
//! transactional, apply its timeout, and race it against the event's
//! cancellation. A panic in a step is a retryable failure, not a dead worker.

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::claim::LeaseBook;
use crate::context::{ProgressReporter, StepContext, StepOutputs};
use crate::handler::Registry;
use crate::inbox::FollowUpInbox;
use crate::plan::PlannedStep;
use crate::privacy::Privacy;
use crate::resources::Resources;
use crate::step::{Step, StepError, StepResult};
use tickmark_driver::event::Event;
use tickmark_driver::store::{Lease, StepTransaction, Store, StoreError};

/// How a step's run ended.
pub enum StepRun {
    /// It returned (or panicked, or timed out). A transactional step's
    /// transaction is still open: the mark commits it, a failure drops (rolls
    /// back) it.
    Finished {
        result: StepResult,
        transaction: Option<StepTransaction>,
    },
    /// The event was cancelled (lease lost, or shutdown past the grace period)
    /// before the step returned. Its outcome is unknown.
    Cancelled,
}

/// Everything one run of one step needs.
pub struct StepInputs<'a> {
    pub store: &'a dyn Store,
    pub planned: &'a PlannedStep,
    /// The planned step's code (its action is `Run`).
    pub step: &'a dyn Step,
    pub event: &'a Event,
    pub lease: Lease,
    pub outputs: &'a StepOutputs,
    pub attempt: u32,
    pub cancel: &'a CancellationToken,
    pub resources: &'a Resources,
    pub registry: &'a Registry,
    pub privacy: &'a Privacy,
    /// The worker's leases: a transactional step starts only if its lease
    /// is still live once its transaction is open.
    pub book: &'a LeaseBook,
}

pub async fn run_step(inputs: StepInputs<'_>) -> Result<StepRun, StoreError> {
    let StepInputs {
        store,
        planned,
        step,
        event,
        lease,
        outputs,
        attempt,
        cancel,
        resources,
        registry,
        privacy,
        book,
    } = inputs;
    let mut transaction = if step.transactional() {
        let transaction = store.step_transaction_begin().await?;
        if !book.is_live(lease.event_seq, tokio::time::Instant::now()) {
            // The lease ran out while the transaction opened (found by the
            // simulator: seed 206): the step must not start.
            return Ok(StepRun::Cancelled);
        }
        Some(transaction)
    } else {
        None
    };
    let follow_ups = FollowUpInbox {
        store,
        registry,
        privacy,
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
        )
        .with_progress(ProgressReporter::new(store, lease))
        .with_follow_ups(&follow_ups)
        .with_declared_reads(step.reads());
        let run = AssertUnwindSafe(step.run(&mut ctx)).catch_unwind();
        let timed = async {
            match planned.options.timeout {
                Some(limit) => tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
                    Ok(Err(StepError::retryable(format!(
                        "timed out after {:.1} s",
                        limit.as_secs_f64()
                    ))))
                }),
                None => run.await,
            }
        };
        tokio::select! {
            biased;
            finished = timed => finished.unwrap_or_else(|panic| {
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
