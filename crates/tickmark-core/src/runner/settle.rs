//! What happens after a step: the short transactions that record its outcome
//! under the event's lease — mark it done, schedule its retry, dead-letter the
//! event, snooze it, park it (a plan this build cannot run, or a step that
//! says only a fixed build can get past it), or give it back — and what each means for the
//! rest of the run. Every one filters on the fencing token in the store; a
//! refusal is `LeaseLost`, and this worker stops.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{Instrument, Span};

use super::event_end::EventEnd;
use super::shared::RunnerShared;
use crate::plan::PlannedStep;
use crate::step::StepError;
use tickmark_driver::retry::RetryPolicy;
use tickmark_driver::store::transient::retry_transient;
use tickmark_driver::store::{
    AfterFailure, Lease, MarkDone, MarkFailed, Release, StepTransaction, Store, StoreError,
};

/// One attempt of one step, as its marks record it.
pub struct StepAttempt<'a> {
    name: &'a str,
    position: i32,
    /// Which run of the step this is (every claim counts one).
    attempt: u32,
    /// Attempts charged to it, this one included: held against `max_attempts`.
    charged: u32,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
}

impl<'a> StepAttempt<'a> {
    /// The step's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Its position in the plan.
    pub fn position(&self) -> i32 {
        self.position
    }

    /// The attempt's start and end.
    pub fn timed(self, started_at: DateTime<Utc>, finished_at: DateTime<Utc>) -> Self {
        Self {
            started_at,
            finished_at,
            ..self
        }
    }

    pub fn attempt_i32(&self) -> i32 {
        i32::try_from(self.attempt).unwrap_or(i32::MAX)
    }

    fn took(&self) -> Duration {
        (self.finished_at - self.started_at)
            .to_std()
            .unwrap_or_default()
    }
}

/// Records outcomes for one event under its lease, logging in `span`.
pub struct Settle<'a> {
    shared: &'a RunnerShared,
    lease: Lease,
    span: Span,
}

impl<'a> Settle<'a> {
    pub fn new(shared: &'a RunnerShared, lease: Lease, span: Span) -> Self {
        Self {
            shared,
            lease,
            span,
        }
    }

    /// The span the outcomes are logged in (the step's).
    pub fn span(&self) -> &Span {
        &self.span
    }

