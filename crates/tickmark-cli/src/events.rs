//! `tickmark events`: list, show, explain, retry and cancel events.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::Value;

use super::duration;
use super::explain::{explain, Facts, StepView};
use super::format::{relative, time, time_and_relative, time_opt, took};
use super::lookup::resolve;
use super::printable;
use super::table::{truncate, Table};
use super::{default_actor, Failure, Output};
use tickmark_core::operator::{Actor, Operations, RetryRequest};
use tickmark_core::privacy::{shown, Privacy};
use tickmark_driver::event::EventState;
use tickmark_driver::store::admin::{AuditEntry, EventFilter};
use tickmark_driver::store::{EventRecord, StepStatus, Store};

const ID_HELP: &str = "The event: its row number (42) or its dedup key (evt_1NG8…, sha256:…)";

#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// List events, newest first, with their state and where they are
    #[command(after_help = "\
Examples:
  tickmark events list                          # the 50 newest events
  tickmark events list --state dead             # dead letters
  tickmark events list --state running          # leased now (or stuck: see `status`)
  tickmark events list --source stripe --kind invoice.paid --since 4h --limit 200")]
    List(ListArgs),
    /// Show one event: its record, its step-status table and its audit trail
    #[command(after_help = "\
Per step: its state (done, running, interrupted, retrying, dead, skipped, pending, …),
attempts, the idempotency key it passes to external services, when it started and
finished, how long it took, its last error and its output (cut to 80 characters unless
--full). Then the manual actions taken on the event (retry, cancel, skip, mark-done).

Examples:
  tickmark events show 42
  tickmark events show evt_1NG8Du2eZvKYlo2CUI79vXWy --source stripe --full")]
    Show(ShowArgs),
    /// Say in one paragraph why an event is where it is, and what would move it
    #[command(after_help = "\
Waiting for a retry (when, which attempt, the last error), leased by a worker (until when,
which step), interrupted (whose lease expired; it will be taken over), parked (deploy a
build that knows the step, then retry), dead (since when, why, what to run), done, or
cancelled (by whom, when, why).

Example:
  tickmark events explain 42")]
    Explain(ExplainArgs),
    /// Re-queue a dead, parked, cancelled or done event
    #[command(after_help = "\
Without --from-step the event resumes at its first unfinished step (a done event needs
--from-step). With --from-step NAME, that step and the ones after it run again with the
SAME idempotency keys (so external services still deduplicate); earlier steps stay done,
with their outputs. A running event is refused unless its lease has expired and --force
is given. Any worker still holding an old lease is fenced out. The action is audited.

Examples:
  tickmark events retry 42 --reason \"card processor back up\"
  tickmark events retry 42 --from-step send_receipt --reason \"template fixed\"
  tickmark events retry 42 --force          # running, but its lease expired

Exits 3 when the event (or the step) does not exist, 4 when its state does not allow a retry.")]
    Retry(RetryArgs),
    /// Cancel an event that has not finished; a worker running it stops
    #[command(after_help = "\
Allowed while pending, running, dead or parked. A worker running the event loses its lease
at once: its next heartbeat or mark fails and it stops without marking anything (the step
that was running may have had external effects; its idempotency key is in `events show`).
The action is audited; `events retry` can re-queue a cancelled event.

Example:
  tickmark events cancel 42 --reason \"customer refunded by hand\"

