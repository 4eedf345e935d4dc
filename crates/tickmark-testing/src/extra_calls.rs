//! The calls a crash run's service applied beyond the clean run's, by the
//! step that made them: the step that was running when each call arrived
//! (the test kit knows), not the step the crash was at, nor the step a key
//! names.
//!
//! A crash re-runs one step; if a *later* step then sends a call again (it
//! re-does an earlier step's call because that step's output came back
//! different), the double effect is the later step's, and so is the fix.

use std::collections::HashMap;

use serde_json::Value;

use super::boundaries::Crash;
use super::findings::Finding;
use super::ledger::LedgerCall;

/// What one run left that the comparison reads: the calls its service
/// applied, and each step's stored output.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunRecord {
    /// The applied calls, in the order they arrived.
    pub calls: Vec<AppliedCall>,
    /// Each step's stored output, by step name.
    pub outputs: HashMap<String, Value>,
}

/// One applied call, as a crash test compares them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct AppliedCall {
    /// The step running when it arrived (else the one its key names).
    pub made_by: Option<String>,
    /// `POST`.
    pub method: String,
    /// `/v1/charges`.
    pub path: String,
}

impl AppliedCall {
    /// The calls of `calls` that took effect.
    pub(crate) fn of(calls: &[LedgerCall]) -> Vec<Self> {
        calls
            .iter()
            .filter(|call| call.applied)
            .map(|call| Self {
                made_by: call
                    .running
                    .as_ref()
                    .or(call.owner.as_ref())
                    .map(|owner| owner.step.clone()),
                method: call.method.clone(),
                path: call.path.clone(),
            })
            .collect()
    }
}

/// A finding for each step other than `crashed` that made more applied
/// calls to one `method path` in the crash run than in the clean run,
/// leaving out the steps in `reported` (the ledger named them already).
pub(crate) fn made_by_other_steps(
    crashed: &str,
    crash: Crash,
    clean: &RunRecord,
    run: &RunRecord,
    reported: &[&str],
) -> Vec<Finding> {
    let mut counts: HashMap<&AppliedCall, i64> = HashMap::new();
    let mut order: Vec<&AppliedCall> = Vec::new();
    for call in &run.calls {
        let count = counts.entry(call).or_insert(0);
        if *count == 0 {
            order.push(call);
        }
        *count += 1;
    }
    for call in &clean.calls {
        *counts.entry(call).or_insert(0) -= 1;
    }
    order
        .into_iter()
        .filter_map(|call| {
            let extra = counts.get(call).copied().unwrap_or(0);
            let step = call.made_by.as_deref()?;
            (extra > 0 && step != crashed && !reported.contains(&step))
                .then(|| finding(step, crashed, crash, call, extra, clean, run))
        })
        .collect()
}

/// `; step `x`'s stored output was {} after the crash, {"hold":"eff_1"} in
/// the clean run` when they differ (what the later step read), else nothing.
fn output_changed(step: &str, clean: &RunRecord, run: &RunRecord) -> String {
    let (before, after) = (clean.outputs.get(step), run.outputs.get(step));
    if before == after {
        return String::new();
    }
    let show = |output: Option<&Value>| output.map_or_else(|| "none".to_owned(), Value::to_string);
    format!(
        "; step `{step}`'s stored output was {} after the crash, {} in the clean run",
        show(after),
        show(before)
    )
}

/// `step` sent `call` `extra` more times than in the clean run.
fn finding(
    step: &str,
    crashed: &str,
    crash: Crash,
    call: &AppliedCall,
    extra: i64,
    clean: &RunRecord,
    run: &RunRecord,
) -> Finding {
    let (method, path) = (&call.method, &call.path);
    let times = if extra == 1 {
        "once more".to_owned()
    } else {
        format!("{extra} more times")
    };
    // Whose call it re-did: another step that made it in the clean run.
    let first_made_by = clean
        .calls
        .iter()
        .filter(|made| made.method == call.method && made.path == call.path)
        .find_map(|made| made.made_by.as_deref().filter(|&by| by != step));
    let (problem, fix) = match first_made_by {
        Some(first) => (
            format!(
                "it sent {method} {path} {times} than in the clean run: the call step \
                 `{first}` makes, which the service applied again (a double effect); step \
                 `{first}` is not to blame, this step re-did its call{}",
                output_changed(first, clean, run)
            ),
            format!(
                "do not re-do step `{first}`'s call: read its result from its stored output \
                 (ctx.output(\"{first}\")), and make `{first}` return that result on every run, \
                 its re-run after a crash included (a service that honours the key answers the \
                 re-sent call with the first answer, which carries it)"
            ),
        ),
        None => (
            format!(
                "it sent {method} {path} {times} than in the clean run, and the service \
                 applied each (a double effect)"
            ),
            "send the same calls whatever an earlier step's output says, each with \
             ctx.idempotency_key() as its Idempotency-Key, so a re-sent call is dropped by the \
             service"
                .to_owned(),
        ),
    };
    Finding {
        step: step.to_owned(),
        crash: Some(crash),
        crashed_step: Some(crashed.to_owned()),
        problem,
        fix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(by: &str, path: &str) -> AppliedCall {
        AppliedCall {
            made_by: Some(by.to_owned()),
            method: "POST".to_owned(),
            path: path.to_owned(),
        }
    }

    #[test]
    fn only_calls_beyond_the_clean_runs_by_another_step_are_found() {
        let record = |calls: &[AppliedCall]| RunRecord {
            calls: calls.to_vec(),
            outputs: HashMap::new(),
        };
        let clean = record(&[call("hold", "/holds"), call("confirm", "/confirmations")]);
        // The crashed step's own re-send is the ledger's to judge; the same
        // calls as the clean run's are nothing.
        let same = record(&[call("hold", "/holds"), call("confirm", "/confirmations")]);
        let resent = record(&[call("hold", "/holds"), call("hold", "/holds")]);
        assert!(made_by_other_steps("hold", Crash::BeforeMark, &clean, &same, &[]).is_empty());
        assert!(made_by_other_steps("hold", Crash::BeforeMark, &clean, &resent, &[]).is_empty());

        let mut redone = record(&[
            call("hold", "/holds"),
            call("confirm", "/holds"),
            call("confirm", "/confirmations"),
        ]);
        redone
            .outputs
            .insert("hold".to_owned(), serde_json::json!({}));
        let found = made_by_other_steps("hold", Crash::BeforeMark, &clean, &redone, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].step, "confirm");
        assert_eq!(found[0].crashed_step.as_deref(), Some("hold"));
        assert!(found[0].problem.contains("the call step `hold` makes"));
        assert!(
            found[0].problem.contains(
                "step `hold`'s stored output was {} after the crash, none in the clean run"
            ),
            "{}",
            found[0].problem
        );
        // Named by the ledger already: not twice.
        assert!(
            made_by_other_steps("hold", Crash::BeforeMark, &clean, &redone, &["confirm"])
                .is_empty()
        );
    }
}
