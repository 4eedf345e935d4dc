//! Operator reads and actions: what `tickmark` (the CLI) and the dashboard
//! need. Every action is a named transition whose SQL filters on the expected
//! state, bumps the fencing token (so a worker still holding an old lease can
//! change nothing), and writes an audit row in the same transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{EventRecord, StoreError};
use crate::event::EventState;

/// Who does an operator action, and why.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The operator (`$USER@host` by default in the CLI, `dashboard` for the web page).
    pub who: &'a str,
    /// Why, in their words (required for skip and mark-done).
    pub reason: Option<&'a str>,
}

/// Which events to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this state.
    pub state: Option<EventState>,
    /// Only this source.
    pub source: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only events received within this long.
    pub since: Option<Duration>,
    /// At most this many.
    pub limit: u32,
}

/// Re-queue an event.
#[derive(Debug, Clone)]
pub struct RetryRequest<'a> {
    /// The event.
    pub event_seq: i64,
    /// Re-run from this step (by name); earlier done steps stay done and keep
    /// their idempotency keys. `None`: resume at the first unfinished step.
    pub from_step: Option<&'a str>,
    /// Allow retrying a running event whose lease has expired.
    pub force: bool,
    /// Who and why.
    pub actor: Actor<'a>,
}

/// One audit row: a manual action on an event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Row number.
    pub id: i64,
    /// The event acted on.
    pub event_seq: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// What: `retry`, `cancel`, `skip`, `mark_done`.
    pub action: String,
    /// The step acted on, if any.
    pub step: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// What changed, in words (e.g. "dead → pending from step send_receipt").
    pub detail: Option<String>,
}

/// The overview `tickmark status` prints and the dashboard shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatusReport {
    /// Event counts by (state, source).
    pub counts: Vec<(EventState, String, i64)>,
    /// How long the oldest due, unclaimed event has waited.
    pub oldest_pending_age: Option<Duration>,
    /// Events whose lease expired without a mark (their worker died or stalled).
    pub stuck: i64,
    /// Events finished (done) per minute, for each of the last `minutes` minutes, newest first.
    pub done_per_minute: Vec<i64>,
}

