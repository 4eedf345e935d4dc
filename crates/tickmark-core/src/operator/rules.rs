//! What each operator action may do to an event in each state, and the words
//! an operator reads: why an action is refused, and what the audit trail says
//! it did. The actions ask these rules about the event the store read, locked,
//! in the action's transaction; the store's `UPDATE` then filters on the same
//! states, so the database stays the judge.

use chrono::{DateTime, SecondsFormat, Utc};

use super::{Actor, AdminError};
use tickmark_driver::event::EventState;
use tickmark_driver::store::admin::EventSnapshot;

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Why an event that ended without running (ignored, stale) is left alone.
fn ended(state: EventState) -> String {
    if state == EventState::Ignored {
        "no handler was registered for its source and kind when it arrived, so it has no \
         steps to run; it is kept so that redeliveries are recognised as duplicates"
            .to_owned()
    } else {
        "it ended without running its steps and stays that way; it is kept so that \
         redeliveries are recognised as duplicates"
            .to_owned()
    }
}

fn owner(before: &EventSnapshot) -> &str {
    before.lease_owner.as_deref().unwrap_or("a worker")
}

/// How an operator reads where an event is, in the words of the refusals
/// and the audit trail.
pub(super) trait Wording {
    /// The name of the step at `position`, or a placeholder past the end.
    fn step_at(&self, position: i32) -> &str;
    /// Where the event is: "step `b` (2 of 3)", or "the end (3 of 3 done)".
    fn at_step(&self, position: i32) -> String;
    /// The position of step `name` in the plan.
    fn position_of(&self, name: &str) -> Result<i32, AdminError>;
    /// The refusal of an action, with the event's number and state.
    fn refused(&self, why: String) -> AdminError;
}

impl Wording for EventSnapshot {
    fn step_at(&self, position: i32) -> &str {
        self.step_name(position).unwrap_or("(end)")
    }

    fn at_step(&self, position: i32) -> String {
        if position >= self.step_count {
            format!("the end ({} of {} steps done)", position, self.step_count)
        } else {
            format!(
                "step `{}` ({} of {})",
                self.step_at(position),
                position + 1,
                self.step_count
            )
        }
    }

    fn position_of(&self, name: &str) -> Result<i32, AdminError> {
        self.steps
            .iter()
            .position(|step| step == name)
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| AdminError::UnknownStep {
                event_seq: self.seq,
                step: name.to_owned(),
                known: if self.steps.is_empty() {
                    "(none)".to_owned()
                } else {
                    self.steps.join(", ")
                },
            })
    }

    fn refused(&self, why: String) -> AdminError {
        AdminError::Refused(format!("event {} is {}: {why}", self.seq, self.state))
    }
}

/// Whether `event_retry` may re-queue `before`, resuming at `from` (a
/// position, already checked to be in the plan) or at its current step.
/// Returns the position it will resume at.
pub(super) fn retry(
    before: &EventSnapshot,
    from: Option<i32>,
    force: bool,
) -> Result<i32, AdminError> {
    let seq = before.seq;
    match before.state {
        EventState::Dead | EventState::Parked | EventState::Cancelled => {}
        // An operator's retry applies a stale event anyway: its sequence is
        // cleared, so the check before the first step lets it through.
        EventState::Stale => {}
        EventState::Done if from.is_some() => {}
        EventState::Done => {
            return Err(before.refused(format!(
                "it finished; choose --from-step NAME to re-run from a step (its steps: {})",
                before.steps.join(", ")
            )))
        }
        EventState::Pending => {
            return Err(before.refused(format!(
                "it is already queued (due {}); a worker will run it at {}. \
                 `tickmark events explain {seq}` says why it waits",
                time(before.due_at),
                before.at_step(before.next_step)
            )))
        }
        EventState::Running if before.lease_expired && force => {}
        EventState::Running if before.lease_expired => {
            return Err(before.refused(format!(
                "the lease of {} expired at {}, and the next claim by any worker takes it \
                 over at {}; to re-queue it now anyway, add --force",
                owner(before),
                time(before.due_at),
                before.at_step(before.next_step)
            )))
        }
        EventState::Running => {
            return Err(before.refused(format!(
                "{} holds its lease until {} and is running {}; wait for the step to end, \
                 or `tickmark events cancel {seq}` (retry works on a running event only \
                 with --force once its lease has expired)",
                owner(before),
                time(before.due_at),
                before.at_step(before.next_step)
            )))
        }
        other => return Err(before.refused(ended(other))),
    }
    match from {
        Some(position) if position > before.next_step => Err(before.refused(format!(
            "--from-step `{}` is after its current step, {}; a retry may re-run steps, not \
             jump over them: retry without --from-step, or `tickmark steps skip` the steps \
             in between",
            before.step_at(position),
            before.at_step(before.next_step)
        ))),
        Some(position) => Ok(position),
        None => Ok(before.next_step),
    }
}

