//! The plan: a handler's steps and retry policy as they were when an event was
//! accepted, stored with the event as JSON.
//!
//! ```json
//! {"version":1,
//!  "retry":{"max_attempts":10,"initial_delay":1000,"max_delay":3600000,"multiplier":2.0,"jitter":0.2},
//!  "steps":[{"name":"credit_account","step":{"type":"credit_account","config":{}}},
//!           {"name":"render","step":{"type":"render","config":{}},"timeout_ms":600000}]}
//! ```
//!
//! `name` is the step's name within the handler (it makes the idempotency key);
//! `type` is the step type's stable typetag name (it picks the Rust code);
//! `timeout_ms` and `retry`, when present, override the handler's for that step.
//! A wait step has `"wait"` instead of `"step"` (`tickmark::wait::Wait`); a step
//! on one branch of a wait's outcome has `"only_if": {"wait": …, "on": …}`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::step::Step;
use tickmark_driver::flow::RateLimitUse;
use tickmark_driver::retry::RetryPolicy;
use tickmark_driver::wait::{Branch, Wait};

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

/// How one step runs, when it differs from its handler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOptions {
    /// Give up on an attempt after this long: a retryable failure.
    #[serde(
        default,
        rename = "timeout_ms",
        with = "opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// This step's retry policy, instead of the handler's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

impl StepOptions {
    /// Time out each attempt after `timeout`.
    pub fn timeout(timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            ..Self::default()
        }
    }

    /// Retry this step on `policy` instead of the handler's.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
}

/// What a plan entry does when the event reaches it.
#[derive(Debug)]
pub enum Action {
    /// Run this step.
    Run(Box<dyn Step>),
    /// Wait, holding nothing, for another event or a time.
    Wait(Wait),
}

impl Action {
    /// Borrowed, to encode into a plan.
    pub fn to_encode(&self) -> ActionToEncode<'_> {
        match self {
            Action::Run(step) => ActionToEncode::Run(step.as_ref()),
            Action::Wait(wait) => ActionToEncode::Wait(wait),
        }
    }
}

/// One step of a plan: its name in the handler, what it does, and its options.
#[derive(Debug)]
pub struct PlannedStep {
    /// The step's name within the handler.
    pub name: String,
    /// The step to run, or the wait.
    pub action: Action,
    /// The step runs only on this branch of an earlier wait's outcome.
    pub only_if: Option<Branch>,
    /// Timeout and retry overrides.
    pub options: StepOptions,
    /// The fleet-wide rate limit a run of this step takes a token from.
    pub rate_limit: Option<RateLimitUse>,
}

impl PlannedStep {
    /// Borrowed, to encode into a plan again.
    pub fn to_encode(&self) -> StepToEncode<'_> {
        StepToEncode {
            name: &self.name,
            action: self.action.to_encode(),
            options: self.options,
            rate_limit: self.rate_limit.as_ref(),
            only_if: self.only_if.as_ref(),
        }
    }
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
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a dyn Step>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait: Option<&'a Wait>,
    #[serde(flatten)]
    options: StepOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit: Option<&'a RateLimitUse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    only_if: Option<&'a Branch>,
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
    #[serde(default)]
    step: Option<serde_json::Value>,
    #[serde(default)]
    wait: Option<Wait>,
    #[serde(flatten)]
    options: StepOptions,
    #[serde(default)]
    rate_limit: Option<RateLimitUse>,
    #[serde(default)]
    only_if: Option<Branch>,
}

/// One step to encode into a plan ([`Plan::encode_steps`]).
#[derive(Debug, Clone, Copy)]
pub struct StepToEncode<'a> {
    /// The step's name within the handler.
    pub name: &'a str,
    /// The step, or the wait.
    pub action: ActionToEncode<'a>,
    /// Timeout and retry overrides.
    pub options: StepOptions,
    /// The rate limit it takes a token from, if any.
    pub rate_limit: Option<&'a RateLimitUse>,
    /// The branch of an earlier wait's outcome it runs on, if any.
    pub only_if: Option<&'a Branch>,
}