Exits 3 when the event does not exist, 4 when it has already ended.")]
    Cancel(CancelArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only events in this state (pending, running, done, dead, parked, ignored, cancelled)
    #[arg(long, value_parser = parse_state)]
    state: Option<EventState>,
    /// Only events from this source (stripe, github, …)
    #[arg(long)]
    source: Option<String>,
    /// Only events of this kind (event type)
    #[arg(long)]
    kind: Option<String>,
    /// Only events received within this long: 90s, 15m, 4h, 3d, 1w
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    since: Option<Duration>,
    /// At most this many
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct Target {
    #[arg(help = ID_HELP)]
    pub id: String,
    /// The event's source, when its dedup key is shared by several sources
    #[arg(long)]
    pub source: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    target: Target,
    /// Print outputs, errors and the payload in full
    #[arg(long)]
    full: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    target: Target,
}

/// Who acts and why, for the audit trail.
#[derive(Debug, Args)]
pub(crate) struct ActorArgs {
    /// Why, in your words (kept in the audit trail)
    #[arg(long)]
    reason: Option<String>,
    /// Who acts, for the audit trail [default: $USER@hostname]
    #[arg(long, value_name = "WHO")]
    actor: Option<String>,
}

impl ActorArgs {
    pub(crate) fn who(&self) -> String {
        self.actor.clone().unwrap_or_else(default_actor)
    }
}

#[derive(Debug, Args)]
pub(crate) struct RetryArgs {
    #[command(flatten)]
    target: Target,
    /// Re-run from this step (by name): it and later steps run again, with the same keys
    #[arg(long, value_name = "NAME")]
    from_step: Option<String>,
    /// Allow retrying a running event whose lease has expired
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    actor: ActorArgs,
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    actor: ActorArgs,
}

fn parse_state(text: &str) -> Result<EventState, String> {
    text.parse().map_err(|_| {
        format!(
            "unknown state `{text}`; one of: {}",
            EventState::ALL.map(EventState::as_str).join(", ")
        )
    })
}

pub(crate) async fn run(
    store: &dyn Store,
    out: Output,
    command: EventsCommand,
) -> Result<(), Failure> {
    match command {
        EventsCommand::List(args) => list(store, out, args).await,
        EventsCommand::Show(args) => show(store, out, args).await,
        EventsCommand::Explain(args) => explain_one(store, out, args).await,
        EventsCommand::Retry(args) => retry(store, out, args).await,
        EventsCommand::Cancel(args) => cancel(store, out, args).await,
    }
}

#[derive(Serialize)]
struct Listed<'a> {
    events: &'a [EventRecord],
}

async fn list(store: &dyn Store, out: Output, args: ListArgs) -> Result<(), Failure> {
    let filter = EventFilter {
        state: args.state,
        source: args.source,
        kind: args.kind,
        since: args.since,
        limit: args.limit,
    };
    let events = store.event_list(&filter).await?;
    let now = Utc::now();
    out.emit(&Listed { events: &events }, || {
        if events.is_empty() {
            return "no events match\n".to_owned();
        }
        let mut table = Table::new([
            "#",
            "SOURCE",
            "ID",
            "KIND",
            "STATE",
            "STEP",
            "ATTEMPT",
            "RECEIVED",
            "LAST ERROR",
        ])
        .right_aligned(&[0, 6]);
        for record in &events {
            table.row(vec![
                record.event.seq.to_string(),
                record.event.source.clone(),
                truncate(&record.event.id, 36),
                truncate(&record.event.kind, 32),
                record.state.to_string(),
                format!("{}/{}", record.next_step, record.step_count),
                record.attempt.to_string(),
                relative(record.event.received_at, now),
                truncate(record.last_error.as_deref().unwrap_or_default(), 60),
            ]);
        }
        let mut text = table.render();
        if events.len() == usize::try_from(filter.limit).unwrap_or(usize::MAX) {
            text.push_str(&format!(
                "(the {} newest; --limit N for more)\n",
                events.len()
            ));
        }
        text
    })
}

/// Everything `show` and `explain` read about one event.
struct Detail {
    record: EventRecord,
    steps: Vec<StepStatus>,
    audit: Vec<AuditEntry>,
    explanation: String,
    /// "encrypted at rest (key k1)", "erased …" (docs/privacy.md).
    privacy: Option<String>,
}

