//! `GET /events/{seq}`: one event, its step-status table, payload and audit
//! trail, and the retry button.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::{badge, options};
use crate::html::{self, Page};
use crate::viewer::Viewer;
use crate::{store_failure, Shared};
use tickmark_core::privacy::shown;
use tickmark_driver::event::{EventState, StepState};
use tickmark_driver::store::admin::{AuditEntry, KeySlots};
use tickmark_driver::store::{EventRecord, StepStatus};

/// The most payload or output text shown; the rest is cut with a note.
const JSON_SHOWN: usize = 64 * 1024;

/// A message shown above the event (the outcome of an action).
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    /// The page's status.
    pub(crate) status: StatusCode,
    /// What happened, as plain text.
    pub(crate) message: String,
}

pub(crate) async fn page(
    State(shared): State<Arc<Shared>>,
    viewer: Viewer,
    seq: Result<Path<i64>, PathRejection>,
) -> Page {
    match seq {
        Ok(Path(seq)) => render(&shared, &viewer, seq, None).await,
        Err(_) => no_such_event(&viewer),
    }
}

pub(crate) fn no_such_event(viewer: &Viewer) -> Page {
    Page::message(
        viewer,
        StatusCode::NOT_FOUND,
        "No such event",
        "There is no event with that number.",
    )
}

/// The event page for `seq`, with `notice` above it.
pub(crate) async fn render(
    shared: &Shared,
    viewer: &Viewer,
    seq: i64,
    notice: Option<Notice>,
) -> Page {
    let store = shared.engine.store();
    let record = match store.event_get(seq).await {
        Ok(Some(record)) => record,
        Ok(None) => return no_such_event(viewer),
        Err(error) => return store_failure(viewer, &error),
    };
    let mut steps = match store.step_status(seq).await {
        Ok(steps) => steps,
        Err(error) => return store_failure(viewer, &error),
    };
    // Sealed payloads and outputs are opened with the engine's keys, or
    // named when it has not the key; never shown sealed (docs/privacy.md).
    let privacy = shared.engine.privacy();
    let payload = shown(privacy, &record.event.payload, record.erased_at);
    for step in &mut steps {
        if let Some(output) = step.output.take() {
            step.output = Some(shown(privacy, &output, record.erased_at).value);
        }
    }
    let audit = match store.audit_list(seq).await {
        Ok(audit) => audit,
        Err(error) => return store_failure(viewer, &error),
    };
    let key_slots = match store.event_key_slots(seq).await {
        Ok(slots) => slots,
        Err(error) => return store_failure(viewer, &error),
    };

    let event = &record.event;
    let privacy_note = payload.note;
    let payload = serde_json::to_string_pretty(&payload.value).unwrap_or_default();
    let body = html! {
        h1 { "Event #" (seq) " " span.mono { (event.id) } " " (badge(record.state.as_str())) }
        @if let Some(notice) = &notice {
            p #notice class={ "notice " (if notice.status.is_success() { "ok" } else { "bad" }) } {
                (notice.message)
            }
        }
        (fields(&record))
        (key_wait(viewer, &record, key_slots.as_ref()))
        h2 { "Steps" }
        (step_table(&steps))
        (retry_form(shared, viewer, &record, &steps))
        h2 { "Payload" }
        @if let Some(note) = &privacy_note {
            p #privacy { (note) }
        }
        pre.json #payload { (cut(&payload)) }
        h2 { "Audit trail" }
        (audit_table(&audit))
    };
    let mut page = Page::ok(viewer, format!("Event #{seq} {}", event.id), body);
    page.status = notice.map_or(StatusCode::OK, |notice| notice.status);
    page
}

/// For a due event of a full concurrency key: which events hold the key.
fn key_wait(viewer: &Viewer, record: &EventRecord, slots: Option<&KeySlots>) -> Markup {
    let full = slots.filter(|slots| {
        record.state == EventState::Pending && record.due_at <= Utc::now() && slots.is_full()
    });
    html! {
        @if let Some(slots) = full {
            p #key-wait {
                "Waiting for a slot of key " span.mono { (slots.key) } ": at most "
                (slots.limit) " of its events run at once, fleet-wide, and these hold them: "
                @for (n, (seq, id)) in slots.holders.iter().enumerate() {
                    @if n > 0 { ", " }
                    a href=(viewer.base.event(*seq)) { "#" (seq) } " " span.mono { (id) }
                }
                ". It is claimed when one of them finishes."
            }
        }
    }
}