/// Why an operator action was not done.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No such event.
    #[error("no event {0}; `tickmark events list` shows the events")]
    NotFound(String),
    /// The event's state does not allow the action; the message says what would.
    #[error("refused: {0}")]
    Refused(String),
    /// The event's plan has no step of that name.
    #[error("event {event_seq} has no step `{step}`; its steps are: {known}")]
    UnknownStep {
        /// The event.
        event_seq: i64,
        /// The name asked for.
        step: String,
        /// The names it has.
        known: String,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AdminError {
    fn from(error: sqlx::Error) -> Self {
        AdminError::Store(error.into())
    }
}

/// The operator side of a store. Both stores implement it.
#[async_trait::async_trait]
pub trait Admin: Send + Sync {
    /// Counts by state and source, oldest pending age, stuck events, and
    /// events done per minute over the last `minutes` minutes.
    async fn status(&self, minutes: u32) -> Result<StatusReport, StoreError>;

    /// Events matching `filter`, newest first.
    async fn event_list(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError>;

    /// Find events by operator input: a row number (`42`) or a dedup key
    /// (`evt_…`), optionally within one source. Several when a key is shared
    /// by sources.
    async fn event_lookup(
        &self,
        id: &str,
        source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError>;

    /// The audit trail of one event, oldest first.
    async fn audit_list(&self, event_seq: i64) -> Result<Vec<AuditEntry>, StoreError>;

    /// The stored plan of one event (JSON: its `retry` policy and its `steps`,
    /// each with `name` and typetag `type`), for explaining where it is.
    async fn event_plan(&self, event_seq: i64) -> Result<Option<serde_json::Value>, StoreError>;

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

    /// Delete up to `batch` finished events (done, ignored, cancelled, stale;
    /// and dead when `include_dead`) received more than `older_than` ago,
    /// oldest first, with their steps and audit rows. Returns how many were
    /// deleted (fewer than `batch`: nothing is left).
    async fn event_prune(
        &self,
        older_than: Duration,
        include_dead: bool,
        batch: u32,
    ) -> Result<u64, StoreError>;

    /// The sources that have events (for prune's safety check).
    async fn sources(&self) -> Result<Vec<String>, StoreError>;
}

/// What each operator action may do to an event in each state, and the words
/// an operator reads when it may not. Both stores read the event (locked) in
/// the action's transaction, ask these rules, then run an `UPDATE` whose
/// `WHERE` filters on the same states, so the database stays the judge.
pub(crate) mod rules {
    use chrono::{DateTime, SecondsFormat, Utc};

    use super::{Actor, AdminError};
    use crate::event::EventState;
    use crate::store::{decode, StoreError};

    /// An event as an action found it, read in the action's transaction.
    #[derive(Debug, Clone)]
    pub(crate) struct Before {
        pub seq: i64,
        pub state: EventState,
        pub next_step: i32,
        pub step_count: i32,
        pub attempt: i32,
        pub due_at: DateTime<Utc>,
        /// `due_at` has passed, by the clock the store's leases use.
        pub lease_expired: bool,
        pub lease_owner: Option<String>,
        pub last_error: Option<String>,
        pub finished_at: Option<DateTime<Utc>>,
        /// The step names of its plan, in order.
        pub steps: Vec<String>,
    }

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

    fn owner(before: &Before) -> &str {
        before.lease_owner.as_deref().unwrap_or("a worker")
    }

    impl Before {
        /// The name of the step at `position`, or a placeholder past the end.
        pub(crate) fn step_at(&self, position: i32) -> &str {
            usize::try_from(position)
                .ok()
                .and_then(|p| self.steps.get(p))
                .map_or("(end)", String::as_str)
        }

        /// Where the event is: "step `b` (2 of 3)", or "the end (3 of 3 done)".
        pub(crate) fn at_step(&self, position: i32) -> String {
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

        /// The position of step `name` in the plan.
        pub(crate) fn position_of(&self, name: &str) -> Result<i32, AdminError> {
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
    pub(crate) fn retry(
        before: &Before,
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

    /// Whether `event_cancel` may cancel `before`.
    pub(crate) fn cancel(before: &Before) -> Result<(), AdminError> {
        let seq = before.seq;
        match before.state {
            EventState::Pending | EventState::Running | EventState::Dead | EventState::Parked => {
                Ok(())
            }
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
    pub(crate) fn settle_step(
        before: &Before,
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

    /// The reason skip and mark-done require.
    pub(crate) fn required_reason<'a>(
        actor: &Actor<'a>,
        action: &str,
    ) -> Result<&'a str, AdminError> {
        match actor.reason.map(str::trim) {
            Some(reason) if !reason.is_empty() => Ok(reason),
            _ => Err(AdminError::Refused(format!(
                "{action} needs a reason: pass --reason \"…\" (it goes into the audit trail)"
            ))),
        }
    }

    /// The audit detail of a retry.
    pub(crate) fn retry_detail(before: &Before, resume_at: i32, from_step: bool) -> String {
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
    pub(crate) fn cancel_detail(before: &Before) -> String {
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
    pub(crate) fn settle_detail(before: &Before, verb: &str) -> String {
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
    pub(crate) fn by_hand_output(key: &str, who: &str, reason: &str) -> String {
        serde_json::json!({ key: who, "reason": reason }).to_string()
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

    /// Operator input that is all digits names a row number.
    pub(crate) fn row_number(id: &str) -> Option<i64> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        id.parse().ok()
    }

    /// Event counts by (state, source) as stored, decoded and sorted in
    /// lifecycle order, then by source.
    pub(crate) fn sorted_counts(
        rows: Vec<(String, String, i64)>,
    ) -> Result<Vec<(EventState, String, i64)>, StoreError> {
        let mut counts = rows
            .into_iter()
            .map(|(state, source, count)| {
                Ok((decode::state(&state, "event state")?, source, count))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        counts.sort_by(|a, b| state_order(a.0).cmp(&state_order(b.0)).then(a.1.cmp(&b.1)));
        Ok(counts)
    }

    /// States in lifecycle order, for sorting counts.
    pub(crate) fn state_order(state: EventState) -> usize {
        EventState::ALL
            .iter()
            .position(|s| *s == state)
            .unwrap_or(usize::MAX)
    }

    /// Zero-filled per-minute counts, newest first, from (minutes ago, count) rows.
    pub(crate) fn per_minute(minutes: u32, buckets: Vec<(i32, i64)>) -> Vec<i64> {
        let mut counts = vec![0; usize::try_from(minutes).unwrap_or(0)];
        for (ago, count) in buckets {
            if let Some(slot) = usize::try_from(ago).ok().and_then(|i| counts.get_mut(i)) {
                *slot += count;
            }
        }
        counts
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn before(state: EventState, next_step: i32, lease_expired: bool) -> Before {
            Before {
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
            }
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
}