async fn detail(store: &dyn Store, target: &Target) -> Result<Detail, Failure> {
    let mut record = resolve(store, &target.id, target.source.as_deref()).await?;
    let seq = record.event.seq;
    let mut steps = store.step_status(seq).await?;
    // Sealed payloads and outputs are opened with TICKMARK_KEYS when it is
    // set here, and named, never printed sealed, when it is not.
    let keys = Privacy::from_env().unwrap_or_default();
    let payload = shown(&keys, &record.event.payload, record.erased_at);
    record.event.payload = payload.value;
    for step in &mut steps {
        if let Some(output) = step.output.take() {
            step.output = Some(shown(&keys, &output, record.erased_at).value);
        }
    }
    let audit = store.audit_list(seq).await?;
    let plan = store.event_plan(seq).await?;
    let max_attempts = plan
        .as_ref()
        .and_then(|plan| plan.pointer("/retry/max_attempts"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    let key_slots = store.event_key_slots(seq).await?;
    let views: Vec<StepView> = steps.iter().map(StepView::from).collect();
    let explanation = explain(&Facts {
        record: &record,
        steps: &views,
        audit: &audit,
        max_attempts,
        key_slots: key_slots.as_ref(),
        now: Utc::now(),
    });
    Ok(Detail {
        record,
        steps,
        audit,
        explanation,
        privacy: payload.note,
    })
}

#[derive(Serialize)]
struct Shown<'a> {
    event: &'a EventRecord,
    explanation: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    privacy: Option<&'a str>,
    steps: &'a [StepStatus],
    audit: &'a [AuditEntry],
}

async fn show(store: &dyn Store, out: Output, args: ShowArgs) -> Result<(), Failure> {
    let detail = detail(store, &args.target).await?;
    let shown = Shown {
        event: &detail.record,
        explanation: &detail.explanation,
        privacy: detail.privacy.as_deref(),
        steps: &detail.steps,
        audit: &detail.audit,
    };
    out.emit(&shown, || render_show(&detail, args.full))
}

/// `events show` for people: a title line, the record's facts, the
/// explanation, the step-status table and the audit trail. Long values are
/// cut unless `full`.
fn render_show(detail: &Detail, full: bool) -> String {
    let now = Utc::now();
    let view = ShowView { full };
    let event = &detail.record.event;
    let mut text = format!(
        "event {}  {}  {}  {}\n",
        event.seq,
        printable::line(&event.source),
        printable::line(&event.id),
        printable::line(&event.kind)
    );
    text.push_str(&view.facts(&detail.record, now));
    if let Some(note) = &detail.privacy {
        text.push_str(&format!("privacy: {note}\n"));
    }
    text.push_str(&format!("\nwhy: {}\n", detail.explanation));
    text.push_str("\nsteps\n");
    text.push_str(&view.steps(&detail.steps));
    text.push_str("\naudit trail (manual actions, oldest first)\n");
    text.push_str(&view.audit(&detail.audit));
    text
}

/// How `events show` prints: cut to fit a terminal, or in full.
struct ShowView {
    full: bool,
}

impl ShowView {
    /// `text`, or its first `max` columns unless `--full`.
    fn cut(&self, text: &str, max: usize) -> String {
        if self.full {
            text.to_owned()
        } else {
            truncate(text, max)
        }
    }

    /// The record as a list of facts; with `--full` the payload follows,
    /// pretty-printed, instead of one cut line among them.
    fn facts(&self, record: &EventRecord, now: DateTime<Utc>) -> String {
        let mut facts = Table::without_header(2);
        facts.row(vec!["state".into(), state_line(record, now)]);
        facts.row(vec![
            "received".into(),
            time_and_relative(record.event.received_at, now),
        ]);
        facts.row(vec![
            "progress".into(),
            format!(
                "{} of {} steps settled; attempt {} of the current step",
                record.next_step, record.step_count, record.attempt
            ),
        ]);
        facts.row(vec!["lease".into(), lease_line(record)]);
        if let Some(error) = &record.last_error {
            facts.row(vec!["last error".into(), self.cut(error, 200)]);
        }
        if !self.full {
            facts.row(vec![
                "payload".into(),
                truncate(&record.event.payload.to_string(), 100),
            ]);
        }
        let mut text = facts.render();
        if self.full {
            let payload = serde_json::to_string_pretty(&record.event.payload).unwrap_or_default();
            text.push_str("payload\n");
            text.push_str(&printable::block(&payload));
            text.push('\n');
        }
        text
    }

    /// The step-status table.
    fn steps(&self, steps: &[StepStatus]) -> String {
        let mut table = Table::new([
            "#",
            "STEP",
            "STATE",
            "ATTEMPTS",
            "IDEMPOTENCY KEY",
            "STARTED",
            "FINISHED",
            "TOOK",
            "LAST ERROR",
            "OUTPUT",
        ])
        .right_aligned(&[0, 3, 7]);
        for step in steps {
            let state = match (step.progress, &step.progress_message) {
                (Some(fraction), message) => format!(
                    "{} {:.0}% {}",
                    step.state,
                    fraction * 100.0,
                    self.cut(message.as_deref().unwrap_or_default(), 40)
                ),
                (None, _) => step.state.to_string(),
            };
            table.row(vec![
                step.position.to_string(),
                step.step.clone(),
                state,
                step.attempts.to_string(),
                step.idempotency_key.clone(),
                time_opt(step.started_at),
                time_opt(step.finished_at),
                took(step.started_at, step.finished_at),
                self.cut(step.last_error.as_deref().unwrap_or_default(), 80),
                step.output
                    .as_ref()
                    .map(|output| self.cut(&output.to_string(), 80))
                    .unwrap_or_default(),
            ]);
        }
        table.render()
    }

    /// The audit trail, or `(none)`.
    fn audit(&self, audit: &[AuditEntry]) -> String {
        if audit.is_empty() {
            return "(none)\n".to_owned();
        }
        let mut table = Table::new(["AT", "ACTOR", "ACTION", "STEP", "REASON", "DETAIL"]);
        for entry in audit {
            table.row(vec![
                time(entry.at),
                entry.actor.clone(),
                entry.action.clone(),
                entry.step.clone().unwrap_or_default(),
                entry.reason.clone().unwrap_or_default(),
                self.cut(entry.detail.as_deref().unwrap_or_default(), 120),
            ]);
        }
        table.render()
    }
}

/// "dead since …", "running, leased by … until …", "pending, due …".
fn state_line(record: &EventRecord, now: DateTime<Utc>) -> String {
    match record.finished_at {
        Some(at) if !record.state.is_active() => {
            format!("{} since {}", record.state, time_and_relative(at, now))
        }
        _ if record.state == EventState::Running => format!(
            "running, leased by {} until {}",
            record.lease_owner.as_deref().unwrap_or("?"),
            time_and_relative(record.due_at, now)
        ),
        _ if record.state == EventState::Pending => {
            format!("pending, due {}", time_and_relative(record.due_at, now))
        }
        _ => record.state.to_string(),
    }
}

/// "fencing token 4, last held by w-1, taken over 1 time(s)".
fn lease_line(record: &EventRecord) -> String {
    format!(
        "fencing token {}{}{}",
        record.lease_token,
        record
            .lease_owner
            .as_deref()
            .map(|w| format!(", last held by {w}"))
            .unwrap_or_default(),
        if record.takeovers > 0 {
            format!(", taken over {} time(s)", record.takeovers)
        } else {
            String::new()
        }
    )
}

#[derive(Serialize)]
struct Explained<'a> {
    event_seq: i64,
    state: EventState,
    explanation: &'a str,
}