/// The record's fields, as a key–value table.
fn fields(record: &EventRecord) -> Markup {
    let event = &record.event;
    let now = Utc::now();
    let rows = [
        ("source", event.source.clone()),
        ("event id (dedup key)", event.id.clone()),
        ("kind", event.kind.clone()),
        ("state", record.state.as_str().to_owned()),
        (
            "received",
            format!(
                "{} ({} ago)",
                html::time(&event.received_at),
                html::between(&event.received_at, &now)
            ),
        ),
        ("step", step(record)),
        ("due", due(record, now)),
        (
            "lease owner",
            record.lease_owner.clone().unwrap_or_else(|| "–".to_owned()),
        ),
        ("fencing token", record.lease_token.to_string()),
        ("takeovers", record.takeovers.to_string()),
        (
            "runs interrupted, not charged",
            record.interrupted.to_string(),
        ),
        // What a tracing backend (Jaeger, Tempo, Honeycomb) finds the
        // event's trace by: its accept and every step attempt.
        (
            "trace id",
            record.trace.as_ref().map_or_else(
                || "– (accepted with traces off)".to_owned(),
                |trace| trace.trace_id().to_owned(),
            ),
        ),
        (
            "finished",
            record
                .finished_at
                .as_ref()
                .map(html::time)
                .unwrap_or_else(|| "–".to_owned()),
        ),
    ];
    html! {
        table.kv #event {
            @for (name, value) in rows {
                tr { th { (name) } td { (value) } }
            }
            @if let Some(error) = &record.last_error {
                tr { th { "last error" } td.error { (error) } }
            }
        }
    }
}

/// "2 of 3 (attempt 1)".
fn step(record: &EventRecord) -> String {
    if record.step_count == 0 {
        "–".to_owned()
    } else {
        format!(
            "{} of {} (attempt {})",
            (record.next_step + 1).min(record.step_count),
            record.step_count,
            record.attempt
        )
    }
}

/// When a pending event is due, or when a running one's lease ends.
fn due(record: &EventRecord, now: DateTime<Utc>) -> String {
    let at = html::time(&record.due_at);
    match record.state {
        EventState::Pending if record.due_at > now => {
            format!("{at} (in {})", html::between(&now, &record.due_at))
        }
        EventState::Pending => format!("{at} (due now)"),
        EventState::Running if record.due_at < now => format!(
            "{at} (lease expired {} ago)",
            html::between(&record.due_at, &now)
        ),
        EventState::Running => format!("{at} (lease)"),
        _ => "–".to_owned(),
    }
}

fn step_table(steps: &[StepStatus]) -> Markup {
    if steps.is_empty() {
        return html! {
            p.muted { "This event has no steps (no handler was registered for it)." }
        };
    }
    html! {
        table.data #steps {
            tr {
                th.num { "#" } th { "step" } th { "state" } th.num { "attempts" } th { "started" }
                th { "finished" } th.num { "took" } th { "next / lease" } th { "worker" }
                th { "idempotency key" }
            }
            @for step in steps {
                (step_rows(step))
            }
        }
    }
}

