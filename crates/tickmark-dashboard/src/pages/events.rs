//! `GET /events`: the event list, newest first, with filters; or the events
//! an operator's id finds.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use maud::{html, Markup};

use super::{badge, clip, options};
use crate::html::{self, Page};
use crate::links::Base;
use crate::viewer::Viewer;
use crate::{store_failure, Shared};
use tickmark_driver::event::EventState;
use tickmark_driver::store::admin::EventFilter;
use tickmark_driver::store::EventRecord;

/// Rows shown when the query names no limit.
const DEFAULT_LIMIT: u32 = 100;
/// The most rows one page shows.
const MAX_LIMIT: u32 = 1000;

/// The list's query, as typed (re-shown in the form).
#[derive(Debug, Default, Clone, PartialEq)]
struct Query {
    state: String,
    source: String,
    kind: String,
    since: String,
    limit: String,
    id: String,
}

impl Query {
    fn parse(raw: Option<&str>) -> Self {
        let mut query = Query::default();
        for (key, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let value = value.trim().to_owned();
            match key.as_ref() {
                "state" => query.state = value,
                "source" => query.source = value,
                "kind" => query.kind = value,
                "since" => query.since = value,
                "limit" => query.limit = value,
                "id" => query.id = value,
                _ => {}
            }
        }
        query
    }

    /// The store's filter, or why the query is not one.
    fn filter(&self) -> Result<EventFilter, String> {
        let state = match self.state.as_str() {
            "" => None,
            name => Some(name.parse::<EventState>().map_err(|_| {
                format!(
                    "unknown state `{name}`; the states are {}",
                    EventState::ALL.map(EventState::as_str).join(", ")
                )
            })?),
        };
        let since = match self.since.as_str() {
            "" => None,
            text => Some(parse_since(text).ok_or_else(|| {
                format!("`since` must be a number and a unit (s, m, h, d), like 15m or 7d; got `{text}`")
            })?),
        };
        let limit = match self.limit.as_str() {
            "" => DEFAULT_LIMIT,
            text => text
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| format!("`limit` must be 1 to {MAX_LIMIT}; got `{text}`"))?,
        };
        Ok(EventFilter {
            state,
            source: non_empty(&self.source),
            kind: non_empty(&self.kind),
            since,
            limit,
        })
    }
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// The longest `since` accepted: 100 years, far past any retention.
const MAX_SINCE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `90s`, `15m`, `24h`, `7d` (and any sum `humantime` reads, like
/// `1h30m`), in whole numbers, at most 100 years.
fn parse_since(text: &str) -> Option<Duration> {
    if !text.starts_with(|c: char| c.is_ascii_digit()) || text.contains('.') {
        return None;
    }
    humantime::parse_duration(text)
        .ok()
        .filter(|since| *since <= MAX_SINCE)
}

pub(crate) async fn page(
    State(shared): State<Arc<Shared>>,
    viewer: Viewer,
    RawQuery(raw): RawQuery,
) -> Page {
    let query = Query::parse(raw.as_deref());
    let store = shared.engine.store();
    let filter = match query.filter() {
        Ok(filter) => filter,
        Err(message) => {
            return Page::message(&viewer, StatusCode::BAD_REQUEST, "Bad filter", &message)
        }
    };
    let (heading, events) = if query.id.is_empty() {
        match store.event_list(&filter).await {
            Ok(events) => ("Events".to_owned(), events),
            Err(error) => return store_failure(&viewer, &error),
        }
    } else {
        match store
            .event_lookup(&query.id, filter.source.as_deref())
            .await
        {
            Ok(events) => (format!("Events found for `{}`", query.id), events),
            Err(error) => return store_failure(&viewer, &error),
        }
    };
    // The sources offered in the filter; the list still works without them.
    let sources = store.sources().await.unwrap_or_default();
    let base = &viewer.base;
    let more = query.id.is_empty() && events.len() >= filter.limit as usize;
    let body = html! {
        h1 { (heading) }
        (filter_form(base, &query, &sources))
        @if events.is_empty() {
            p.muted #no-events { "No events match." }
        } @else {
            (table(base, &events))
            @if more {
                p.muted {
                    "Showing the newest " (filter.limit)
                    "; narrow the filters or raise the limit to see more."
                }
            }
        }
    };
    Page::ok(&viewer, heading, body)
}

fn filter_form(base: &Base, query: &Query, sources: &[String]) -> Markup {
    let states = std::iter::once(("", "any"))
        .chain(EventState::ALL.map(|state| (state.as_str(), state.as_str())));
    let mut source_options = vec![("", "any")];
    source_options.extend(sources.iter().map(|s| (s.as_str(), s.as_str())));
    if !query.source.is_empty() && !sources.contains(&query.source) {
        source_options.push((query.source.as_str(), query.source.as_str()));
    }
    let since = [
        ("", "any time"),
        ("15m", "15 minutes"),
        ("1h", "1 hour"),
        ("24h", "24 hours"),
        ("7d", "7 days"),
    ];
    let mut since_options: Vec<(&str, &str)> = since.to_vec();
    if !since.iter().any(|(value, _)| *value == query.since) {
        since_options.push((query.since.as_str(), query.since.as_str()));
    }
    let action = base.events([]);
    html! {
        form.filters method="get" action=(action) {
            label { "state" select name="state" { (options(states, &query.state)) } }
            label { "source" select name="source" { (options(source_options, &query.source)) } }
            label { "kind" input name="kind" value=(query.kind) placeholder="order.paid"; }
            label { "received within" select name="since" { (options(since_options, &query.since)) } }
            label { "limit" input name="limit" value=(query.limit) size="5" placeholder=(DEFAULT_LIMIT); }
            button type="submit" { "Filter" }
            label { "or find by # or event id" input name="id" value=(query.id) placeholder="42 or evt_…"; }
            button.secondary type="submit" { "Find" }
            a href=(action) { "clear" }
        }
    }
}

fn table(base: &Base, events: &[EventRecord]) -> Markup {
    html! {
        table.data #events {
            tr {
                th.num { "#" } th { "received" } th { "source" } th { "event id" } th { "kind" }
                th { "state" } th.num { "step" } th.num { "attempt" } th { "last error" }
            }
            @for record in events {
                @let event = &record.event;
                @let link = base.event(event.seq);
                tr class=[row_class(record.state)] {
                    td.num { a href=(link) { (event.seq) } }
                    td { (html::time(&event.received_at)) }
                    td { (event.source) }
                    td.wrap { a href=(link) { (event.id) } }
                    td { (event.kind) }
                    td { (badge(record.state.as_str())) }
                    td.num { (step(record)) }
                    td.num { (record.attempt) }
                    td.error { (clip(record.last_error.as_deref().unwrap_or(""), 160)) }
                }
            }
        }
    }
}

