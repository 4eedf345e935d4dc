//! Run one claimed event: decode its plan, check its sequence, resume at the
//! first unfinished step with the earlier outputs, and run each step outside
//! any lock. What happens after each step (mark done, schedule a retry,
//! dead-letter, park, snooze, give back) is in `settle.rs`; a wait step is
//! `run_wait.rs`'s; a step on the branch of a wait's outcome not taken is
//! recorded skipped.

use std::sync::Arc;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::event_end::EventEnd;
#[cfg(feature = "testing")]
use super::faults::{Boundary, Faults, Reached};
use super::run_step::{run_step, StepInputs, StepRun};
use super::run_wait::run_wait;
use super::settle::Settle;
use super::shared::RunnerShared;
use super::slots::Slot;
use crate::context::StepOutputs;
use crate::idempotency::idempotency_key;
use crate::plan::{Action, Plan};
use crate::privacy::PrivacyError;
use crate::step::FailureKind;
#[cfg(feature = "testing")]
use crate::{plan::PlannedStep, step::Step};
use tickmark_driver::flow::RateLimitUse;
use tickmark_driver::store::transient::retry_transient;
use tickmark_driver::store::{ClaimedEvent, Lease, RateTake, RateTaken, Release, SequenceCheck};

pub async fn run_event(
    shared: &RunnerShared,
    claimed: ClaimedEvent,
    cancel: CancellationToken,
    slot: &mut Slot,
) -> EventEnd {
    let claimed = match opened(shared, claimed) {
        Ok(claimed) => claimed,
        Err((lease, error)) => {
            // Sealed with a key this worker lacks: another worker, or a
            // deploy with the key, can run it; an operator retries it.
            let settle = Settle::new(shared, lease, tracing::Span::current());
            return settle.park(&error.to_string()).await;
        }
    };
    match EventRun::prepare(shared, &claimed, &cancel).await {
        Ok(run) => run.run_steps(slot).await,
        Err(end) => end,
    }
}

/// The claimed event with its payload opened (docs/privacy.md), or why it
/// cannot be.
fn opened(
    shared: &RunnerShared,
    mut claimed: ClaimedEvent,
) -> Result<ClaimedEvent, (Lease, PrivacyError)> {
    let payload = std::mem::take(&mut claimed.event.payload);
    match shared.privacy.open(payload) {
        Ok(payload) => {
            claimed.event.payload = payload;
            Ok(claimed)
        }
        Err(error) => Err((claimed.lease, error)),
    }
}

/// Which run of a step this is, and how many of its attempts are charged
/// (held against `max_attempts`): runs interrupted beside other events are
/// not (docs/guarantees.md, exact blame).
#[derive(Debug, Clone, Copy)]
struct Attempt {
    run: u32,
    charged: u32,
}

impl Attempt {
    /// A step after one marked done in the same run.
    const FIRST: Attempt = Attempt { run: 1, charged: 1 };
}

/// One event's run in this worker, from its first unfinished step.
struct EventRun<'a> {
    shared: &'a RunnerShared,
    claimed: &'a ClaimedEvent,
    cancel: &'a CancellationToken,
    plan: Arc<Plan>,
    first: usize,
    outputs: StepOutputs,
}

impl<'a> EventRun<'a> {
    /// Decode the plan (park the event if this build cannot run it), check an
    /// ordered event's sequence before its first step, and load the outputs
    /// of the steps already done.
    async fn prepare(
        shared: &'a RunnerShared,
        claimed: &'a ClaimedEvent,
        cancel: &'a CancellationToken,
    ) -> Result<EventRun<'a>, EventEnd> {
        let store = shared.store.as_ref();
        let lease = claimed.lease;
        let budget = shared.config.lease;
        let settle = Settle::new(shared, lease, tracing::Span::current());

