//! One paragraph on why an event is where it is, and what would move it:
//! derived from its record, its step-status table and its audit trail.

use chrono::{DateTime, Utc};

use super::format::{relative, time};
use super::printable;
use tickmark_driver::event::{EventState, StepState};
use tickmark_driver::store::admin::{AuditEntry, KeySlots};
use tickmark_driver::store::{EventRecord, StepStatus};

/// What an explanation reads of one step-status row.
#[derive(Debug, Clone)]
pub(crate) struct StepView {
    pub position: i32,
    pub step: String,
    pub idempotency_key: String,
    pub state: StepState,
    pub started_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// Its output says an operator marked it done by hand.
    pub by_hand: bool,
}

impl From<&StepStatus> for StepView {
    fn from(status: &StepStatus) -> Self {
        Self {
            position: status.position,
            step: status.step.clone(),
            idempotency_key: status.idempotency_key.clone(),
            state: status.state,
            started_at: status.started_at,
            last_error: status.last_error.clone(),
            by_hand: status
                .output
                .as_ref()
                .is_some_and(|output| output.get("marked_done_by").is_some()),
        }
    }
}

/// What an explanation reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    pub record: &'a EventRecord,
    pub steps: &'a [StepView],
    pub audit: &'a [AuditEntry],
    /// Attempts per step in the event's stored retry policy.
    pub max_attempts: Option<u32>,
    /// Its concurrency key's slots, when it has one.
    pub key_slots: Option<&'a KeySlots>,
    pub now: DateTime<Utc>,
}

impl Facts<'_> {
    fn seq(&self) -> i64 {
        self.record.event.seq
    }

    fn current(&self) -> Option<&StepView> {
        usize::try_from(self.record.next_step)
            .ok()
            .and_then(|p| self.steps.get(p))
    }

    /// "step `send_receipt` (2 of 3)".
    fn current_step(&self) -> String {
        match self.current() {
            Some(step) => format!(
                "step `{}` ({} of {})",
                step.step,
                step.position + 1,
                self.record.step_count
            ),
            None => format!(
                "step {} of {}",
                self.record.next_step + 1,
                self.record.step_count
            ),
        }
    }

    fn step_name(&self) -> String {
        self.current()
            .map(|s| s.step.clone())
            .unwrap_or_else(|| "NAME".to_owned())
    }

    /// "attempt 2 of 5" for the `run`-th run of the current step; runs
    /// interrupted beside other events are not charged, and say so.
    fn attempt(&self, run: i32) -> String {
        let interrupted = self.record.interrupted;
        let charged = (run - interrupted).max(1);
        let counted = match self.max_attempts {
            Some(max) => format!("attempt {charged} of {max}"),
            None => format!("attempt {charged}"),
        };
        if interrupted > 0 {
            format!(
                "{counted} (run {run}: {interrupted} earlier run(s) interrupted beside other \
                 events, not charged)"
            )
        } else {
            counted
        }
    }

    fn at(&self, when: DateTime<Utc>) -> String {
        format!("{} ({})", time(when), relative(when, self.now))
    }

    /// Whether the lease of a running event has expired.
    fn lease_expired(&self) -> bool {
        match self.current().map(|step| step.state) {
            Some(StepState::Interrupted) => true,
            Some(StepState::Running) => false,
            _ => self.record.due_at <= self.now,
        }
    }

    fn last_action(&self, action: &str) -> Option<&AuditEntry> {
        self.audit.iter().rev().find(|entry| entry.action == action)
    }

    /// When the event finished, or "an unknown time".
    fn finished(&self) -> String {
        self.record
            .finished_at
            .map(|at| self.at(at))
            .unwrap_or_else(|| "an unknown time".to_owned())
    }

    /// " `<key>`": the current step's idempotency key, when known.
    fn current_key(&self) -> String {
        self.current()
            .map(|s| format!(" `{}`", s.idempotency_key))
            .unwrap_or_default()
    }

    fn error(&self) -> String {
        self.record
            .last_error
            .clone()
            .or_else(|| self.current().and_then(|s| s.last_error.clone()))
            .unwrap_or_else(|| "no error was recorded".to_owned())
    }
}

