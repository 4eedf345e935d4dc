//! The operator's actions, as methods of every store: each decides with the
//! rules (`rules.rs`) and hands that decision to the store's fenced, audited
//! transition, which applies it in one transaction.

use super::rules::{self, Wording};
use super::{Actor, AdminError, RetryRequest};
use tickmark_driver::store::admin::{
    AuditNote, Decision, Declined, EventSnapshot, SettledAs, TransitionError, Verdict,
};
use tickmark_driver::store::{EventRecord, Store};
use tickmark_driver::wait::WaitOutput;

/// The operator's actions on one event. Every store has them (a blanket
/// impl): `use tickmark::operator::Operations` and call them on the store.
///
/// Each is one transaction that reads the event locked, checks it against
/// the rules, runs an `UPDATE` that filters on the states the action allows
/// and bumps the fencing token (a worker still holding an older lease can
/// change nothing), and writes an audit row. A refused action changes nothing.
#[async_trait::async_trait]
pub trait Operations {
    /// Re-queue a dead, parked, cancelled or done event (or, with `force`, a
    /// running one whose lease expired).
    async fn event_retry(&self, request: &RetryRequest<'_>) -> Result<EventRecord, AdminError>;

    /// Cancel an event that has not finished; a worker holding it loses its lease.
    async fn event_cancel(
        &self,
        event_seq: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// Skip the event's current step (it is not running) and re-queue the rest.
    async fn step_skip(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// Record the event's current step as done by hand (a fix made outside
    /// the system) and re-queue the rest.
    async fn step_mark_done_by_hand(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// Settle the waiting step `step` by hand with the event `fed` (its row
    /// number), as if it had matched: the step is marked done naming it,
    /// and the `if_matched` steps run.
    async fn wait_feed(
        &self,
        event_seq: i64,
        step: &str,
        fed: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;

    /// End the wait of the waiting step `step` now: a worker settles it as a
    /// timeout, as the plan says (its `if_timed_out` steps, or a dead
    /// letter) — unless a matching event is already in the inbox.
    async fn wait_time_out(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError>;
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Operations for S {
    async fn event_retry(&self, request: &RetryRequest<'_>) -> Result<EventRecord, AdminError> {
        transition(self, request.event_seq, |before| {
            let from = request
                .from_step
                .map(|step| before.position_of(step))
                .transpose()?;
            let resume_at = rules::retry(before, from, request.force)?;
            Ok(Verdict {
                decision: Decision::Requeue {
                    resume_at,
                    rerun_done: from.is_some(),
                    take_over_expired: request.force,
                },
                audit: note(
                    &request.actor,
                    "retry",
                    Some(before.step_at(resume_at)),
                    rules::retry_detail(before, resume_at, from.is_some()),
                ),
            })
        })
        .await
    }

    async fn event_cancel(
        &self,
        event_seq: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        transition(self, event_seq, |before| {
            rules::cancel(before)?;
            let step =
                (before.next_step < before.step_count).then(|| before.step_at(before.next_step));
            Ok(Verdict {
                decision: Decision::Cancel,
                audit: note(&actor, "cancel", step, rules::cancel_detail(before)),
            })
        })
        .await
    }

    async fn step_skip(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        settle_step(self, event_seq, step, actor, SettledAs::Skipped).await
    }

    async fn step_mark_done_by_hand(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        settle_step(self, event_seq, step, actor, SettledAs::Done).await
    }

    async fn wait_feed(
        &self,
        event_seq: i64,
        step: &str,
        fed: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        let reason = rules::required_reason(&actor, "feed")?;
        let fed_event = self
            .event_get(fed)
            .await
            .map_err(AdminError::Store)?
            .ok_or_else(|| AdminError::NotFound(fed.to_string()))?;
        let mut output = WaitOutput::fed(fed, &fed_event.event.id, actor.who);
        output["reason"] = reason.into();
        transition(self, event_seq, |before| {
            let position = before.position_of(step)?;
            rules::waiting(before, position)?;
            Ok(Verdict {
                decision: Decision::SettleStep {
                    position,
                    as_state: SettledAs::Done,
                    output: output.clone(),
                    last_error: None,
                },
                audit: note(
                    &actor,
                    "feed",
                    Some(step),
                    format!(
                        "wait settled by hand with event {fed} ({} {} `{}`); its if_matched steps run",
                        fed_event.event.source, fed_event.event.kind, fed_event.event.id
                    ),
                ),
            })
        })
        .await
    }

    async fn wait_time_out(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        rules::required_reason(&actor, "time-out")?;
        transition(self, event_seq, |before| {
            let position = before.position_of(step)?;
            rules::waiting(before, position)?;
            Ok(Verdict {
                decision: Decision::EndWait,
                audit: note(
                    &actor,
                    "time_out",
                    Some(step),
                    "wait ended by hand: its deadline is now, and a worker settles it as a \
                     timeout (the if_timed_out steps, or a dead letter)"
                        .to_owned(),
                ),
            })
        })
        .await
    }
}

/// Skip or mark done by hand: the two differ only in their words and the
/// step row.
async fn settle_step<S: Store + ?Sized>(
    store: &S,
    event_seq: i64,
    step: &str,
    actor: Actor<'_>,
    settled: SettledAs,
) -> Result<EventRecord, AdminError> {
    let (action, verb, key) = match settled {
        SettledAs::Done => ("mark_done", "marked done by hand", "marked_done_by"),
        SettledAs::Skipped => ("skip", "skipped", "skipped_by"),
    };
    let reason = rules::required_reason(&actor, action)?;
    transition(store, event_seq, |before| {
        let position = before.position_of(step)?;
        rules::settle_step(before, position, verb)?;
        Ok(Verdict {
            decision: Decision::SettleStep {
                position,
                as_state: settled,
                output: rules::by_hand_output(key, actor.who, reason),
                // A skipped step keeps the error that made it worth skipping.
                last_error: match settled {
                    SettledAs::Done => None,
                    SettledAs::Skipped => before.last_error.clone(),
                },
            },
            audit: note(
                &actor,
                action,
                Some(step),
                rules::settle_detail(before, verb),
            ),
        })
    })
    .await
}

/// Run the store's transition of `event_seq` with `decide`, turning what the
/// store says back into the operator's words.
pub(super) async fn transition<S, F>(
    store: &S,
    event_seq: i64,
    decide: F,
) -> Result<EventRecord, AdminError>
where
    S: Store + ?Sized,
    F: Fn(&EventSnapshot) -> Result<Verdict, AdminError> + Send + Sync,
{
    let decide = |before: &EventSnapshot| decide(before).map_err(Declined::from);
    match store.event_transition(event_seq, &decide).await {
        Ok(record) => Ok(record),
        Err(TransitionError::NotFound { event_seq }) => {
            Err(AdminError::NotFound(event_seq.to_string()))
        }
        Err(TransitionError::Declined(declined)) => Err(match declined.downcast::<AdminError>() {
            Ok(refusal) => *refusal,
            // `decide` declines only with an `AdminError`; keep any other
            // error's words rather than lose them.
            Err(other) => AdminError::Refused(other.to_string()),
        }),
        Err(TransitionError::Unchanged { event_seq, was }) => {
            Err(rules::changed_meanwhile(event_seq, was))
        }
        Err(error @ TransitionError::NotInPlan { .. }) => {
            Err(AdminError::Refused(error.to_string()))
        }
        Err(TransitionError::Store(error)) => Err(AdminError::Store(error)),
    }
}

/// The audit row of an action by `actor`.
pub(super) fn note(
    actor: &Actor<'_>,
    action: &str,
    step: Option<&str>,
    detail: String,
) -> AuditNote {
    AuditNote {
        actor: actor.who.to_owned(),
        action: action.to_owned(),
        step: step.map(str::to_owned),
        reason: actor.reason.map(str::to_owned),
        detail,
    }
}