    fn store(&self) -> &'a dyn Store {
        self.shared.store.as_ref()
    }

    /// How long in-process retries of a transient store error may go on: the
    /// lease's length (past it, the mark would be refused anyway).
    fn budget(&self) -> Duration {
        self.shared.config.lease
    }

    /// Describe run `attempt` of `planned` at `position`, its `charged`-th
    /// charged attempt (not yet timed).
    pub fn step<'s>(
        &self,
        planned: &'s PlannedStep,
        position: usize,
        attempt: u32,
        charged: u32,
    ) -> StepAttempt<'s> {
        let now = Utc::now();
        StepAttempt {
            name: &planned.name,
            position: i32::try_from(position).unwrap_or(i32::MAX),
            attempt,
            charged,
            started_at: now,
            finished_at: now,
        }
    }

    /// The step finished: mark it done (committing a transactional step's
    /// transaction with the mark). `Err` ends the run.
    pub async fn mark_done(
        &self,
        step: &StepAttempt<'_>,
        output: &serde_json::Value,
        transaction: Option<StepTransaction>,
    ) -> Result<(), EventEnd> {
        self.record_done(step, output, transaction, false).await
    }

    /// The step is on the branch of a wait's outcome that was not taken:
    /// record it `skipped` (it never ran) and go on. `Err` ends the run.
    pub async fn mark_skipped(
        &self,
        step: &StepAttempt<'_>,
        output: &serde_json::Value,
    ) -> Result<(), EventEnd> {
        tracing::info!(parent: &self.span, %output, "branch not taken: step skipped");
        self.record_done(step, output, None, true).await
    }

    async fn record_done(
        &self,
        step: &StepAttempt<'_>,
        output: &serde_json::Value,
        transaction: Option<StepTransaction>,
        skipped: bool,
    ) -> Result<(), EventEnd> {
        let store = self.store();
        let output_json = self
            .shared
            .privacy
            .seal(serde_json::to_string(output).unwrap_or_else(|_| "null".to_owned()));
        let mark = MarkDone {
            lease: self.lease,
            position: step.position,
            step: step.name,
            attempt: step.attempt_i32(),
            started_at: step.started_at,
            finished_at: step.finished_at,
            output_json: &output_json,
            skipped,
        };
        let mark_span = tracing::debug_span!(parent: &self.span, "mark", step = %step.name, attempt = step.attempt);
        let marked = match transaction {
            // The transaction is spent by the attempt: no in-process retry.
            Some(transaction) => {
                store
                    .step_mark_done(&mark, Some(transaction))
                    .instrument(mark_span)
                    .await
            }
            None => {
                retry_transient("mark done", self.budget(), || {
                    store.step_mark_done(&mark, None)
                })
                .instrument(mark_span)
                .await
            }
        };
        match marked {
            Ok(()) => {
                tracing::debug!(parent: &self.span, duration_ms = step.took().as_millis() as u64, "step done");
                if !skipped {
                    self.shared.signals.update(|s| s.steps_done += 1);
                    self.shared.metrics.step_done(step.name, step.took());
                }
                Ok(())
            }
            Err(StoreError::LeaseLost { .. }) => {
                tracing::warn!(parent: &self.span, "mark refused: the lease was lost; this worker stops");
                Err(EventEnd::LeaseLost)
            }
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "could not mark the step done; it re-runs with the same key once the lease expires");
                Err(EventEnd::Abandoned)
            }
        }
    }

    /// The step failed: schedule its retry on `retry`'s durable schedule, or
    /// dead-letter the event (terminal failure, or no attempts left).
    pub async fn mark_failed(
        &self,
        step: &StepAttempt<'_>,
        failure: &StepError,
        retry: &RetryPolicy,
    ) -> EventEnd {
        self.shared.signals.update(|s| s.steps_failed += 1);
        let attempt = step.charged;
        let max = retry.max_attempts.max(1);
        let (then, error, end) = if failure.is_terminal() {
            let error = format!("terminal failure on attempt {attempt}: {failure}");
            (AfterFailure::Dead, error, EventEnd::Dead)
        } else if !retry.allows_another_attempt(attempt) {
            let error = format!("attempt {attempt} of {max} failed, none left: {failure}");
            (AfterFailure::Dead, error, EventEnd::Dead)
        } else {
            let delay = retry
                .delay_after(attempt, tickmark_driver::jitter::unit())
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
        self.shared
            .metrics
            .step_failed(step.name, end == EventEnd::RetryScheduled);
        if end == EventEnd::Dead {
            tracing::error!(parent: &self.span, %error, "dead-lettering event");
        } else {
            tracing::warn!(parent: &self.span, %error, "step failed");
        }
        self.record_failure(step, &error, then, end).await
    }

    /// Every earlier attempt ended with the worker gone (a crash or a lost
    /// lease), so no failure was recorded, yet the attempts ran out: a poison
    /// step. Dead-letter the event without running it again.
    pub async fn dead_after_crashes(&self, step: &StepAttempt<'_>, max_attempts: u32) -> EventEnd {
        let error = format!(
            "ran out of attempts: the worker stopped (crash or lost lease) during each of {max_attempts} attempts"
        );
        tracing::error!(parent: &self.span, %error, "dead-lettering event");
        let crashed = StepAttempt {
            attempt: step.attempt.saturating_sub(1),
            ..*step
        };
        self.record_failure(&crashed, &error, AfterFailure::Dead, EventEnd::Dead)
            .await
    }

    async fn record_failure(
        &self,
        step: &StepAttempt<'_>,
        error: &str,
        then: AfterFailure,
        end: EventEnd,
    ) -> EventEnd {
        let store = self.store();
        let mark = MarkFailed {
            lease: self.lease,
            position: step.position,
            step: step.name,
            attempt: step.attempt_i32(),
            started_at: step.started_at,
            finished_at: step.finished_at,
            error,
            then,
        };
        let marked = retry_transient("mark failed", self.budget(), || {
            store.step_mark_failed(&mark)
        })
        .instrument(self.span.clone())
        .await;
        self.after_mark(marked, end)
    }

    /// The step asked to run again after `delay`: give the event back until
    /// then, refunding the attempt.
    pub async fn snooze(&self, delay: Duration, reason: &StepError) -> EventEnd {
        let note = format!("snoozed for {}: {reason}", human(delay));
        tracing::info!(parent: &self.span, delay_ms = delay.as_millis() as u64, %reason, "step snoozed");
        self.release_then(&Release::snoozed(delay, &note), EventEnd::Snoozed)
            .await
    }

    /// The step's rate-limit bucket is empty: give the event back until the
    /// next token is due, refunding the attempt (the step did not run).
    pub async fn throttle(&self, limit: &str, bucket: &str, next_in: Duration) -> EventEnd {
        let note = format!(
            "throttled by rate limit `{limit}` (bucket `{bucket}`): the next token is due in {}",
            human(next_in)
        );
        tracing::debug!(parent: &self.span, limit, bucket, wait_ms = next_in.as_millis() as u64, "throttled");
        self.shared.metrics.step_throttled(limit);
        let throttle = Release {
            throttled_by: Some(bucket),
            ..Release::snoozed(next_in, &note)
        };
        self.release_then(&throttle, EventEnd::Throttled).await
    }

    /// Give the event back to wait: `end` once the release is recorded.
    async fn release_then(&self, release: &Release<'_>, end: EventEnd) -> EventEnd {
        match self.release(release).await {
            EventEnd::Released => end,
            other => other,
        }
    }

    /// Give the leased event back (shutdown, a snooze, a store error before the step).
    pub async fn release(&self, release: &Release<'_>) -> EventEnd {
        let store = self.store();
        let budget = self.budget().min(Duration::from_secs(5));
        let released = retry_transient("release", budget, || {
            store.event_release(&self.lease, release)
        })
        .instrument(self.span.clone())
        .await;
        match released {
            Ok(()) => EventEnd::Released,
            Err(StoreError::LeaseLost { .. }) => EventEnd::LeaseLost,
            Err(error) => {
                tracing::warn!(parent: &self.span, %error, "could not give the event back; it resumes when its lease expires");
                EventEnd::Abandoned
            }
        }
    }

    /// This build cannot run the event's plan: park it for an operator.
    pub async fn park(&self, reason: &str) -> EventEnd {
        tracing::error!(parent: &self.span, reason, "parking event: this build cannot run its stored plan");
        self.record_park(reason).await
    }

    /// The step ran and said only a fixed build can get past this event
    /// ([`FailureKind::Park`](crate::FailureKind::Park): its payload does not
    /// decode): park the event at this step for an operator, who retries it
    /// once the fix is deployed. As for an unknown step type, the attempt is
    /// given back: the retry starts the step afresh. A transactional step's
    /// writes were rolled back.
    pub async fn park_at_step(&self, step: &StepAttempt<'_>, failure: &StepError) -> EventEnd {
        let reason = format!(
            "step `{}` cannot handle this event in this build: {failure}; deploy a fix, then \
             retry the event",
            step.name
        );
        tracing::error!(parent: &self.span, reason, "parking event: its step cannot handle it");
        self.shared.signals.update(|s| s.steps_failed += 1);
        self.record_park(&reason).await
    }

    async fn record_park(&self, reason: &str) -> EventEnd {
        let store = self.store();
        let parked = retry_transient("park", self.budget(), || {
            store.event_park(&self.lease, reason)
        })
        .instrument(self.span.clone())
        .await;
        self.after_mark(parked, EventEnd::Parked)
    }

    /// What a transition's answer means for the run: `end` if it was recorded.
    pub fn after_mark(&self, marked: Result<(), StoreError>, end: EventEnd) -> EventEnd {
        match marked {
            Ok(()) => end,
            Err(StoreError::LeaseLost { .. }) => {
                tracing::warn!(parent: &self.span, "refused: the lease was lost; this worker stops");
                EventEnd::LeaseLost
            }
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "could not record the outcome; the lease will expire and the step re-runs");
                EventEnd::Abandoned
            }
        }
    }
}

/// Round a delay for people: `250 ms`, `12.5 s`, `3.2 min`, `5.0 h`,
/// `3.0 days`.
pub fn human(delay: Duration) -> String {
    let secs = delay.as_secs_f64();
    if secs < 1.0 {
        format!("{} ms", delay.as_millis())
    } else if secs < 120.0 {
        format!("{secs:.1} s")
    } else if secs < 2.0 * 3600.0 {
        format!("{:.1} min", secs / 60.0)
    } else if secs < 2.0 * 86_400.0 {
        format!("{:.1} h", secs / 3600.0)
    } else {
        format!("{:.1} days", secs / 86_400.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_rounded_to_a_unit_people_read() {
        let said = |secs: u64| human(Duration::from_secs(secs));
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
        assert_eq!(said(12), "12.0 s");
        assert_eq!(said(192), "3.2 min");
        assert_eq!(said(5 * 3600), "5.0 h");
        assert_eq!(said(259_200), "3.0 days");
    }
}
