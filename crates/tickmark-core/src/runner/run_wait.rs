//! Run a wait step: read what it waits on from the plan and the payload,
//! and hand it to the store, which in one transaction settles it (a match,
//! a timeout) or gives the event back to wait, holding nothing.

use tracing::Instrument;

use super::event_end::EventEnd;
use super::settle::{human, Settle, StepAttempt};
use super::shared::RunnerShared;
use crate::step::StepError;
use tickmark_driver::retry::RetryPolicy;
use tickmark_driver::store::transient::retry_transient;
use tickmark_driver::store::{
    ClaimedEvent, Release, StoreError, WaitDeadline, WaitSettled, WaitStep,
};
use tickmark_driver::wait::{match_key, EventWait, OnTimeout, Timer, Wait, WaitOutcome};

/// What the store is asked, with the words operators will read.
struct Asked {
    key: Option<String>,
    lookback: Option<std::time::Duration>,
    deadline: WaitDeadline,
    on_timeout: OnTimeout,
    waiting_note: String,
    timeout_error: String,
}

/// Settle the wait at `step`, or give the event back to wait. `Ok` is the
/// wait's output: it settled and the run goes on.
pub(super) async fn run_wait(
    shared: &RunnerShared,
    claimed: &ClaimedEvent,
    wait: &Wait,
    step: &StepAttempt<'_>,
    settle: &Settle<'_>,
) -> Result<serde_json::Value, EventEnd> {
    let asked = match ask(wait, &claimed.event.payload) {
        Ok(asked) => asked,
        Err(problem) => {
            // The payload cannot satisfy the wait, now or ever.
            let failure = StepError::terminal(problem);
            return Err(settle
                .mark_failed(step, &failure, &RetryPolicy::attempts(1))
                .await);
        }
    };
    let request = WaitStep {
        lease: claimed.lease,
        position: step.position(),
        step: step.name(),
        attempt: step.attempt_i32(),
        key: asked.key.as_deref(),
        lookback: asked.lookback,
        deadline: asked.deadline,
        on_timeout: asked.on_timeout,
        waiting_note: &asked.waiting_note,
        timeout_error: &asked.timeout_error,
    };
    let store = shared.store.as_ref();
    let settled = retry_transient("settle a wait", shared.config.lease, || {
        store.step_wait(&request)
    })
    .instrument(settle.span().clone())
    .await;
    let metrics = &shared.metrics;
    match settled {
        Ok(WaitSettled::Done { output, outcome }) => {
            let said = match outcome {
                Some(WaitOutcome::Matched) => "matched",
                Some(WaitOutcome::TimedOut) => "timed_out",
                None => "slept",
            };
            metrics.wait(said);
            tracing::info!(parent: settle.span(), outcome = said, %output, "wait settled");
            shared.signals.update(|s| s.steps_done += 1);
            Ok(output)
        }
        Ok(WaitSettled::Dead) => {
            metrics.wait("timed_out");
            tracing::error!(parent: settle.span(), error = %asked.timeout_error, "dead-lettering event");
            Err(EventEnd::Dead)
        }
        Ok(WaitSettled::Waiting { until }) => {
            metrics.wait("waiting");
            tracing::info!(parent: settle.span(), %until, note = %asked.waiting_note, "waiting, holding nothing");
            Err(EventEnd::Waiting)
        }
        Err(StoreError::LeaseLost { .. }) => {
            tracing::warn!(parent: settle.span(), "the wait's lease was lost; this worker stops");
            Err(EventEnd::LeaseLost)
        }
        Err(error) => {
            tracing::warn!(parent: settle.span(), %error, "could not settle the wait; giving the event back");
            Err(settle.release(&Release::now(true)).await)
        }
    }
}

/// Read the wait's key or time from the payload; `Err` says why it cannot
/// be read (the event is dead-lettered with these words).
fn ask(wait: &Wait, payload: &serde_json::Value) -> Result<Asked, String> {
    match wait {
        Wait::Event(event_wait) => ask_event(event_wait, payload),
        Wait::Timer(Timer::After(delay)) => Ok(Asked {
            key: None,
            lookback: None,
            deadline: WaitDeadline::After(*delay),
            on_timeout: OnTimeout::Continue,
            waiting_note: format!("sleeping {} (a durable timer)", human(*delay)),
            timeout_error: String::new(),
        }),
        Wait::Timer(timer @ Timer::Until(pointer)) => {
            let at = timer.fires_at(chrono::Utc::now(), payload)?;
            Ok(Asked {
                key: None,
                lookback: None,
                deadline: WaitDeadline::At(at),
                on_timeout: OnTimeout::Continue,
                waiting_note: format!(
                    "sleeping until {} (the payload's `{pointer}`)",
                    at.to_rfc3339()
                ),
                timeout_error: String::new(),
            })
        }
    }
}

fn ask_event(wait: &EventWait, payload: &serde_json::Value) -> Result<Asked, String> {
    let pointers = wait.ours.pointers().join(", ");
    let Some(value) = wait.ours.value_of(payload) else {
        return Err(format!(
            "cannot wait for {} from {}: this event's payload has no value at {pointers}",
            wait.kind, wait.source
        ));
    };
    let theirs = wait.theirs.pointers();
    let awaited = format!(
        "{} from {} whose {} is {value}",
        wait.kind,
        wait.source,
        theirs.join(", ")
    );
    let then = match wait.on_timeout {
        OnTimeout::Continue => "then the if_timed_out steps run",
        OnTimeout::DeadLetter => "then the event is dead-lettered",
    };
    Ok(Asked {
        key: Some(match_key(&wait.source, &wait.kind, theirs, &value)),
        lookback: wait.lookback,
        deadline: WaitDeadline::After(wait.timeout),
        on_timeout: wait.on_timeout,
        waiting_note: format!(
            "waiting for {awaited}, for up to {}; {then}",
            human(wait.timeout)
        ),
        timeout_error: format!(
            "timed out after {} waiting for {awaited}; the handler declares no if_timed_out step, so the event is dead-lettered (retry it to wait again, or cancel it)",
            human(wait.timeout)
        ),
    })
}