/// [`Action`], borrowed, to encode.
#[derive(Debug, Clone, Copy)]
pub enum ActionToEncode<'a> {
    /// Run this step.
    Run(&'a dyn Step),
    /// Wait.
    Wait(&'a Wait),
}

impl Plan {
    /// Encode steps and a policy as the stored JSON.
    pub fn encode<'a>(
        retry: &RetryPolicy,
        steps: impl IntoIterator<Item = (&'a str, &'a dyn Step, StepOptions)>,
    ) -> Result<String, serde_json::Error> {
        Self::encode_steps(
            retry,
            steps.into_iter().map(|(name, step, options)| StepToEncode {
                name,
                action: ActionToEncode::Run(step),
                options,
                rate_limit: None,
                only_if: None,
            }),
        )
    }

    /// Encode steps, with their rate limits, and a policy as the stored JSON.
    pub fn encode_steps<'a>(
        retry: &RetryPolicy,
        steps: impl IntoIterator<Item = StepToEncode<'a>>,
    ) -> Result<String, serde_json::Error> {
        serde_json::to_string(&StoredPlanOut {
            version: PLAN_VERSION,
            retry,
            steps: steps
                .into_iter()
                .map(|step| StoredStepOut {
                    name: step.name,
                    step: match step.action {
                        ActionToEncode::Run(run) => Some(run),
                        ActionToEncode::Wait(_) => None,
                    },
                    wait: match step.action {
                        ActionToEncode::Run(_) => None,
                        ActionToEncode::Wait(wait) => Some(wait),
                    },
                    options: step.options,
                    rate_limit: step.rate_limit,
                    only_if: step.only_if,
                })
                .collect(),
        })
    }

    /// The retry policy of step `position`: its own, else the handler's.
    pub fn retry_of(&self, position: usize) -> RetryPolicy {
        self.steps
            .get(position)
            .and_then(|step| step.options.retry)
            .unwrap_or(self.retry)
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

/// Unfinished events whose stored plan this build cannot run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrandedPlan {
    /// How many unfinished events carry the plan.
    pub events: i64,
    /// One of them (its row number).
    pub example_seq: i64,
    /// The step names in the plan, in order.
    pub steps: Vec<String>,
    /// Why this build cannot run it.
    pub problem: String,
}

/// Decode every distinct plan of unfinished events (pending, running, dead,
/// parked) with the step types linked into *this* binary, and list those it
/// cannot run. Run it from the new build before a deploy: an empty list means
/// no accepted event will be stranded. (`tickmark plans check` calls this.)
pub async fn check_stored_plans(
    store: &dyn tickmark_driver::store::Store,
) -> Result<Vec<StrandedPlan>, tickmark_driver::store::StoreError> {
    let mut stranded = Vec::new();
    for group in store.plans_unfinished().await? {
        if let Err(problem) = Plan::decode(&group.plan_json) {
            let steps =
                tickmark_driver::store::decode::step_names(&group.plan_json).unwrap_or_default();
            stranded.push(StrandedPlan {
                events: group.events,
                example_seq: group.example_seq,
                steps,
                problem: problem.to_string(),
            });
        }
    }
    Ok(stranded)
}

fn decode_step(stored: StoredStepIn) -> Result<PlannedStep, PlanError> {
    let action = match (stored.step, stored.wait) {
        (None, Some(wait)) => Action::Wait(wait),
        (Some(step), None) => Action::Run(decode_run(&stored.name, step)?),
        _ => {
            return Err(PlanError::Malformed(format!(
                "step `{}` needs exactly one of `step` and `wait`",
                stored.name
            )))
        }
    };
    Ok(PlannedStep {
        name: stored.name,
        action,
        only_if: stored.only_if,
        options: stored.options,
        rate_limit: stored.rate_limit,
    })
}

fn decode_run(name: &str, step: serde_json::Value) -> Result<Box<dyn Step>, PlanError> {
    let step_type = step
        .get("type")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| PlanError::Malformed(format!("step `{name}` has no `type`")))?;
    match serde_json::from_value::<Box<dyn Step>>(step) {
        Ok(step) => Ok(step),
        Err(error) if error.to_string().contains("unknown variant") => {
            Err(PlanError::UnknownStep {
                step: name.to_owned(),
                step_type,
            })
        }
        Err(error) => Err(PlanError::IncompatibleStep {
            step: name.to_owned(),
            step_type,
            reason: error.to_string(),
        }),
    }
}

mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
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
            [
                ("hello", &wave as &dyn Step, StepOptions::default()),
                (
                    "bye",
                    &Nod as &dyn Step,
                    StepOptions::timeout(Duration::from_secs(5)).retry(RetryPolicy::attempts(7)),
                ),
            ],
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["steps"][0]["step"]["type"], "plan_test_wave");
        assert_eq!(value["steps"][0]["step"]["config"]["hand"], "left");

        let plan = Plan::decode(&json).unwrap();
        assert_eq!(plan.retry.max_attempts, 3);
        let names: Vec<_> = plan.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["hello", "bye"]);
        assert!(format!("{:?}", plan.steps[0].action).contains("left"));
        assert_eq!(plan.steps[0].options, StepOptions::default());
        assert_eq!(plan.steps[1].options.timeout, Some(Duration::from_secs(5)));
        assert_eq!(plan.retry_of(1).max_attempts, 7);
        assert_eq!(plan.retry_of(0).max_attempts, 3);
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
