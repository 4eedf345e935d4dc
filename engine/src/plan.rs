//! The plan: a handler's steps and retry policy as they were when an event was
//! accepted, stored with the event as JSON.
//!
//! ```json
//! {"version":1,
//!  "retry":{"max_attempts":10,"initial_delay":1000,"max_delay":3600000,"multiplier":2.0,"jitter":0.2},
//!  "steps":[{"name":"credit_account","step":{"type":"credit_account","config":{}}}]}
//! ```
//!
//! `name` is the step's name within the handler (it makes the idempotency key);
//! `type` is the step type's stable typetag name (it picks the Rust code).

use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;
use crate::step::Step;

/// The plan format this build writes and reads.
pub const PLAN_VERSION: u32 = 1;

/// Why a stored plan cannot be run by this build.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The plan names a step type this binary does not register. The event is
    /// parked, never dropped: deploy a build that has the type, then retry it.
    #[error(
        "step `{step}` has type `{step_type}`, which this build does not know; deploy a build \
         that registers `#[typetag::serde(name = \"{step_type}\")]`, then `tickmark events retry`"
    )]
    UnknownStep {
        /// The step's name within the handler.
        step: String,
        /// The unknown typetag name.
        step_type: String,
    },
    /// The step type is known, but its stored configuration no longer fits the struct.
    #[error("step `{step}` of type `{step_type}` cannot be decoded: {reason}; keep old fields readable (serde defaults) or rename the type")]
    IncompatibleStep {
        /// The step's name within the handler.
        step: String,
        /// Its typetag name.
        step_type: String,
        /// serde's explanation.
        reason: String,
    },
    /// The plan is not a tickmark plan this build understands.
    #[error("stored plan is unreadable: {0}")]
    Malformed(String),
}

/// One step of a plan: its name in the handler and the step itself.
#[derive(Debug)]
pub struct PlannedStep {
    /// The step's name within the handler.
    pub name: String,
    /// The step, decoded.
    pub step: Box<dyn Step>,
}

/// A decoded plan, ready to run.
#[derive(Debug)]
pub struct Plan {
    /// How failed steps are retried.
    pub retry: RetryPolicy,
    /// The steps, in order.
    pub steps: Vec<PlannedStep>,
}

#[derive(Serialize)]
struct StoredPlanOut<'a> {
    version: u32,
    retry: &'a RetryPolicy,
    steps: Vec<StoredStepOut<'a>>,
}

#[derive(Serialize)]
struct StoredStepOut<'a> {
    name: &'a str,
    step: &'a dyn Step,
}

#[derive(Deserialize)]
struct StoredPlanIn {
    version: u32,
    retry: RetryPolicy,
    steps: Vec<StoredStepIn>,
}

#[derive(Deserialize)]
struct StoredStepIn {
    name: String,
    step: serde_json::Value,
}

impl Plan {
    /// Encode steps and a policy as the stored JSON.
    pub fn encode<'a>(
        retry: &RetryPolicy,
        steps: impl IntoIterator<Item = (&'a str, &'a dyn Step)>,
    ) -> Result<String, serde_json::Error> {
        serde_json::to_string(&StoredPlanOut {
            version: PLAN_VERSION,
            retry,
            steps: steps
                .into_iter()
                .map(|(name, step)| StoredStepOut { name, step })
                .collect(),
        })
    }

    /// Decode a stored plan. An unknown step type is [`PlanError::UnknownStep`].
    pub fn decode(json: &str) -> Result<Plan, PlanError> {
        let stored: StoredPlanIn =
            serde_json::from_str(json).map_err(|error| PlanError::Malformed(error.to_string()))?;
        if stored.version != PLAN_VERSION {
            return Err(PlanError::Malformed(format!(
                "plan version {} (this build reads version {PLAN_VERSION})",
                stored.version
            )));
        }
        let steps = stored
            .steps
            .into_iter()
            .map(decode_step)
            .collect::<Result<_, _>>()?;
        Ok(Plan {
            retry: stored.retry,
            steps,
        })
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the plan has no steps (an ignored event).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

fn decode_step(stored: StoredStepIn) -> Result<PlannedStep, PlanError> {
    let step_type = stored
        .step
        .get("type")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| PlanError::Malformed(format!("step `{}` has no `type`", stored.name)))?;
    match serde_json::from_value::<Box<dyn Step>>(stored.step) {
        Ok(step) => Ok(PlannedStep {
            name: stored.name,
            step,
        }),
        Err(error) if error.to_string().contains("unknown variant") => {
            Err(PlanError::UnknownStep {
                step: stored.name,
                step_type,
            })
        }
        Err(error) => Err(PlanError::IncompatibleStep {
            step: stored.name,
            step_type,
            reason: error.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::context::StepContext;
    use crate::step::StepResult;

    #[derive(Debug, Serialize, Deserialize)]
    struct Wave {
        hand: String,
    }

    #[typetag::serde(name = "plan_test_wave")]
    #[async_trait::async_trait]
    impl Step for Wave {
        async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
            Ok(serde_json::Value::Null)
        }
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Nod;

    #[typetag::serde(name = "plan_test_nod")]
    #[async_trait::async_trait]
    impl Step for Nod {
        async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
            Ok(serde_json::Value::Null)
        }
    }

    #[test]
    fn a_plan_round_trips_with_names_types_and_config() {
        let wave = Wave {
            hand: "left".into(),
        };
        let json = Plan::encode(
            &RetryPolicy::attempts(3),
            [("hello", &wave as &dyn Step), ("bye", &Nod as &dyn Step)],
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["steps"][0]["step"]["type"], "plan_test_wave");
        assert_eq!(value["steps"][0]["step"]["config"]["hand"], "left");

        let plan = Plan::decode(&json).unwrap();
        assert_eq!(plan.retry.max_attempts, 3);
        let names: Vec<_> = plan.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["hello", "bye"]);
        assert!(format!("{:?}", plan.steps[0].step).contains("left"));
    }

    #[test]
    fn an_unknown_step_type_is_a_typed_error_naming_it() {
        let json = r#"{"version":1,"retry":{"max_attempts":1,"initial_delay":1,"max_delay":1,"multiplier":2.0,"jitter":0.0},
            "steps":[{"name":"charge","step":{"type":"charge_v0","config":{}}}]}"#;
        match Plan::decode(json) {
            Err(PlanError::UnknownStep { step, step_type }) => {
                assert_eq!(step, "charge");
                assert_eq!(step_type, "charge_v0");
            }
            other => panic!("expected UnknownStep, got {other:?}"),
        }
    }

    #[test]
    fn a_known_type_with_config_that_no_longer_fits_is_incompatible() {
        let json = r#"{"version":1,"retry":{"max_attempts":1,"initial_delay":1,"max_delay":1,"multiplier":2.0,"jitter":0.0},
            "steps":[{"name":"hello","step":{"type":"plan_test_wave","config":{"hand":7}}}]}"#;
        assert!(matches!(
            Plan::decode(json),
            Err(PlanError::IncompatibleStep { .. })
        ));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for json in [
            "",
            "null",
            "{}",
            r#"{"version":2,"retry":{},"steps":[]}"#,
            "[1,2]",
        ] {
            assert!(
                matches!(Plan::decode(json), Err(PlanError::Malformed(_))),
                "{json}"
            );
        }
    }
}