/// The paragraph for `tickmark events explain` (and the top of `events
/// show`): what the state means for this event, then what happened to it
/// along the way. One line, cleaned for the terminal: errors, worker names
/// and reasons in it came from elsewhere.
pub(crate) fn explain(facts: &Facts<'_>) -> String {
    let record = facts.record;
    let mut text = match record.state {
        EventState::Pending => pending(facts),
        // The view's derived step state uses the lease's own clock (the
        // database's, on PostgreSQL); the record's time is the fallback.
        EventState::Running if !facts.lease_expired() => leased(facts),
        EventState::Running => interrupted(facts),
        EventState::Parked => parked(facts),
        EventState::Dead => dead(facts),
        EventState::Done => done(facts),
        EventState::Cancelled => cancelled(facts),
        EventState::Ignored => ignored(facts),
        other => ended_without_running(facts, other),
    };
    text.push_str(&history(facts));
    printable::line(&text)
}

/// Running under a live lease.
fn leased(facts: &Facts<'_>) -> String {
    let record = facts.record;
    let started = facts
        .current()
        .and_then(|s| s.started_at)
        .map(|at| format!(", started {}", facts.at(at)))
        .unwrap_or_default();
    format!(
        "Leased by {} until {}, running {}, {}{started}. Its worker renews the lease \
         while the step runs; if the worker dies, the lease runs out and another worker \
         takes the event over.",
        record.lease_owner.as_deref().unwrap_or("a worker"),
        facts.at(record.due_at),
        facts.current_step(),
        facts.attempt(record.attempt),
    )
}

/// Running, but the lease ran out before the step was marked.
fn interrupted(facts: &Facts<'_>) -> String {
    let record = facts.record;
    format!(
        "Interrupted: the lease of {} expired at {} before {}, {}, was marked, so the \
         step's outcome is unknown (its worker died, stalled or lost the database). The \
         next claim by any running worker takes it over and re-runs the step with the \
         same idempotency key{}. If it stays here, no worker is running against this \
         database.",
        record.lease_owner.as_deref().unwrap_or("its worker"),
        facts.at(record.due_at),
        facts.current_step(),
        facts.attempt(record.attempt),
        facts.current_key(),
    )
}

fn parked(facts: &Facts<'_>) -> String {
    format!(
        "Parked since {} at {}: {}. It waits for an operator: deploy a build that can run it \
         (one that has this step type, or whose step accepts this payload), then \
         `tickmark events retry {}`.",
        facts.finished(),
        facts.current_step(),
        facts.error(),
        facts.seq(),
    )
}

fn dead(facts: &Facts<'_>) -> String {
    let record = facts.record;
    let seq = facts.seq();
    let before = match record.next_step {
        0 => "No step had finished.".to_owned(),
        1 => "The step before it is done and stays done.".to_owned(),
        n => format!("The {n} steps before it are done and stay done."),
    };
    format!(
        "Dead since {}: {} failed after {} attempt(s): {}. {before} It waits for an operator: \
         fix the cause, then `tickmark events retry {seq}` (the step runs again with the \
         same idempotency key{}); if it was handled by hand, `tickmark steps \
         mark-done {seq} {} --reason …` (or `steps skip`); or `tickmark events \
         cancel {seq}`.",
        facts.finished(),
        facts.current_step(),
        (record.attempt - record.interrupted).max(0),
        facts.error(),
        facts.current_key(),
        facts.step_name(),
    )
}

