//! `GET /events/{seq}`: one event, its step-status table, payload and audit
//! trail, and the retry button.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::Utc;

use super::{badge, options};
use crate::dashboard::html::{self, Page, Text};
use crate::dashboard::links::Base;
use crate::dashboard::{store_failure, Shared};
use crate::event::{EventState, StepState};
use crate::store::admin::AuditEntry;
use crate::store::{EventRecord, StepStatus};

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
    base: Base,
    seq: Result<Path<i64>, PathRejection>,
) -> Page {
    match seq {
        Ok(Path(seq)) => render(&shared, &base, seq, None).await,
        Err(_) => no_such_event(&base),
    }
}

pub(crate) fn no_such_event(base: &Base) -> Page {
    Page::message(
        &base.0,
        StatusCode::NOT_FOUND,
        "No such event",
        "There is no event with that number.",
    )
}

/// The event page for `seq`, with `notice` above it.
pub(crate) async fn render(shared: &Shared, base: &Base, seq: i64, notice: Option<Notice>) -> Page {
    let store = shared.engine.store();
    let record = match store.event_get(seq).await {
        Ok(Some(record)) => record,
        Ok(None) => return no_such_event(base),
        Err(error) => return store_failure(base, &error),
    };
    let steps = match store.step_status(seq).await {
        Ok(steps) => steps,
        Err(error) => return store_failure(base, &error),
    };
    let audit = match store.audit_list(seq).await {
        Ok(audit) => audit,
        Err(error) => return store_failure(base, &error),
    };

    let event = &record.event;
    let mut body = String::with_capacity(16 * 1024);
    let _ = writeln!(
        body,
        "<h1>Event #{seq} <span class=\"mono\">{id}</span> {state}</h1>",
        id = Text(&event.id),
        state = badge(record.state.as_str()),
    );
    let status = match notice {
        Some(notice) => {
            let class = if notice.status.is_success() {
                "ok"
            } else {
                "bad"
            };
            let _ = writeln!(
                body,
                "<p class=\"notice {class}\" id=\"notice\">{}</p>",
                Text(&notice.message)
            );
            notice.status
        }
        None => StatusCode::OK,
    };
    body.push_str(&fields(&record));
    body.push_str("<h2>Steps</h2>\n");
    body.push_str(&step_table(&steps));
    body.push_str(&retry_form(shared, base, &record, &steps));
    body.push_str("<h2>Payload</h2>\n");
    let payload = serde_json::to_string_pretty(&event.payload).unwrap_or_default();
    let _ = writeln!(
        body,
        "<pre class=\"json\" id=\"payload\">{}</pre>",
        Text(cut(&payload))
    );
    body.push_str("<h2>Audit trail</h2>\n");
    body.push_str(&audit_table(&audit));

    let mut page = Page::ok(&base.0, format!("Event #{seq} {}", event.id), body);
    page.status = status;
    page
}

fn fields(record: &EventRecord) -> String {
    let event = &record.event;
    let now = Utc::now();
    let due = match record.state {
        EventState::Pending if record.due_at > now => format!(
            "{} (in {})",
            html::time(&record.due_at),
            html::between(&now, &record.due_at)
        ),
        EventState::Pending => format!("{} (due now)", html::time(&record.due_at)),
        EventState::Running if record.due_at < now => format!(
            "{} (lease expired {} ago)",
            html::time(&record.due_at),
            html::between(&record.due_at, &now)
        ),
        EventState::Running => format!("{} (lease)", html::time(&record.due_at)),
        _ => "–".to_owned(),
    };
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
        (
            "step",
            if record.step_count == 0 {
                "–".to_owned()
            } else {
                format!(
                    "{} of {} (attempt {})",
                    (record.next_step + 1).min(record.step_count),
                    record.step_count,
                    record.attempt
                )
            },
        ),
        ("due", due),
        (
            "lease owner",
            record.lease_owner.clone().unwrap_or_else(|| "–".to_owned()),
        ),
        ("fencing token", record.lease_token.to_string()),
        ("takeovers", record.takeovers.to_string()),
        (
            "finished",
            record
                .finished_at
                .as_ref()
                .map(html::time)
                .unwrap_or_else(|| "–".to_owned()),
        ),
    ];
    let mut out = String::from("<table class=\"kv\" id=\"event\">\n");
    for (name, value) in rows {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            Text(name),
            Text(value)
        );
    }
    if let Some(error) = &record.last_error {
        let _ = writeln!(
            out,
            "<tr><th>last error</th><td class=\"error\">{}</td></tr>",
            Text(error)
        );
    }
    out.push_str("</table>\n");
    out
}