/// One step's row, and under it its error and output when it has them.
fn step_rows(step: &StepStatus) -> Markup {
    let class = match step.state {
        StepState::Dead | StepState::Parked => Some("fail"),
        StepState::Retrying | StepState::Interrupted => Some("warn"),
        _ => None,
    };
    let took = match (&step.started_at, &step.finished_at) {
        (Some(started), Some(finished)) => html::between(started, finished),
        _ => String::new(),
    };
    let next = match step.state {
        StepState::Retrying | StepState::Waiting | StepState::Throttled => step.retry_at.as_ref(),
        StepState::Running | StepState::Interrupted => step.lease_until.as_ref(),
        _ => None,
    };
    let output = step
        .output
        .as_ref()
        .map(|output| serde_json::to_string_pretty(output).unwrap_or_default());
    html! {
        tr class=[class] {
            td.num { (step.position) }
            td { (step.step) }
            td {
                (badge(step.state.as_str()))
                // What a running step last reported.
                @if let Some(fraction) = step.progress {
                    " "
                    span.progress {
                        (format!("{:.0}%", fraction * 100.0)) " "
                        (step.progress_message.as_deref().unwrap_or(""))
                    }
                }
            }
            td.num { (step.attempts) }
            td { (html::maybe_time(step.started_at.as_ref())) }
            td { (html::maybe_time(step.finished_at.as_ref())) }
            td.num { (took) }
            td { (html::maybe_time(next)) }
            td { (step.worker.as_deref().unwrap_or("")) }
            td.wrap { (step.idempotency_key) }
        }
        @if step.last_error.is_some() || output.is_some() {
            tr class={ (class.unwrap_or("")) " detail" } {
                td {}
                td colspan="9" {
                    @if let Some(error) = &step.last_error {
                        div.error { (error) }
                    }
                    @if let Some(output) = &output {
                        details {
                            summary { "output" }
                            pre.json { (cut(output)) }
                        }
                    }
                }
            }
        }
    }
}

/// The retry form: with a signed-in browser's session it carries the CSRF
/// token; otherwise (a bearer client) the operator types the token.
fn retry_form(
    shared: &Shared,
    viewer: &Viewer,
    record: &EventRecord,
    steps: &[StepStatus],
) -> Markup {
    if shared.auth.is_none() {
        return html! { p.muted { "Retry is off: the dashboard has no token configured." } };
    }
    let hint = match record.state {
        EventState::Dead | EventState::Parked | EventState::Cancelled => {
            "Re-queue this event: it resumes at its first unfinished step, or at the step you pick; done steps before it stay done."
        }
        EventState::Done => "Run this event again from the step you pick (done steps before it stay done).",
        EventState::Running => {
            "The event is running; retrying needs “force”, and is refused while its lease is live."
        }
        EventState::Pending => "The event is already waiting for a worker.",
        _ => {
            return html! {
                h2 { "Retry" }
                p.muted {
                    "This event finished without running (ignored or stale): there is nothing to retry."
                }
            }
        }
    };
    let steps = std::iter::once(("", "first unfinished step"))
        .chain(steps.iter().map(|s| (s.step.as_str(), s.step.as_str())));
    html! {
        h2 { "Retry" }
        p.muted { (hint) }
        form.retry method="post" action=(viewer.base.retry(record.event.seq)) {
            label { "from step" select name="from_step" { (options(steps, "")) } }
            label { "reason" input name="reason" size="32" placeholder="why (kept in the audit trail)"; }
            label.check { input type="checkbox" name="force" value="1"; " force (expired lease)" }
            @match viewer.access.csrf() {
                Some(csrf) => input type="hidden" name="csrf" value=(csrf);,
                None => label {
                    "token"
                    input type="password" name="token" autocomplete="current-password" required;
                },
            }
            button type="submit" { "Retry" }
        }
    }
}

fn audit_table(audit: &[AuditEntry]) -> Markup {
    if audit.is_empty() {
        return html! { p.muted #audit-empty { "No operator actions on this event." } };
    }
    html! {
        table.data #audit {
            tr {
                th { "at" } th { "who" } th { "action" } th { "step" } th { "reason" } th { "what changed" }
            }
            @for entry in audit {
                tr {
                    td { (html::time(&entry.at)) }
                    td { (entry.actor) }
                    td { (entry.action) }
                    td { (entry.step.as_deref().unwrap_or("")) }
                    td { (entry.reason.as_deref().unwrap_or("")) }
                    td { (entry.detail.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

/// At most [`JSON_SHOWN`] bytes of `text` (cut at a character boundary).
fn cut(text: &str) -> String {
    if text.len() <= JSON_SHOWN {
        return text.to_owned();
    }
    let mut end = JSON_SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let shown = text.get(..end).unwrap_or("");
    format!("{shown}\n… ({} more bytes not shown)", text.len() - end)
}