/// Re-planning takes only an ignored event: any other has a plan already.
pub(super) fn replan(before: &EventSnapshot) -> Result<(), AdminError> {
    match before.state {
        EventState::Ignored => Ok(()),
        _ => Err(before.refused("only an ignored event is re-planned; it has its plan".to_owned())),
    }
}

/// Whether `event_cancel` may cancel `before`.
pub(super) fn cancel(before: &EventSnapshot) -> Result<(), AdminError> {
    let seq = before.seq;
    match before.state {
        EventState::Pending | EventState::Running | EventState::Dead | EventState::Parked => Ok(()),
        EventState::Done => Err(before.refused(
            "it finished, there is nothing left to cancel; `tickmark events show` lists \
             what its steps did"
                .to_owned(),
        )),
        EventState::Cancelled => Err(before.refused(format!(
            "it is already cancelled{}; `tickmark events retry {seq}` would re-queue it",
            before
                .finished_at
                .map(|at| format!(" (since {})", time(at)))
                .unwrap_or_default()
        ))),
        other => Err(before.refused(ended(other))),
    }
}

/// Whether step `position` of `before` may be skipped or marked done by hand.
pub(super) fn settle_step(
    before: &EventSnapshot,
    position: i32,
    verb: &str,
) -> Result<(), AdminError> {
    let seq = before.seq;
    match before.state {
        EventState::Pending | EventState::Dead | EventState::Parked => {}
        EventState::Running if before.lease_expired => {}
        EventState::Running => {
            return Err(before.refused(format!(
                "{} holds its lease until {} and is running {}; a running step cannot be \
                 {verb}: wait for it to end (or fail), or for its lease to expire",
                owner(before),
                time(before.due_at),
                before.at_step(before.next_step)
            )))
        }
        EventState::Done => {
            return Err(before.refused(format!(
                "it finished, every step is settled; to re-run steps, \
                 `tickmark events retry {seq} --from-step NAME`"
            )))
        }
        EventState::Cancelled => {
            return Err(before.refused(format!(
                "nothing runs for it; `tickmark events retry {seq}` re-queues it first"
            )))
        }
        other => return Err(before.refused(ended(other))),
    }
    if position != before.next_step {
        let when = if position < before.next_step {
            "it is already settled (done or skipped)"
        } else {
            "it has not been reached yet"
        };
        return Err(before.refused(format!(
            "only its current step can be {verb}, and that is {}; step `{}`: {when}",
            before.at_step(before.next_step),
            before.step_at(position)
        )));
    }
    Ok(())
}

/// Whether step `position` of `before` waits, so that an operator may feed
/// it an event or time it out.
pub(super) fn waiting(before: &EventSnapshot, position: i32) -> Result<(), AdminError> {
    let at_it = position == before.next_step && before.state == EventState::Pending;
    match before.waiting_until {
        Some(_) if at_it => Ok(()),
        _ => Err(before.refused(format!(
            "step `{}` is not waiting (only a wait step that has begun waiting can be fed an \
             event or timed out; the event is at {})",
            before.step_at(position),
            before.at_step(before.next_step)
        ))),
    }
}

/// The reason skip and mark-done require.
pub(super) fn required_reason<'a>(actor: &Actor<'a>, action: &str) -> Result<&'a str, AdminError> {
    match actor.reason.map(str::trim) {
        Some(reason) if !reason.is_empty() => Ok(reason),
        _ => Err(AdminError::Refused(format!(
            "{action} needs a reason: pass --reason \"…\" (it goes into the audit trail)"
        ))),
    }
}

/// The audit detail of a retry.
pub(super) fn retry_detail(before: &EventSnapshot, resume_at: i32, from_step: bool) -> String {
    let mut detail = format!(
        "{} → pending, resuming at {}",
        before.state,
        before.at_step(resume_at)
    );
    if from_step && resume_at < before.next_step.min(before.step_count) {
        detail.push_str("; steps from there on run again with the same idempotency keys");
    }
    if let Some(error) = &before.last_error {
        detail.push_str("; last error was: ");
        detail.push_str(&clip(error, 300));
    }
    detail
}

/// The audit detail of a cancel.
pub(super) fn cancel_detail(before: &EventSnapshot) -> String {
    let mut detail = format!(
        "{} → cancelled at {}",
        before.state,
        before.at_step(before.next_step)
    );
    if before.state == EventState::Running {
        detail.push_str(&format!(
            "; the lease of {} was revoked{}",
            owner(before),
            if before.lease_expired {
                " (it had expired)"
            } else {
                ": its next heartbeat or mark fails and it stops"
            }
        ));
    }
    detail
}

