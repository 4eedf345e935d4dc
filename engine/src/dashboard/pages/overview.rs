//! `GET /`: the status overview.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;

use super::{badge, clip};
use crate::dashboard::html::{self, Page, Text};
use crate::dashboard::links::Base;
use crate::dashboard::{store_failure, Shared};
use crate::event::EventState;
use crate::store::admin::EventFilter;

/// How many minutes the done-per-minute chart covers.
const MINUTES: u32 = 60;

/// How many recent dead letters the overview lists.
const DEAD_SHOWN: u32 = 10;

pub(crate) async fn page(State(shared): State<Arc<Shared>>, base: Base) -> Page {
    let store = shared.engine.store();
    let report = match store.status(MINUTES).await {
        Ok(report) => report,
        Err(error) => return store_failure(&base, &error),
    };
    let dead = match store
        .event_list(&EventFilter {
            state: Some(EventState::Dead),
            limit: DEAD_SHOWN,
            ..EventFilter::default()
        })
        .await
    {
        Ok(dead) => dead,
        Err(error) => return store_failure(&base, &error),
    };

    // States in lifecycle order (`EventState::ALL`), sources by name.
    let mut by_state: HashMap<EventState, i64> = HashMap::new();
    let mut by_source: BTreeMap<&str, HashMap<EventState, i64>> = BTreeMap::new();
    for (state, source, count) in &report.counts {
        *by_state.entry(*state).or_default() += count;
        *by_source
            .entry(source.as_str())
            .or_default()
            .entry(*state)
            .or_default() += count;
    }
    let count = |state| by_state.get(&state).copied().unwrap_or(0);
    let done_last_hour: i64 = report.done_per_minute.iter().sum();

    let mut body = String::with_capacity(8192);
    body.push_str("<h1>Overview</h1>\n<div class=\"cards\">\n");
    let cards = [
        (
            "Pending",
            count(EventState::Pending).to_string(),
            "",
            Some("pending"),
        ),
        (
            "Running",
            count(EventState::Running).to_string(),
            "",
            Some("running"),
        ),
        (
            "Dead letters",
            count(EventState::Dead).to_string(),
            if count(EventState::Dead) > 0 {
                "bad"
            } else {
                ""
            },
            Some("dead"),
        ),
        (
            "Parked",
            count(EventState::Parked).to_string(),
            if count(EventState::Parked) > 0 {
                "warn"
            } else {
                ""
            },
            Some("parked"),
        ),
        (
            "Stuck (lease expired)",
            report.stuck.to_string(),
            if report.stuck > 0 { "warn" } else { "" },
            Some("running"),
        ),
        (
            "Oldest pending",
            report
                .oldest_pending_age
                .map(html::duration)
                .unwrap_or_else(|| "–".to_owned()),
            "",
            None,
        ),
        (
            "Done, last hour",
            done_last_hour.to_string(),
            "",
            Some("done"),
        ),
    ];
    for (label, value, class, state) in cards {
        let value = match state {
            Some(state) => format!(
                "<a href=\"{}\" style=\"color:inherit;text-decoration:none\">{}</a>",
                Text(base.events([("state", state)])),
                Text(&value)
            ),
            None => Text(&value).to_string(),
        };
        let _ = writeln!(
            body,
            "<div class=\"card {class}\"><div class=\"label\">{}</div><div class=\"value\">{value}</div></div>",
            Text(label)
        );
    }
    body.push_str("</div>\n");

    // Events by source and state.
    body.push_str("<h2>Events by source and state</h2>\n");
    if by_source.is_empty() {
        body.push_str("<p class=\"muted\">No events yet.</p>\n");
    } else {
        let columns: Vec<EventState> = EventState::ALL
            .into_iter()
            .filter(|state| by_state.contains_key(state))
            .collect();
        body.push_str("<table class=\"data compact\" id=\"counts\">\n<tr><th>source</th>");
        for state in &columns {
            let _ = write!(body, "<th class=\"num\">{}</th>", badge(state.as_str()));
        }
        body.push_str("<th class=\"num\">all</th></tr>\n");
        for (source, counts) in &by_source {
            let _ = write!(
                body,
                "<tr><td><a href=\"{}\">{}</a></td>",
                Text(base.events([("source", *source)])),
                Text(source)
            );
            for state in &columns {
                match counts.get(state) {
                    Some(n) => {
                        let _ = write!(
                            body,
                            "<td class=\"num\"><a href=\"{}\">{n}</a></td>",
                            Text(base.events([("source", *source), ("state", state.as_str())]))
                        );
                    }
                    None => body.push_str("<td class=\"num muted\">0</td>"),
                }
            }
            let _ = writeln!(
                body,
                "<td class=\"num\">{}</td></tr>",
                counts.values().sum::<i64>()
            );
        }
        body.push_str("</table>\n");
    }

    // Throughput: oldest minute on the left.
    let _ = writeln!(
        body,
        "<h2>Events done per minute, last {MINUTES} minutes</h2>"
    );
    let peak = report.done_per_minute.iter().copied().max().unwrap_or(0);
    if peak == 0 {
        body.push_str("<p class=\"muted\">No events finished in the last hour.</p>\n");
    } else {
        body.push_str("<div class=\"bars\">");
        for (ago, done) in report.done_per_minute.iter().enumerate().rev() {
            let height = if *done > 0 {
                (done * 100 / peak).max(3)
            } else {
                0
            };
            let _ = write!(
                body,
                "<span style=\"height:{height}%\" title=\"{done} done, {ago} min ago\"></span>"
            );
        }
        let _ = writeln!(
            body,
            "</div>\n<p class=\"muted\">oldest minute on the left · peak {peak}/min · \
             {done_last_hour} in the last hour</p>"
        );
    }

    // The latest dead letters.
    if !dead.is_empty() {
        body.push_str("<h2>Latest dead letters</h2>\n<table class=\"data\">\n<tr><th>#</th><th>received</th><th>source</th><th>event id</th><th>kind</th><th>last error</th></tr>\n");
        for record in &dead {
            let event = &record.event;
            let _ = writeln!(
                body,
                "<tr class=\"fail\"><td><a href=\"{link}\">{seq}</a></td><td>{received}</td><td>{source}</td>\
                 <td class=\"wrap\"><a href=\"{link}\">{id}</a></td><td>{kind}</td><td class=\"error\">{error}</td></tr>",
                link = Text(base.event(event.seq)),
                seq = event.seq,
                received = Text(html::time(&event.received_at)),
                source = Text(&event.source),
                id = Text(&event.id),
                kind = Text(&event.kind),
                error = Text(clip(record.last_error.as_deref().unwrap_or(""), 200)),
            );
        }
        let _ = writeln!(
            body,
            "</table>\n<p><a href=\"{}\">All dead letters</a></p>",
            Text(base.events([("state", "dead")]))
        );
    }
    Page::ok(&base.0, "Overview", body)
}
