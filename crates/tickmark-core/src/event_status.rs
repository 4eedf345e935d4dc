//! One event and its step-status table, as [`Engine::event_status`] reads
//! them: what an application shows its users, or asserts in its tests,
//! without reaching into the store.
//!
//! [`Engine::event_status`]: crate::Engine::event_status

use serde::Serialize;

use tickmark_driver::event::{Event, EventState};
use tickmark_driver::store::{EventRecord, StepStatus};

/// An event, where it is in its life, and one row per step of its plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventStatus {
    /// The event's row: its state, attempts, lease and last error.
    pub record: EventRecord,
    /// The step-status table, in step order (empty for an ignored event).
    pub steps: Vec<StepStatus>,
}

impl EventStatus {
    /// The event itself: source, id, kind, payload.
    pub fn event(&self) -> &Event {
        &self.record.event
    }

    /// Where the event is: pending, running, done, dead, parked, ignored…
    pub fn state(&self) -> EventState {
        self.record.state
    }

    /// The row of the step named `name`, if the plan has one.
    pub fn step(&self, name: &str) -> Option<&StepStatus> {
        self.steps.iter().find(|step| step.step == name)
    }
}
