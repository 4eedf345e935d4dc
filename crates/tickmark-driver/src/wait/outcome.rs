//! How a wait settled, as the wait step's stored output says it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The two ways a wait for an event settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitOutcome {
    /// A matching event was accepted (or an operator fed one).
    Matched,
    /// The deadline passed with no match (or an operator timed it out).
    TimedOut,
}

impl WaitOutcome {
    /// The outcome a wait step's output records, if it is one.
    pub fn of(output: &Value) -> Option<WaitOutcome> {
        if output.get("matched").is_some_and(Value::is_object) {
            Some(WaitOutcome::Matched)
        } else if output.get("timed_out") == Some(&Value::Bool(true)) {
            Some(WaitOutcome::TimedOut)
        } else {
            None
        }
    }
}

/// The outputs a wait step is marked done with: later steps read them with
/// `StepContext::output`, e.g. the matched event's id.
///
/// ```json
/// {"matched": {"event_seq": 41, "event_id": "evt_123"}}
/// {"timed_out": true, "deadline": "2026-12-04T10:00:00Z"}
/// {"slept_until": "2026-12-04T10:00:00Z"}
/// ```
#[derive(Debug)]
pub struct WaitOutput;

impl WaitOutput {
    /// The event `event_seq` (dedup key `event_id`) matched the wait.
    pub fn matched(event_seq: i64, event_id: &str) -> Value {
        json!({"matched": {"event_seq": event_seq, "event_id": event_id}})
    }

    /// An operator fed the wait event `event_seq` by hand.
    pub fn fed(event_seq: i64, event_id: &str, by: &str) -> Value {
        json!({"matched": {"event_seq": event_seq, "event_id": event_id}, "fed_by": by})
    }

    /// No match came before `deadline`.
    pub fn timed_out(deadline: DateTime<Utc>) -> Value {
        json!({"timed_out": true, "deadline": deadline.to_rfc3339()})
    }

    /// A timer's time came.
    pub fn slept(until: DateTime<Utc>) -> Value {
        json!({"slept_until": until.to_rfc3339()})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_output_says_its_outcome() {
        let now = Utc::now();
        assert_eq!(
            WaitOutcome::of(&WaitOutput::matched(1, "a")),
            Some(WaitOutcome::Matched)
        );
        assert_eq!(
            WaitOutcome::of(&WaitOutput::fed(1, "a", "ops")),
            Some(WaitOutcome::Matched)
        );
        assert_eq!(
            WaitOutcome::of(&WaitOutput::timed_out(now)),
            Some(WaitOutcome::TimedOut)
        );
        assert_eq!(WaitOutcome::of(&WaitOutput::slept(now)), None);
    }
}
