//! Run one claimed event: decode its plan, resume at the first unfinished step,
//! run each step outside any lock, and mark it in its own short transaction.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::limits::Limits;
use super::pace::Pace;
use super::plan_cache::PlanCache;
use super::run_step::{run_step, StepInputs, StepRun};
use super::{WorkerConfig, WorkerSignals};
use crate::claim::LeaseBook;
use crate::context::StepOutputs;
use crate::handler::Registry;
use crate::metrics::Metrics;
use crate::resources::Resources;
use crate::step::FailureKind;
use crate::store::transient::retry_transient;
use crate::store::{
    AfterFailure, ClaimedEvent, Lease, MarkDone, MarkFailed, Release, SequenceCheck, Store,
    StoreError,
};

/// What a worker's event tasks share.
#[derive(Debug)]
pub(crate) struct RunnerShared {
    pub store: Arc<dyn Store>,
    pub registry: Arc<Registry>,
    pub resources: Resources,
    pub metrics: Arc<Metrics>,
    pub config: WorkerConfig,
    pub signals: WorkerSignals,
    pub book: Arc<LeaseBook>,
    pub limits: Arc<Limits>,
    pub plans: PlanCache,
    pub pace: Pace,
    /// Stop claiming; running events stop at their next step boundary.
    pub shutdown: CancellationToken,
    /// The grace period is over: cancel running steps.
    pub hard_stop: CancellationToken,
}

/// How an event's run ended (for this worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventEnd {
    /// Every step is done.
    Done,
    /// A step failed; its retry is scheduled.
    RetryScheduled,
    /// Dead-lettered.
    Dead,
    /// Parked on a plan this build cannot run.
    Parked,
    /// Recorded as stale: not newer than its resource's last applied event.
    Stale,
    /// Its step asked to run again later.
    Snoozed,
    /// Given back on shutdown.
    Released,
    /// The lease was taken over or expired: this worker changed nothing more.
    LeaseLost,
    /// The store kept failing; the lease will expire and another claim resumes.
    Abandoned,
}

