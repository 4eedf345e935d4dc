//! What a running step can see: its event, its key, earlier outputs, its
//! attempt, a cancellation token, and (for transactional steps) the engine's
//! transaction.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::event::Event;
use crate::resources::Resources;
use crate::step::StepError;
use crate::store::StepTransaction;

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
