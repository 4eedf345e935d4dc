//! What a running step can see: its event, its key, earlier outputs, its
//! attempt, a cancellation token, and (for transactional steps) the engine's
//! transaction.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::event::{Accepted, Event, NewEvent};
use crate::outcome::StepError;
use crate::resources::Resources;
use crate::store::{Lease, StepTransaction, Store, StoreError};

/// Progress reports closer together than this are not written (the latest
/// state of a fast loop is enough for an operator).
pub const PROGRESS_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// Writes a running step's progress to its event row, under its lease.
pub(crate) struct ProgressReporter<'a> {
    store: &'a dyn Store,
    lease: Lease,
    last_written: Mutex<Option<Instant>>,
}

impl<'a> ProgressReporter<'a> {
    pub fn new(store: &'a dyn Store, lease: Lease) -> Self {
        Self {
            store,
            lease,
            last_written: Mutex::new(None),
        }
    }
}

/// Where a step's follow-up events go ([`StepContext::enqueue`]): the
/// engine's inbox, which knows the handlers. The runner lends one to each
/// step; the context itself knows nothing of handlers or the inbox.
#[async_trait::async_trait]
pub(crate) trait FollowUps: Send + Sync {
    /// Accept `event` as the receiver would, or refuse it (a kind nobody
    /// handles would be recorded as ignored and never run).
    async fn accept(&self, event: &NewEvent) -> Result<Accepted, StepError>;
}

/// The outputs of the steps of one event that are already marked done, by step name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutputs(BTreeMap<String, serde_json::Value>);

impl StepOutputs {
    /// The stored output of the earlier step `name`, if it is done.
    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.0.get(name)
    }

    /// Record a step's output (the engine does this after each mark).
    pub(crate) fn insert(&mut self, name: String, output: serde_json::Value) {
        self.0.insert(name, output);
    }

    /// Outputs by step name, for testing a step on its own.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, serde_json::Value)>) -> Self {
        Self(pairs.into_iter().collect())
    }

    /// How many outputs are recorded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no step is done yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Everything a step receives when it runs.
pub struct StepContext<'a> {
    event: &'a Event,
    step_name: &'a str,
    idempotency_key: String,
    outputs: &'a StepOutputs,
    attempt: u32,
    cancellation: CancellationToken,
    transaction: Option<&'a mut StepTransaction>,
    resources: &'a Resources,
    progress: Option<ProgressReporter<'a>>,
    follow_ups: Option<&'a dyn FollowUps>,
}

impl<'a> StepContext<'a> {
    /// Assemble a context. The engine does this; tests of a single step can too.
    pub fn new(
        event: &'a Event,
        step_name: &'a str,
        outputs: &'a StepOutputs,
        attempt: u32,
        cancellation: CancellationToken,
        transaction: Option<&'a mut StepTransaction>,
        resources: &'a Resources,
    ) -> Self {
        Self {
            idempotency_key: crate::idempotency_key(&event.source, &event.id, step_name),
            event,
            step_name,
            outputs,
            attempt,
            cancellation,
            transaction,
            resources,
            progress: None,
            follow_ups: None,
        }
    }

    pub(crate) fn with_follow_ups(mut self, follow_ups: &'a dyn FollowUps) -> Self {
        self.follow_ups = Some(follow_ups);
        self
    }

    /// Accept a follow-up event into the inbox, as the receiver would: it is
    /// recorded once and its own handler's steps run later, in any worker.
    /// Give it a dedup key derived from this step's idempotency key (e.g.
    /// `NewEvent::with_id("outbox", ctx.idempotency_key(), …)`) and a re-run
    /// of this step is a duplicate, not a second event.
    pub async fn enqueue(&self, event: NewEvent) -> Result<Accepted, StepError> {
        let Some(follow_ups) = self.follow_ups else {
            return Err(StepError::retryable(
                "this context has no inbox (built outside a worker)",
            ));
        };
        follow_ups.accept(&event).await
    }