/// Dead rows tinted red, parked rows amber.
fn row_class(state: EventState) -> Option<&'static str> {
    match state {
        EventState::Dead => Some("fail"),
        EventState::Parked => Some("warn"),
        _ => None,
    }
}

/// `2/3`: the current step of all.
fn step(record: &EventRecord) -> String {
    if record.step_count == 0 {
        "–".to_owned()
    } else if record.state == EventState::Done {
        format!("{0}/{0}", record.step_count)
    } else {
        format!("{}/{}", record.next_step + 1, record.step_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_number_and_a_unit() {
        assert_eq!(parse_since("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_since("15m"), Some(Duration::from_secs(900)));
        assert_eq!(parse_since("7d"), Some(Duration::from_secs(7 * 86_400)));
        for bad in ["", "m", "15", "15x", "-1h", "1.5h", "99999999999999999999d"] {
            assert_eq!(parse_since(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_query_becomes_a_filter_or_a_message() {
        let query = Query::parse(Some("state=dead&source=shop&kind=&since=1h&limit=5&x=1"));
        let filter = query.filter().unwrap();
        assert_eq!(filter.state, Some(EventState::Dead));
        assert_eq!(filter.source.as_deref(), Some("shop"));
        assert_eq!(filter.kind, None);
        assert_eq!(filter.since, Some(Duration::from_secs(3600)));
        assert_eq!(filter.limit, 5);
        assert_eq!(Query::parse(None).filter().unwrap().limit, DEFAULT_LIMIT);
        assert!(Query::parse(Some("state=exploded"))
            .filter()
            .unwrap_err()
            .contains("unknown state"));
        assert!(Query::parse(Some("limit=0")).filter().is_err());
        assert!(Query::parse(Some("since=soon")).filter().is_err());
    }
}