/// The audit detail of a skip or mark-done by hand.
pub(super) fn settle_detail(before: &EventSnapshot, verb: &str) -> String {
    let next = before.next_step + 1;
    let then = if next >= before.step_count {
        "done".to_owned()
    } else {
        format!("pending at {}", before.at_step(next))
    };
    let mut detail = format!(
        "{} → {then}: {} {verb}",
        before.state,
        before.at_step(before.next_step)
    );
    if let Some(error) = &before.last_error {
        detail.push_str("; last error was: ");
        detail.push_str(&clip(error, 300));
    }
    detail
}

/// The output stored for a step marked done (or skipped) by hand.
pub(super) fn by_hand_output(key: &str, who: &str, reason: &str) -> serde_json::Value {
    serde_json::json!({ key: who, "reason": reason })
}

/// The refusal when the store's `UPDATE` changed nothing: the rules allowed
/// the action, yet the database did not; say what was found.
pub(super) fn changed_meanwhile(event_seq: i64, was: EventState) -> AdminError {
    AdminError::Refused(format!(
        "event {event_seq} changed while the action ran (it was {was}); look again with \
         `tickmark events show {event_seq}`"
    ))
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut clipped: String = text.chars().take(max).collect();
        clipped.push('…');
        clipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn before(state: EventState, next_step: i32, lease_expired: bool) -> EventSnapshot {
        EventSnapshot {
            seq: 7,
            state,
            next_step,
            step_count: 3,
            attempt: 2,
            due_at: Utc::now(),
            lease_expired,
            lease_owner: Some("w1".into()),
            last_error: Some("boom".into()),
            finished_at: None,
            steps: vec!["a".into(), "b".into(), "c".into()],
            waiting_until: None,
        }
    }

    #[test]
    fn only_a_waiting_step_can_be_fed_or_timed_out() {
        let mut waiting = before(EventState::Pending, 1, false);
        refused(self::waiting(&waiting, 1), "is not waiting");
        waiting.waiting_until = Some(Utc::now());
        self::waiting(&waiting, 1).unwrap();
        refused(self::waiting(&waiting, 2), "step `c` is not waiting");
    }

    fn refused<T: std::fmt::Debug>(result: Result<T, AdminError>, needle: &str) {
        match result {
            Err(AdminError::Refused(message)) => {
                assert!(message.contains(needle), "{message:?} lacks {needle:?}")
            }
            other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn retry_follows_the_state_table() {
        use EventState::*;
        for state in [Dead, Parked, Cancelled] {
            assert_eq!(retry(&before(state, 1, false), None, false).unwrap(), 1);
            assert_eq!(retry(&before(state, 1, false), Some(0), false).unwrap(), 0);
        }
        refused(
            retry(&before(Pending, 1, false), None, false),
            "already queued",
        );
        refused(
            retry(&before(Done, 3, false), None, false),
            "--from-step NAME",
        );
        assert_eq!(retry(&before(Done, 3, false), Some(1), false).unwrap(), 1);
        refused(
            retry(&before(Running, 1, false), None, true),
            "holds its lease",
        );
        refused(retry(&before(Running, 1, true), None, false), "--force");
        assert_eq!(retry(&before(Running, 1, true), None, true).unwrap(), 1);
        refused(retry(&before(Ignored, 0, false), None, false), "no handler");
        refused(retry(&before(Dead, 0, false), Some(2), false), "jump over");
    }

    #[test]
    fn cancel_and_settle_follow_the_state_table() {
        use EventState::*;
        for state in [Pending, Running, Dead, Parked] {
            cancel(&before(state, 0, false)).unwrap();
        }
        for state in [Done, Ignored, Cancelled] {
            assert!(cancel(&before(state, 0, false)).is_err());
        }
        settle_step(&before(Dead, 1, false), 1, "skipped").unwrap();
        settle_step(&before(Running, 1, true), 1, "skipped").unwrap();
        refused(
            settle_step(&before(Running, 1, false), 1, "skipped"),
            "holds its lease",
        );
        refused(
            settle_step(&before(Dead, 1, false), 0, "skipped"),
            "already settled",
        );
        refused(
            settle_step(&before(Dead, 1, false), 2, "skipped"),
            "not been reached",
        );
        refused(
            settle_step(&before(Done, 3, false), 2, "skipped"),
            "finished",
        );
    }

    #[test]
    fn an_unknown_step_lists_the_known_ones() {
        match before(EventState::Dead, 0, false).position_of("zz") {
            Err(AdminError::UnknownStep { known, .. }) => assert_eq!(known, "a, b, c"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reason_is_required_and_not_blank() {
        let actor = |reason| Actor { who: "ops", reason };
        assert_eq!(
            required_reason(&actor(Some(" fixed ")), "skip").unwrap(),
            "fixed"
        );
        refused(required_reason(&actor(Some("  ")), "skip"), "--reason");
        refused(required_reason(&actor(None), "skip"), "--reason");
    }
}