pub(crate) async fn run_event(
    shared: &RunnerShared,
    claimed: ClaimedEvent,
    cancel: CancellationToken,
) -> EventEnd {
    let store = shared.store.as_ref();
    let lease = claimed.lease;
    let budget = shared.config.lease;

    let plan = match shared.plans.get(&claimed.plan_json) {
        Ok(plan) => plan,
        Err(error) => return park(store, &lease, &error.to_string(), budget).await,
    };
    let first = usize::try_from(claimed.next_step).unwrap_or(usize::MAX);
    if first >= plan.len() {
        let reason = format!(
            "stored progress (step {}) is past the end of the plan ({} steps)",
            claimed.next_step,
            plan.len()
        );
        return park(store, &lease, &reason, budget).await;
    }

    if let (0, Some(key), Some(seq)) = (first, &claimed.resource_key, claimed.resource_seq) {
        let checked = retry_transient("check sequence", budget, || {
            store.event_sequence_check(&lease, key, seq)
        })
        .await;
        match checked {
            Ok(SequenceCheck::Apply) => {}
            Ok(SequenceCheck::Stale { last_seq }) => {
                tracing::info!(resource = %key, sequence = seq, last_seq, "stale event: recorded, not run");
                return EventEnd::Stale;
            }
            Err(error) => return after_mark(Err(error), EventEnd::Abandoned),
        }
    }

    let mut outputs = StepOutputs::default();
    if first > 0 {
        let stored = retry_transient("load step outputs", budget, || {
            store.step_outputs(lease.event_seq)
        })
        .await;
        match stored {
            Ok(stored) => {
                for (position, output) in stored {
                    if let Some(step) = usize::try_from(position)
                        .ok()
                        .and_then(|p| plan.steps.get(p))
                    {
                        outputs.insert(step.name.clone(), output);
                    }
                }
            }
            Err(error) => {
                tracing::error!(%error, "could not load earlier outputs; the lease will expire and the event resume");
                return EventEnd::Abandoned;
            }
        }
    }

    let mut attempt = u32::try_from(claimed.attempt).unwrap_or(1).max(1);
    for (position, planned) in plan.steps.iter().enumerate().skip(first) {
        if shared.shutdown.is_cancelled() {
            // The step has not started: give the attempt back with the lease.
            return release(store, &lease, budget, &Release::now(true)).await;
        }
        let retry = plan.retry_of(position);
        let position_i32 = i32::try_from(position).unwrap_or(i32::MAX);
        let attempt_i32 = i32::try_from(attempt).unwrap_or(i32::MAX);
        let span = tracing::info_span!(
            "step",
            event_id = %claimed.event.id,
            step = %planned.name,
            position,
            attempt
        );

        if attempt > retry.max_attempts.max(1) {
            // Every earlier attempt ended with the worker gone (a crash or a
            // lost lease), so no failure was ever recorded: a poison step.
            let error = format!(
                "ran out of attempts: the worker stopped (crash or lost lease) during each of {} attempts",
                retry.max_attempts
            );
            let now = Utc::now();
            let mark = MarkFailed {
                lease,
                position: position_i32,
                step: &planned.name,
                attempt: attempt_i32 - 1,
                started_at: now,
                finished_at: now,
                error: &error,
                then: AfterFailure::Dead,
            };
            tracing::error!(parent: &span, %error, "dead-lettering event");
            return after_mark(
                retry_transient("mark dead", budget, || store.step_mark_failed(&mark)).await,
                EventEnd::Dead,
            );
        }

        let started_at = Utc::now();
        let run = run_step(StepInputs {
            store,
            planned,
            event: &claimed.event,
            lease,
            outputs: &outputs,
            attempt,
            cancel: &cancel,
            resources: &shared.resources,
            registry: &shared.registry,
        })
        .instrument(span.clone())
        .await;
        let finished_at = Utc::now();
        // Not `span.enter()`: a guard held across the awaits below leaks the
        // span into other tasks polled on this thread (and panics
        // tracing-subscriber when the task resumes on another thread).

        match run {
            Err(error) => {
                tracing::warn!(parent: &span, %error, "could not open the step's transaction; giving the event back");
                return release(store, &lease, budget, &Release::now(true))
                    .instrument(span.clone())
                    .await;
            }
            Ok(StepRun::Cancelled) if shared.hard_stop.is_cancelled() => {
                tracing::info!(parent: &span, "grace period over; step cancelled, giving the event back");
                // It started: the attempt counts.
                return release(store, &lease, budget, &Release::now(false))
                    .instrument(span.clone())
                    .await;
            }
            Ok(StepRun::Cancelled) => {
                tracing::warn!(parent: &span, "lease lost while the step ran; another worker resumes the event");
                return EventEnd::LeaseLost;
            }
            Ok(StepRun::Finished {
                result: Ok(output),
                transaction,
            }) => {
                let output_json =
                    serde_json::to_string(&output).unwrap_or_else(|_| "null".to_owned());
                let mark = MarkDone {
                    lease,
                    position: position_i32,
                    step: &planned.name,
                    attempt: attempt_i32,
                    started_at,
                    finished_at,
                    output_json: &output_json,
                };
                let mark_span = tracing::debug_span!(parent: &span, "mark", event_id = %claimed.event.id, step = %planned.name, attempt);
                let marked = match transaction {
                    // The transaction is spent by the attempt: no in-process retry.
                    Some(transaction) => {
                        store
                            .step_mark_done(&mark, Some(transaction))
                            .instrument(mark_span)
                            .await
                    }
                    None => {
                        retry_transient("mark done", budget, || store.step_mark_done(&mark, None))
                            .instrument(mark_span)
                            .await
                    }
                };
                match marked {
                    Ok(()) => {
                        let millis = (finished_at - started_at).num_milliseconds();
                        tracing::debug!(parent: &span, duration_ms = millis, "step done");
                        shared.signals.update(|s| s.steps_done += 1);
                        shared.metrics.step_done(
                            &planned.name,
                            (finished_at - started_at).to_std().unwrap_or_default(),
                        );
                        outputs.insert(planned.name.clone(), output);
                        attempt = 1;
                    }
                    Err(StoreError::LeaseLost { .. }) => {
                        tracing::warn!(parent: &span, "mark refused: the lease was lost; this worker stops");
                        return EventEnd::LeaseLost;
                    }
                    Err(error) => {
                        tracing::error!(parent: &span, %error, "could not mark the step done; it re-runs with the same key once the lease expires");
                        return EventEnd::Abandoned;
                    }
                }
            }
            Ok(StepRun::Finished {
                result: Err(failure),
                transaction,
            }) if matches!(failure.kind(), FailureKind::Snooze { .. }) => {
                drop(transaction);
                let FailureKind::Snooze { delay } = failure.kind() else {
                    unreachable!("matched above")
                };
                let note = format!("snoozed for {}: {failure}", human(delay));
                tracing::info!(parent: &span, delay_ms = delay.as_millis() as u64, reason = %failure, "step snoozed");
                let snooze = Release {
                    refund_attempt: true,
                    delay,
                    snoozed: true,
                    note: Some(&note),
                };
                return match release(store, &lease, budget, &snooze)
                    .instrument(span.clone())
                    .await
                {
                    EventEnd::Released => EventEnd::Snoozed,
                    other => other,
                };
            }
            Ok(StepRun::Finished {
                result: Err(failure),
                transaction,
            }) => {
                // Roll back whatever a transactional step wrote.
                drop(transaction);
                shared.signals.update(|s| s.steps_failed += 1);
                let max = retry.max_attempts.max(1);
                let (then, error, end) = if failure.is_terminal() {
                    let error = format!("terminal failure on attempt {attempt}: {failure}");
                    (AfterFailure::Dead, error, EventEnd::Dead)
                } else if !retry.allows_another_attempt(attempt) {
                    let error = format!("attempt {attempt} of {max} failed, none left: {failure}");
                    (AfterFailure::Dead, error, EventEnd::Dead)
                } else {
                    let delay = retry
                        .delay_after(attempt, rand::random::<f64>())
                        .max(failure.retry_after().unwrap_or_default());
                    let error = format!(
                        "attempt {attempt} of {max} failed, retrying in {}: {failure}",
                        human(delay)
                    );
                    (
                        AfterFailure::RetryIn(delay),
                        error,
                        EventEnd::RetryScheduled,
                    )
                };
                shared
                    .metrics
                    .step_failed(&planned.name, end == EventEnd::RetryScheduled);
                if end == EventEnd::Dead {
                    tracing::error!(parent: &span, %error, "dead-lettering event");
                } else {
                    tracing::warn!(parent: &span, %error, "step failed");
                }
                let mark = MarkFailed {
                    lease,
                    position: position_i32,
                    step: &planned.name,
                    attempt: attempt_i32,
                    started_at,
                    finished_at,
                    error: &error,
                    then,
                };
                let marked =
                    retry_transient("mark failed", budget, || store.step_mark_failed(&mark))
                        .instrument(span.clone())
                        .await;
                return span.in_scope(|| after_mark(marked, end));
            }
        }
    }
    EventEnd::Done
}