        let plan = match shared.plans.get(&claimed.plan_json) {
            Ok(plan) => plan,
            Err(error) => return Err(settle.park(&error.to_string()).await),
        };
        let first = usize::try_from(claimed.next_step).unwrap_or(usize::MAX);
        if first >= plan.len() {
            let reason = format!(
                "stored progress (step {}) is past the end of the plan ({} steps)",
                claimed.next_step,
                plan.len()
            );
            return Err(settle.park(&reason).await);
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
                    return Err(EventEnd::Stale);
                }
                Err(error) => return Err(settle.after_mark(Err(error), EventEnd::Abandoned)),
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
                        let step = usize::try_from(position)
                            .ok()
                            .and_then(|p| plan.steps.get(p));
                        let Some(step) = step else { continue };
                        match shared.privacy.open(output) {
                            Ok(output) => outputs.insert(step.name.clone(), output),
                            Err(error) => return Err(settle.park(&error.to_string()).await),
                        }
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "could not load earlier outputs; the lease will expire and the event resume");
                    return Err(EventEnd::Abandoned);
                }
            }
        }
        Ok(EventRun {
            shared,
            claimed,
            cancel,
            plan,
            first,
            outputs,
        })
    }

    /// Run the steps in order until the last is marked done, or one stops the run.
    async fn run_steps(mut self, slot: &mut Slot) -> EventEnd {
        let mut attempt = Attempt {
            run: u32::try_from(self.claimed.attempt).unwrap_or(1).max(1),
            charged: u32::try_from(self.claimed.charged_attempt())
                .unwrap_or(1)
                .max(1),
        };
        for position in self.first..self.plan.len() {
            if let Err(end) = self.run_step_at(position, attempt, slot).await {
                return end;
            }
            // The next step starts on its first attempt (the mark counted it).
            attempt = Attempt::FIRST;
        }
        EventEnd::Done
    }

    /// Run step `position` (its `attempt`-th run) and settle the outcome:
    /// `Ok` when it was marked done and the run goes on. Before a mark that
    /// ends the run (the last step done, a failure, a snooze), the slot is
    /// handed on to the next event; the lease is kept until the mark is
    /// durable.
    async fn run_step_at(
        &mut self,
        position: usize,
        attempt: Attempt,
        slot: &mut Slot,
    ) -> Result<(), EventEnd> {
        let event = &self.claimed.event;
        let name = &self.plan.steps[position].name;
        // Its attributes in a trace too (docs/observability.md): ids and
        // counts, never the payload or an output.
        let span = tracing::info_span!(
            "step",
            event_id = %event.id,
            step = %name,
            position,
            attempt = attempt.run,
            charged = attempt.charged,
            interrupted = self.claimed.interrupted,
            took_over = self.claimed.took_over && position == self.first,
            idempotency_key = %idempotency_key(&event.source, &event.id, name),
            outcome = tracing::field::Empty,
        );
        // A child of the span that accepted the event, not of this run's:
        // a run cut short by a crash never ends its span, so the next run's
        // attempts would hang from one the collector never receives.
        crate::trace::continue_under(&span, self.claimed.trace.as_ref());
        let ran = self.run_step_in(position, attempt, slot, &span).await;
        span.record("outcome", ran.err().map_or("done", EventEnd::name));
        ran
    }

    /// [`run_step_at`](Self::run_step_at) under the attempt's `span`.
    async fn run_step_in(
        &mut self,
        position: usize,
        attempt: Attempt,
        slot: &mut Slot,
        span: &tracing::Span,
    ) -> Result<(), EventEnd> {
        let Attempt {
            run: attempt,
            charged,
        } = attempt;
        let shared = self.shared;
        let plan = Arc::clone(&self.plan);
        let planned = &plan.steps[position];
        // Never `span.enter()` here: a guard held across the awaits below
        // leaks the span into other tasks polled on this thread (and panics
        // tracing-subscriber when the task resumes on another thread).
        let settle = Settle::new(shared, self.claimed.lease, span.clone());
        let step = settle.step(planned, position, attempt, charged);

        if shared.shutdown.is_cancelled() {
            // The step has not started: give the attempt back with the lease.
            return Err(settle.release(&Release::now(true)).await);
        }
        let lease = self.claimed.lease;
        if !shared
            .book
            .is_live(lease.event_seq, tokio::time::Instant::now())
        {
            // The lease ran out while the event waited (for a slot, on a
            // store call, or in a process paused past it): another worker may
            // have run this step already. Never start a step on a lease that
            // is not certainly ours (found by the simulator: seed 83).
            tracing::warn!(parent: span, "lease lost or expired before the step started; another worker resumes the event");
            return Err(EventEnd::LeaseLost);
        }
        let retry = plan.retry_of(position);
        if charged > retry.max_attempts.max(1) {
            // Every earlier charged attempt ended with the worker gone (a
            // crash or a lost lease while it was held alone), so no failure
            // was ever recorded: a poison step.
            return Err(settle.dead_after_crashes(&step, retry.max_attempts).await);
        }

        if let Some(branch) = &planned.only_if {
            if !branch.taken(self.outputs.get(&branch.wait)) {
                let output = branch.not_taken_output();
                if position + 1 == plan.len() {
                    self.ending(slot);
                }
                settle.mark_skipped(&step, &output).await?;
                self.outputs.insert(planned.name.clone(), output);
                return Ok(());
            }
        }
        let code = match &planned.action {
            Action::Run(code) => code.as_ref(),
            Action::Wait(wait) => {
                let settled = run_wait(shared, self.claimed, wait, &step, &settle).await;
                if settled.is_err() || position + 1 == plan.len() {
                    self.ending(slot);
                }
                let output = settled?;
                self.outputs.insert(planned.name.clone(), output);
                return Ok(());
            }
        };

        if let Some(used) = &planned.rate_limit {
            self.take_token(used, &settle, slot).await?;
        }

        #[cfg(feature = "testing")]
        self.reached(planned, code, Boundary::Starting).await;
        let started_at = Utc::now();
        let run = run_step(StepInputs {
            store: shared.store.as_ref(),
            planned,
            step: code,
            event: &self.claimed.event,
            lease: self.claimed.lease,
            outputs: &self.outputs,
            attempt,
            cancel: self.cancel,
            resources: &shared.resources,
            registry: &shared.registry,
            privacy: &shared.privacy,
            book: &shared.book,
        })
        .instrument(span.clone())
        .await;
        let finished_at = Utc::now();
        let step = step.timed(started_at, finished_at);

        match run {
            Err(error) => {
                tracing::warn!(parent: span, %error, "could not open the step's transaction; giving the event back");
                Err(settle.release(&Release::now(true)).await)
            }
            Ok(StepRun::Cancelled) if shared.hard_stop.is_cancelled() => {
                tracing::info!(parent: span, "grace period over; step cancelled, giving the event back");
                // It started: the attempt counts.
                Err(settle.release(&Release::now(false)).await)
            }
            Ok(StepRun::Cancelled) => {
                tracing::warn!(parent: span, "lease lost while the step ran; another worker resumes the event");
                Err(EventEnd::LeaseLost)
            }
            Ok(StepRun::Finished {
                result: Ok(output),
                transaction,
            }) => {
                #[cfg(feature = "testing")]
                self.reached(planned, code, Boundary::BeforeMark).await;
                if position + 1 == plan.len() {
                    self.ending(slot);
                }
                settle.mark_done(&step, &output, transaction).await?;
                #[cfg(feature = "testing")]
                self.reached(planned, code, Boundary::AfterMark).await;
                self.outputs.insert(planned.name.clone(), output);
                Ok(())
            }
            Ok(StepRun::Finished {
                result: Err(failure),
                transaction,
            }) => {
                // Roll back whatever a transactional step wrote.
                drop(transaction);
                self.ending(slot);
                Err(match failure.kind() {
                    FailureKind::Snooze { delay } => settle.snooze(delay, &failure).await,
                    FailureKind::Park => settle.park_at_step(&step, &failure).await,
                    _ => settle.mark_failed(&step, &failure, &retry).await,
                })
            }
        }
    }

    /// Tell the test kit, when it runs this worker, that the step reached
    /// `boundary`; it may stop the worker dead here (`faults.rs`).
    #[cfg(feature = "testing")]
    async fn reached(&self, planned: &PlannedStep, code: &dyn Step, boundary: Boundary) {
        let reached = Reached {
            event: &self.claimed.event,
            step: &planned.name,
            transactional: code.transactional(),
            boundary,
        };
        Faults::at(&self.shared.resources, reached).await;
    }

    /// The run ends with the write about to be sent (the last step's mark, a
    /// failure, a snooze, a release): hand the slot on to the next event, and
    /// tell the lease book that a heartbeat missing this lease from now on
    /// has seen that write, not lost the lease.
    fn ending(&self, slot: &mut Slot) {
        slot.hand_on();
        self.shared.book.settling(self.claimed.lease.event_seq);
    }

    /// Take a token from the step's rate-limit bucket before it runs. `Err`
    /// ends the run: the bucket was empty (the event is given back until the
    /// next token, its attempt refunded), or the limit is not defined in this
    /// build (parked), or the store kept failing (given back at once).
    async fn take_token(
        &self,
        used: &RateLimitUse,
        settle: &Settle<'_>,
        slot: &mut Slot,
    ) -> Result<(), EventEnd> {
        let shared = self.shared;
        let Some(limit) = shared.registry.rate_limit(&used.limit) else {
            let reason = format!(
                "the plan uses rate limit `{}`, which this build does not define \
                 (Handlers::rate_limit); deploy a build that defines it, then retry the event",
                used.limit
            );
            return Err(settle.park(&reason).await);
        };
        let key = used.key.value_of(&self.claimed.event.payload);
        let bucket = limit.bucket(key.as_deref());
        let take = RateTake {
            bucket: &bucket,
            refill_every: limit.refill_every(),
            burst: limit.burst_size(),
        };
        let store = shared.store.as_ref();
        let budget = shared.config.lease;
        match retry_transient("take a rate-limit token", budget, || store.rate_take(&take)).await {
            Ok(RateTaken::Granted) => Ok(()),
            Ok(RateTaken::Empty { next_in }) => {
                self.ending(slot);
                Err(settle.throttle(limit.name(), &bucket, next_in).await)
            }
            Err(error) => {
                tracing::warn!(%error, "could not take a rate-limit token; giving the event back");
                Err(settle.release(&Release::now(true)).await)
            }
        }
    }
}