fn step_table(steps: &[StepStatus]) -> String {
    if steps.is_empty() {
        return "<p class=\"muted\">This event has no steps (no handler was registered for it).</p>\n"
            .to_owned();
    }
    let mut out = String::from(
        "<table class=\"data\" id=\"steps\">\n<tr><th class=\"num\">#</th><th>step</th><th>state</th>\
         <th class=\"num\">attempts</th><th>started</th><th>finished</th><th class=\"num\">took</th>\
         <th>next / lease</th><th>worker</th><th>idempotency key</th></tr>\n",
    );
    for step in steps {
        let class = match step.state {
            StepState::Dead | StepState::Parked => "fail",
            StepState::Retrying | StepState::Interrupted => "warn",
            _ => "",
        };
        let took = match (&step.started_at, &step.finished_at) {
            (Some(started), Some(finished)) => html::between(started, finished),
            _ => String::new(),
        };
        let next = match step.state {
            StepState::Retrying => step.retry_at.as_ref(),
            StepState::Running | StepState::Interrupted => step.lease_until.as_ref(),
            _ => None,
        };
        // What a running step last reported (already escaped).
        let progress = match (step.progress, &step.progress_message) {
            (Some(fraction), message) => format!(
                " <span class=\"progress\">{:.0}% {}</span>",
                fraction * 100.0,
                Text(message.as_deref().unwrap_or(""))
            ),
            (None, _) => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr class=\"{class}\"><td class=\"num\">{position}</td><td>{name}</td><td>{state}{progress}</td>\
             <td class=\"num\">{attempts}</td><td>{started}</td><td>{finished}</td>\
             <td class=\"num\">{took}</td><td>{next}</td><td>{worker}</td><td class=\"wrap\">{key}</td></tr>",
            position = step.position,
            name = Text(&step.step),
            state = badge(step.state.as_str()),
            attempts = step.attempts,
            started = Text(html::maybe_time(step.started_at.as_ref())),
            finished = Text(html::maybe_time(step.finished_at.as_ref())),
            took = Text(took),
            next = Text(html::maybe_time(next)),
            worker = Text(step.worker.as_deref().unwrap_or("")),
            key = Text(&step.idempotency_key),
        );
        if step.last_error.is_some() || step.output.is_some() {
            let _ = write!(
                out,
                "<tr class=\"{class} detail\"><td></td><td colspan=\"9\">"
            );
            if let Some(error) = &step.last_error {
                let _ = write!(out, "<div class=\"error\">{}</div>", Text(error));
            }
            if let Some(output) = &step.output {
                let text = serde_json::to_string_pretty(output).unwrap_or_default();
                let _ = write!(
                    out,
                    "<details><summary>output</summary><pre class=\"json\">{}</pre></details>",
                    Text(cut(&text))
                );
            }
            out.push_str("</td></tr>\n");
        }
    }
    out.push_str("</table>\n");
    out
}

fn retry_form(shared: &Shared, base: &Base, record: &EventRecord, steps: &[StepStatus]) -> String {
    if shared.token.is_none() {
        return "<p class=\"muted\">Retry is off: the dashboard has no token configured.</p>\n"
            .to_owned();
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
            return "<h2>Retry</h2>\n<p class=\"muted\">This event finished without running \
                    (ignored or stale): there is nothing to retry.</p>\n"
                .to_owned()
        }
    };
    let steps = std::iter::once(("", "first unfinished step"))
        .chain(steps.iter().map(|s| (s.step.as_str(), s.step.as_str())));
    format!(
        "<h2>Retry</h2>\n<p class=\"muted\">{hint}</p>\n\
         <form class=\"retry\" method=\"post\" action=\"{action}\">\n\
         <label>from step<select name=\"from_step\">{steps}</select></label>\n\
         <label>reason<input name=\"reason\" size=\"32\" placeholder=\"why (kept in the audit trail)\"></label>\n\
         <label class=\"check\"><input type=\"checkbox\" name=\"force\" value=\"1\"> force (expired lease)</label>\n\
         <label>token<input type=\"password\" name=\"token\" autocomplete=\"current-password\" required></label>\n\
         <button type=\"submit\">Retry</button>\n</form>\n",
        hint = Text(hint),
        action = Text(base.retry(record.event.seq)),
        steps = options(steps, ""),
    )
}

fn audit_table(audit: &[AuditEntry]) -> String {
    if audit.is_empty() {
        return "<p class=\"muted\" id=\"audit-empty\">No operator actions on this event.</p>\n"
            .to_owned();
    }
    let mut out = String::from(
        "<table class=\"data\" id=\"audit\">\n<tr><th>at</th><th>who</th><th>action</th><th>step</th>\
         <th>reason</th><th>what changed</th></tr>\n",
    );
    for entry in audit {
        let _ = writeln!(
            out,
            "<tr><td>{at}</td><td>{who}</td><td>{action}</td><td>{step}</td><td>{reason}</td><td>{detail}</td></tr>",
            at = Text(html::time(&entry.at)),
            who = Text(&entry.actor),
            action = Text(&entry.action),
            step = Text(entry.step.as_deref().unwrap_or("")),
            reason = Text(entry.reason.as_deref().unwrap_or("")),
            detail = Text(entry.detail.as_deref().unwrap_or("")),
        );
    }
    out.push_str("</table>\n");
    out
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