fn after_mark(marked: Result<(), StoreError>, end: EventEnd) -> EventEnd {
    match marked {
        Ok(()) => end,
        Err(StoreError::LeaseLost { .. }) => {
            tracing::warn!("mark refused: the lease was lost; this worker stops");
            EventEnd::LeaseLost
        }
        Err(error) => {
            tracing::error!(%error, "could not record the step's failure; the lease will expire and it re-runs");
            EventEnd::Abandoned
        }
    }
}

async fn park(store: &dyn Store, lease: &Lease, reason: &str, budget: Duration) -> EventEnd {
    tracing::error!(
        reason,
        "parking event: this build cannot run its stored plan"
    );
    after_mark(
        retry_transient("park", budget, || store.event_park(lease, reason)).await,
        EventEnd::Parked,
    )
}

async fn release(
    store: &dyn Store,
    lease: &Lease,
    budget: Duration,
    release: &Release<'_>,
) -> EventEnd {
    match retry_transient("release", budget.min(Duration::from_secs(5)), || {
        store.event_release(lease, release)
    })
    .await
    {
        Ok(()) => EventEnd::Released,
        Err(StoreError::LeaseLost { .. }) => EventEnd::LeaseLost,
        Err(error) => {
            tracing::warn!(%error, "could not give the event back; it resumes when its lease expires");
            EventEnd::Abandoned
        }
    }
}

fn human(delay: Duration) -> String {
    let secs = delay.as_secs_f64();
    if secs < 1.0 {
        format!("{} ms", delay.as_millis())
    } else if secs < 120.0 {
        format!("{secs:.1} s")
    } else {
        format!("{:.1} min", secs / 60.0)
    }
}