async fn explain_one(store: &dyn Store, out: Output, args: ExplainArgs) -> Result<(), Failure> {
    let detail = detail(store, &args.target).await?;
    let explained = Explained {
        event_seq: detail.record.event.seq,
        state: detail.record.state,
        explanation: &detail.explanation,
    };
    out.emit(&explained, || {
        format!(
            "event {} ({} from {}): {}\n",
            detail.record.event.seq,
            printable::line(&detail.record.event.id),
            printable::line(&detail.record.event.source),
            detail.explanation
        )
    })
}

/// What an action prints: the event after it, and the audit row it wrote.
#[derive(Serialize)]
pub(crate) struct Acted<'a> {
    pub action: &'a str,
    pub event: &'a EventRecord,
    pub audit: Option<&'a AuditEntry>,
}

/// Print the outcome of an action.
pub(crate) async fn report_action(
    store: &dyn Store,
    out: Output,
    action: &str,
    record: &EventRecord,
) -> Result<(), Failure> {
    let audit = store.audit_list(record.event.seq).await?;
    let entry = audit.last();
    let acted = Acted {
        action,
        event: record,
        audit: entry,
    };
    out.emit(&acted, || {
        let mut text = format!(
            "{action}: event {} ({} from {}) is now {}",
            record.event.seq,
            printable::line(&record.event.id),
            printable::line(&record.event.source),
            record.state
        );
        if let Some(detail) = entry.and_then(|e| e.detail.as_deref()) {
            text.push_str(&format!(" — {}", printable::line(detail)));
        }
        text.push('\n');
        if record.state == EventState::Pending {
            text.push_str("a worker picks it up at once; `tickmark events show` follows it\n");
        }
        text
    })
}

async fn retry(store: &dyn Store, out: Output, args: RetryArgs) -> Result<(), Failure> {
    let record = resolve(store, &args.target.id, args.target.source.as_deref()).await?;
    let who = args.actor.who();
    let request = RetryRequest {
        event_seq: record.event.seq,
        from_step: args.from_step.as_deref(),
        force: args.force,
        actor: Actor {
            who: &who,
            reason: args.actor.reason.as_deref(),
        },
    };
    let record = store.event_retry(&request).await?;
    report_action(store, out, "retry", &record).await
}

async fn cancel(store: &dyn Store, out: Output, args: CancelArgs) -> Result<(), Failure> {
    let record = resolve(store, &args.target.id, args.target.source.as_deref()).await?;
    let who = args.actor.who();
    let actor = Actor {
        who: &who,
        reason: args.actor.reason.as_deref(),
    };
    let record = store.event_cancel(record.event.seq, actor).await?;
    report_action(store, out, "cancel", &record).await
}