fn done(facts: &Facts<'_>) -> String {
    let skipped = facts
        .steps
        .iter()
        .filter(|s| s.state == StepState::Skipped)
        .count();
    let by_hand = facts.steps.iter().filter(|s| s.by_hand).count();
    let mut notes = Vec::new();
    if skipped > 0 {
        notes.push(format!("{skipped} skipped"));
    }
    if by_hand > 0 {
        notes.push(format!("{by_hand} marked done by hand"));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!(
        "Done at {}: all {} step(s) finished{notes}. Nothing more runs; to run steps again, \
         `tickmark events retry {} --from-step NAME` (earlier steps stay done, later \
         ones re-run with the same idempotency keys).",
        facts.finished(),
        facts.record.step_count,
        facts.seq(),
    )
}

fn cancelled(facts: &Facts<'_>) -> String {
    let by = match facts.last_action("cancel") {
        Some(entry) => format!(
            "Cancelled by {} at {}{}",
            entry.actor,
            facts.at(entry.at),
            reason(entry)
        ),
        None => format!("Cancelled at {}", facts.finished()),
    };
    format!(
        "{by}, at {}. Nothing runs for it; `tickmark events retry {}` would re-queue \
         it at that step.",
        facts.current_step(),
        facts.seq(),
    )
}

fn ignored(facts: &Facts<'_>) -> String {
    let event = &facts.record.event;
    format!(
        "Ignored: no handler was registered for source `{}` and kind `{}` when it arrived \
         ({}), so nothing runs. It is kept so that redeliveries are recognised as duplicates; \
         a handler registered later does not apply to it.",
        event.source,
        event.kind,
        facts.at(event.received_at),
    )
}

/// Stale, superseded and the other states that end an event before it runs.
fn ended_without_running(facts: &Facts<'_>, state: EventState) -> String {
    let record = facts.record;
    format!(
        "{}{}: it ended without running its steps and stays that way. {}",
        capitalised(state.as_str()),
        record
            .finished_at
            .map(|at| format!(" since {}", facts.at(at)))
            .unwrap_or_default(),
        record.last_error.as_deref().unwrap_or_default(),
    )
    .trim_end()
    .to_owned()
}

/// What happened along the way: takeovers, and the operator's last retry of
/// an event that is still under way.
fn history(facts: &Facts<'_>) -> String {
    let record = facts.record;
    let mut text = String::new();
    if record.takeovers > 0 {
        text.push_str(&format!(
            " Its lease has been taken over {} time(s) after a worker stopped.",
            record.takeovers
        ));
    }
    if let Some(retry) = facts.last_action("retry") {
        if record.state.is_active() {
            text.push_str(&format!(
                " Re-queued by {} at {}{}.",
                retry.actor,
                time(retry.at),
                reason(retry)
            ));
        }
    }
    text
}

/// " (reason: …)" when the audit entry has one.
fn reason(entry: &AuditEntry) -> String {
    entry
        .reason
        .as_deref()
        .map(|r| format!(" (reason: {r})"))
        .unwrap_or_default()
}

fn pending(facts: &Facts<'_>) -> String {
    let record = facts.record;
    if record.due_at > facts.now {
        let state = facts.current().map(|s| s.state);
        let failed = state == Some(StepState::Retrying);
        return if state == Some(StepState::Waiting) {
            format!(
                "Waiting, holding nothing: {} is {}. Its deadline is {}; an accepted event \
                 that matches wakes it at once. An operator can settle it by hand: \
                 `tickmark steps feed {seq} {step} --event N` or `tickmark steps time-out {seq} {step}`.",
                facts.current_step(),
                record.last_error.as_deref().unwrap_or("waiting"),
                facts.at(record.due_at),
                seq = record.event.seq,
                step = facts.current().map_or("STEP", |s| s.step.as_str()),
            )
        } else if state == Some(StepState::Throttled) {
            format!(
                "Throttled until {}: {} waits for a token of its rate limit, {}. No attempt \
                 is spent and no worker holds it meanwhile; steps waiting on one bucket come \
                 back one refill apart.",
                facts.at(record.due_at),
                facts.current_step(),
                record
                    .last_error
                    .as_deref()
                    .unwrap_or("its bucket was empty"),
            )
        } else if failed {
            format!(
                "Waiting until {} to retry {}: {} failed: {}. Attempt {} runs then.",
                facts.at(record.due_at),
                facts.current_step(),
                facts.attempt(record.attempt),
                facts.error(),
                record.attempt + 1,
            )
        } else if let Some(note) = &record.last_error {
            format!(
                "Waiting until {} to run {}: {note}.",
                facts.at(record.due_at),
                facts.current_step()
            )
        } else {
            format!(
                "Delayed: not to run before {}; then {} runs.",
                facts.at(record.due_at),
                facts.current_step()
            )
        };
    }
    if let Some(slots) = facts.key_slots.filter(|slots| slots.is_full()) {
        let holders: Vec<String> = slots
            .holders
            .iter()
            .map(|(seq, id)| format!("{seq} ({id})"))
            .collect();
        return format!(
            "Waiting for a slot of key `{}`: at most {} of its events run at once, fleet-wide, \
             and events {} hold them now. It is claimed when one of them finishes, gives up \
             its lease or loses it; then {} runs.",
            slots.key,
            slots.limit,
            holders.join(", "),
            facts.current_step(),
        );
    }
    let waited = (facts.now - record.due_at).to_std().unwrap_or_default();
    let mut text = format!(
        "Queued: due since {}, waiting for a free worker to run {} as {}.",
        facts.at(record.due_at),
        facts.current_step(),
        facts.attempt(record.attempt + 1),
    );
    if let Some(error) = &record.last_error {
        text.push_str(&format!(" The last attempt ended: {error}."));
    }
    if waited > std::time::Duration::from_secs(60) {
        text.push_str(
            " Nothing has claimed it for over a minute: check that workers are running, reach \
             this database, and are not all busy (`tickmark status`).",
        );
    }
    text
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use tickmark_driver::event::Event;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
    }

    fn record(state: EventState, next_step: i32, attempt: i32) -> EventRecord {
        EventRecord {
            event: Event {
                seq: 42,
                source: "stripe".into(),
                id: "evt_1".into(),
                kind: "invoice.paid".into(),
                payload: serde_json::json!({}),
                received_at: now() - chrono::Duration::hours(1),
            },
            state,
            step_count: 2,
            next_step,
            attempt,
            due_at: now(),
            lease_owner: Some("worker-a".into()),
            lease_token: 3,
            takeovers: 0,
            interrupted: 0,
            last_error: None,
            finished_at: None,
            trace: None,
            erased_at: None,
        }
    }

    fn steps(current: StepState) -> Vec<StepView> {
        ["charge", "send_receipt"]
            .iter()
            .zip(0..)
            .map(|(name, position)| StepView {
                position,
                step: (*name).into(),
                idempotency_key: format!("stripe:evt_1:{name}"),
                state: if position == 0 {
                    StepState::Done
                } else {
                    current
                },
                started_at: Some(now() - chrono::Duration::minutes(2)),
                last_error: None,
                by_hand: false,
            })
            .collect()
    }

    fn say(record: &EventRecord, steps: &[StepView], audit: &[AuditEntry]) -> String {
        explain(&Facts {
            record,
            steps,
            audit,
            max_attempts: Some(5),
            key_slots: None,
            now: now(),
        })
    }

    #[test]
    fn a_throttled_event_names_its_limit_and_when_its_token_is_due() {
        let mut r = record(EventState::Pending, 1, 0);
        r.due_at = now() + chrono::Duration::seconds(2);
        r.last_error = Some("throttled by rate limit `admin_api` (bucket `admin_api:a`): the next token is due in 2.0 s".into());
        let text = say(&r, &steps(StepState::Throttled), &[]);
        assert!(
            text.starts_with("Throttled until 2026-11-30T06:00:02Z (in 2s)"),
            "{text}"
        );
        assert!(text.contains("bucket `admin_api:a`"), "{text}");
        assert!(text.contains("No attempt is spent"), "{text}");
    }

    #[test]
    fn runs_interrupted_beside_other_events_are_not_counted_against_the_attempts() {
        let mut r = record(EventState::Running, 1, 3);
        r.interrupted = 2;
        r.due_at = now() + chrono::Duration::seconds(20);
        let text = say(&r, &steps(StepState::Running), &[]);
        assert!(
            text.contains(
                "attempt 1 of 5 (run 3: 2 earlier run(s) interrupted beside other events, not charged)"
            ),
            "{text}"
        );
        r.interrupted = 0;
        let text = say(&r, &steps(StepState::Running), &[]);
        assert!(text.contains("attempt 3 of 5,"), "{text}");
    }

    #[test]
    fn a_waiting_event_says_what_it_waits_for_and_how_to_settle_it() {
        let mut r = record(EventState::Pending, 1, 0);
        r.due_at = now() + chrono::Duration::days(3);
        r.last_error = Some("waiting for orders/paid from shopify whose /id is 7, for up to 3.0 days; then the if_timed_out steps run".into());
        let text = say(&r, &steps(StepState::Waiting), &[]);
        assert!(text.starts_with("Waiting, holding nothing"), "{text}");
        assert!(text.contains("whose /id is 7"), "{text}");
        assert!(text.contains("2026-12-03T06:00:00Z"), "{text}");
        assert!(text.contains("tickmark steps feed"), "{text}");
    }

    #[test]
    fn an_event_of_a_full_key_names_the_events_holding_it() {
        let r = record(EventState::Pending, 0, 0);
        let slots = KeySlots {
            key: "shop:a".into(),
            limit: 2,
            holders: vec![(7, "evt_7".into()), (9, "evt_9".into())],
        };
        let views = steps(StepState::Pending);
        let text = explain(&Facts {
            record: &r,
            steps: &views,
            audit: &[],
            max_attempts: Some(5),
            key_slots: Some(&slots),
            now: now(),
        });
        assert!(
            text.starts_with("Waiting for a slot of key `shop:a`"),
            "{text}"
        );
        assert!(text.contains("at most 2 of its events"), "{text}");
        assert!(
            text.contains("events 7 (evt_7), 9 (evt_9) hold them"),
            "{text}"
        );

        let free = KeySlots {
            holders: vec![(7, "evt_7".into())],
            ..slots
        };
        let text = explain(&Facts {
            record: &r,
            steps: &views,
            audit: &[],
            max_attempts: Some(5),
            key_slots: Some(&free),
            now: now(),
        });
        assert!(
            text.starts_with("Queued"),
            "a key with room does not explain a wait: {text}"
        );
    }

    #[test]
    fn a_retrying_event_says_until_when_and_why() {
        let mut r = record(EventState::Pending, 1, 2);
        r.due_at = now() + chrono::Duration::seconds(30);
        r.last_error = Some("HTTP 503".into());
        let text = say(&r, &steps(StepState::Retrying), &[]);
        assert!(
            text.starts_with("Waiting until 2026-11-30T06:00:30Z (in 30s)"),
            "{text}"
        );
        assert!(text.contains("step `send_receipt` (2 of 2)"), "{text}");
        assert!(text.contains("attempt 2 of 5 failed: HTTP 503"), "{text}");
    }

    #[test]
    fn a_leased_event_names_its_worker_and_an_expired_one_is_interrupted() {
        let mut r = record(EventState::Running, 1, 1);
        r.due_at = now() + chrono::Duration::seconds(20);
        let text = say(&r, &steps(StepState::Running), &[]);
        assert!(text.starts_with("Leased by worker-a until"), "{text}");
        assert!(
            text.contains("started 2026-11-30T05:58:00Z (2m ago)"),
            "{text}"
        );
        r.due_at = now() - chrono::Duration::seconds(20);
        let text = say(&r, &steps(StepState::Interrupted), &[]);
        assert!(
            text.starts_with("Interrupted: the lease of worker-a expired"),
            "{text}"
        );
        assert!(text.contains("stripe:evt_1:send_receipt"), "{text}");
    }

    #[test]
    fn remote_text_in_the_paragraph_is_cleaned_for_the_terminal() {
        let mut r = record(EventState::Dead, 1, 5);
        r.finished_at = Some(now());
        r.last_error = Some("boom\u{1b}[2J\nfake line\u{7}".into());
        r.lease_owner = Some("w\u{1b}]0;title\u{7}".into());
        let text = say(&r, &steps(StepState::Dead), &[]);
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.contains("boom␛[2J⏎fake line␇"), "{text}");
    }

    #[test]
    fn dead_parked_done_and_cancelled_say_what_to_do() {
        let mut r = record(EventState::Dead, 1, 5);
        r.finished_at = Some(now());
        r.last_error = Some("card declined".into());
        let text = say(&r, &steps(StepState::Dead), &[]);
        assert!(text.contains("after 5 attempt(s): card declined"), "{text}");
        assert!(text.contains("tickmark events retry 42"), "{text}");

        r.state = EventState::Parked;
        r.last_error = Some("step `x` has type `y_v2`, which this build does not know".into());
        let text = say(&r, &steps(StepState::Parked), &[]);
        assert!(text.contains("deploy a build"), "{text}");

        let mut done = record(EventState::Done, 2, 1);
        done.finished_at = Some(now());
        assert!(say(&done, &steps(StepState::Skipped), &[]).contains("(1 skipped)"));

        let cancelled = record(EventState::Cancelled, 1, 1);
        let audit = [AuditEntry {
            id: 1,
            event_seq: 42,
            at: now(),
            actor: "ana@ops".into(),
            action: "cancel".into(),
            step: None,
            reason: Some("duplicate order".into()),
            detail: None,
        }];
        let text = say(&cancelled, &steps(StepState::Cancelled), &audit);
        assert!(
            text.starts_with(
                "Cancelled by ana@ops at 2026-11-30T06:00:00Z (now) (reason: duplicate order)"
            ),
            "{text}"
        );
    }
}
