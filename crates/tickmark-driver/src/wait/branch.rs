//! A step that runs on one branch of a wait's outcome.

use serde::{Deserialize, Serialize};

use super::WaitOutcome;

/// Run the step only when the wait named `wait` settled as `outcome`; on the
/// other outcome it is recorded `skipped`. Stored in the plan, so
/// `tickmark plans check` sees both branches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    /// The name of the wait step (an earlier step of the same handler).
    pub wait: String,
    /// The outcome this step runs on.
    pub on: WaitOutcome,
}

impl Branch {
    /// Whether a step on this branch runs, given the wait's output (`None`
    /// when the wait has no output: an operator skipped it — the branch is
    /// not taken).
    pub fn taken(&self, wait_output: Option<&serde_json::Value>) -> bool {
        wait_output.and_then(WaitOutcome::of) == Some(self.on)
    }

    /// The output a step on this branch is recorded `skipped` with when the
    /// branch is not taken.
    pub fn not_taken_output(&self) -> serde_json::Value {
        let on = match self.on {
            WaitOutcome::Matched => "matched",
            WaitOutcome::TimedOut => "timed out",
        };
        serde_json::json!({ "not_taken": format!("runs only if `{}` {on}", self.wait) })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_branch_is_taken_only_on_its_outcome() {
        let on_paid = Branch {
            wait: "paid".into(),
            on: WaitOutcome::Matched,
        };
        let matched = json!({"matched": {"event_seq": 4, "event_id": "p-1"}});
        let timed_out = json!({"timed_out": true});
        assert!(on_paid.taken(Some(&matched)));
        assert!(!on_paid.taken(Some(&timed_out)));
        assert!(!on_paid.taken(None));
        assert!(!on_paid.taken(Some(&json!(null))));
    }
}