    pub(crate) fn with_progress(mut self, reporter: ProgressReporter<'a>) -> Self {
        self.progress = Some(reporter);
        self
    }

    /// Report how far the step is (`fraction` from 0 to 1) and what it is
    /// doing; it shows in the step-status table (`progress`,
    /// `progress_message`) while the step runs. Reports closer together than
    /// [`PROGRESS_MIN_INTERVAL`] are dropped. A lost lease is a retryable
    /// error (the step is being cancelled anyway).
    pub async fn progress(&self, fraction: f32, message: &str) -> Result<(), StepError> {
        let Some(reporter) = &self.progress else {
            return Ok(());
        };
        {
            let mut last = reporter
                .last_written
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < PROGRESS_MIN_INTERVAL) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let message: String = message.chars().take(200).collect();
        match reporter
            .store
            .event_progress(&reporter.lease, fraction, &message)
            .await
        {
            Ok(()) => Ok(()),
            Err(StoreError::LeaseLost { .. }) => Err(StepError::retryable(
                "lease lost while reporting progress; the step is being cancelled",
            )),
            Err(error) => {
                tracing::debug!(%error, "progress not recorded");
                Ok(())
            }
        }
    }

    /// The event being handled.
    pub fn event(&self) -> &Event {
        self.event
    }

    /// This step's name within the handler.
    pub fn step_name(&self) -> &str {
        self.step_name
    }

    /// `{source}:{event id}:{step name}`: identical on every attempt, in every
    /// worker. Pass it to external services (`Idempotency-Key`, file names).
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The output of the earlier step `name`, if it is done.
    pub fn output(&self, name: &str) -> Option<&serde_json::Value> {
        self.outputs.get(name)
    }

    /// The output of the earlier step `name`, deserialised. A missing or
    /// mistyped output is a terminal error: retrying will not change it.
    pub fn output_as<T: DeserializeOwned>(&self, name: &str) -> Result<T, StepError> {
        let value = self.outputs.get(name).ok_or_else(|| {
            StepError::terminal(format!("step `{name}` has no stored output for this event"))
        })?;
        serde_json::from_value(value.clone()).map_err(|error| {
            StepError::terminal(format!("output of step `{name}` does not fit: {error}"))
        })
    }

    /// All outputs of the steps marked done so far.
    pub fn outputs(&self) -> &StepOutputs {
        self.outputs
    }

    /// 1 on the first attempt, counted durably: it survives restarts.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Fires when this worker lost the event's lease or the engine is shutting
    /// down past its grace period. Long steps should check it (or `select!` on
    /// `cancelled()`) and return; the engine drops a step that does not.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// Shorthand for `self.cancellation().is_cancelled()`.
    pub fn is_cancelled(&self) -> bool {
        self.cancellation.is_cancelled()
    }

    /// A shared resource registered with
    /// [`Engine::with_resource`](crate::Engine::with_resource). A missing one is
    /// a retryable failure: the process was started without it, and a fixed
    /// deploy will pick the step up again.
    pub fn resource<T: Send + Sync + 'static>(&self) -> Result<&T, StepError> {
        self.resources.get::<T>().ok_or_else(|| {
            StepError::retryable(format!(
                "resource `{}` was not registered with Engine::with_resource in this process",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The engine's database transaction, in which the step's mark will commit.
    /// Only [transactional](crate::Step::transactional) steps have one; asking
    /// from any other step is a terminal error (a bug in the step).
    pub fn transaction(&mut self) -> Result<&mut StepTransaction, StepError> {
        let step = self.step_name;
        self.transaction.as_deref_mut().ok_or_else(|| {
            StepError::terminal(format!(
                "step `{step}` asked for the engine's transaction but does not declare \
                 `fn transactional(&self) -> bool {{ true }}`"
            ))
        })
    }
}
