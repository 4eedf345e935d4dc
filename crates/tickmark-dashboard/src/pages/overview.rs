//! `GET /`: the status overview.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::State;
use maud::{html, Markup};

use super::{badge, clip};
use crate::html::{self, Page};
use crate::links::Base;
use crate::viewer::Viewer;
use crate::{store_failure, Shared};
use tickmark_driver::event::EventState;
use tickmark_driver::store::admin::{EventFilter, StatusReport, TenantRow};
use tickmark_driver::store::{EventRecord, ReconcileCursor};
use tickmark_driver::store::{MissingSubscription, ReconcileSummary};

/// How many minutes the done-per-minute chart covers.
const MINUTES: u32 = 60;

/// How many recent dead letters the overview lists.
const DEAD_SHOWN: u32 = 10;

/// How many tenants of fair claiming the overview lists (most unfinished first).
const TENANTS_SHOWN: u32 = 10;

pub(crate) async fn page(State(shared): State<Arc<Shared>>, viewer: Viewer) -> Page {
    let store = shared.engine.store();
    let report = match store.status(MINUTES).await {
        Ok(report) => report,
        Err(error) => return store_failure(&viewer, &error),
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
        Err(error) => return store_failure(&viewer, &error),
    };
    let reconciled = match store.reconcile_cursors().await {
        Ok(rows) => rows,
        Err(error) => return store_failure(&viewer, &error),
    };
    let tenants = match store.tenants(TENANTS_SHOWN).await {
        Ok(rows) => rows,
        Err(error) => return store_failure(&viewer, &error),
    };
    let counts = Counts::of(&report);
    let base = &viewer.base;
    let body = html! {
        h1 { "Overview" }
        (missing_subscriptions(&reconciled))
        (failed_runs(&reconciled))
        (cards(base, &report, &counts))
        h2 { "Events by source and state" }
        (counts_table(base, &counts))
        h2 { "Events done per minute, last " (MINUTES) " minutes" }
        (throughput(&report.done_per_minute))
        (tenants_table(&tenants))
        (dead_letters(base, &dead))
        (reconciliation(&reconciled))
    };
    Page::ok(&viewer, "Overview", body)
}

/// The report's counts, by state and by source × state.
struct Counts<'a> {
    by_state: HashMap<EventState, i64>,
    /// Sources by name.
    by_source: BTreeMap<&'a str, HashMap<EventState, i64>>,
}

impl<'a> Counts<'a> {
    fn of(report: &'a StatusReport) -> Self {
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
        Self {
            by_state,
            by_source,
        }
    }

    fn of_state(&self, state: EventState) -> i64 {
        self.by_state.get(&state).copied().unwrap_or(0)
    }

    /// The states that have events, in lifecycle order (`EventState::ALL`).
    fn columns(&self) -> Vec<EventState> {
        EventState::ALL
            .into_iter()
            .filter(|state| self.by_state.contains_key(state))
            .collect()
    }
}

/// The cards at the top: (label, value, class, the list they link to).
fn cards(base: &Base, report: &StatusReport, counts: &Counts<'_>) -> Markup {
    let warn_if = |n: i64, class: &'static str| if n > 0 { class } else { "" };
    let dead = counts.of_state(EventState::Dead);
    let parked = counts.of_state(EventState::Parked);
    let done_last_hour: i64 = report.done_per_minute.iter().sum();
    let oldest = report
        .oldest_pending_age
        .map(html::duration)
        .unwrap_or_else(|| "–".to_owned());
    let cards = [
        (
            "Pending",
            counts.of_state(EventState::Pending).to_string(),
            "",
            Some("pending"),
        ),
        (
            "Running",
            counts.of_state(EventState::Running).to_string(),
            "",
            Some("running"),
        ),
        (
            "Dead letters",
            dead.to_string(),
            warn_if(dead, "bad"),
            Some("dead"),
        ),
        (
            "Parked",
            parked.to_string(),
            warn_if(parked, "warn"),
            Some("parked"),
        ),
        (
            "Stuck (lease expired)",
            report.stuck.to_string(),
            warn_if(report.stuck, "warn"),
            Some("running"),
        ),
        ("Oldest pending", oldest, "", None),
        (
            "Done, last hour",
            done_last_hour.to_string(),
            "",
            Some("done"),
        ),
    ];
    html! {
        div.cards {
            @for (label, value, class, state) in cards {
                div class={ "card " (class) } {
                    div.label { (label) }
                    div.value {
                        @match state {
                            Some(state) => a.plain href=(base.events([("state", state)])) { (value) },
                            None => (value),
                        }
                    }
                }
            }
        }
    }
}

/// Events by source and state; each count links to the filtered list.
fn counts_table(base: &Base, counts: &Counts<'_>) -> Markup {
    if counts.by_source.is_empty() {
        return html! { p.muted { "No events yet." } };
    }
    let columns = counts.columns();
    html! {
        table.data.compact #counts {
            tr {
                th { "source" }
                @for state in &columns { th.num { (badge(state.as_str())) } }
                th.num { "all" }
            }
            @for (source, by_state) in &counts.by_source {
                tr {
                    td { a href=(base.events([("source", *source)])) { (source) } }
                    @for state in &columns {
                        @match by_state.get(state) {
                            Some(n) => td.num {
                                a href=(base.events([("source", *source), ("state", state.as_str())])) { (n) }
                            },
                            None => td.num.muted { "0" },
                        }
                    }
                    td.num { (by_state.values().sum::<i64>()) }
                }
            }
        }
    }
}

/// The tenants of fair claiming with the most unfinished events (nothing
/// when no handler names a tenant): weight, pending, running, and how long
/// the oldest due event has waited.
fn tenants_table(tenants: &[TenantRow]) -> Markup {
    if tenants.is_empty() {
        return html! {};
    }
    let now = chrono::Utc::now();
    html! {
        h2 { "Tenants (fair share), most unfinished first" }
        table.data.compact #tenants {
            tr {
                th { "tenant" }
                th.num { "weight" }
                th.num { "pending" }
                th.num { "running" }
                th.num { "oldest due waited" }
            }
            @for tenant in tenants {
                tr {
                    td { (clip(&tenant.tenant, 64)) }
                    td.num { (tenant.weight) }
                    td.num { (tenant.pending) }
                    td.num { (tenant.running) }
                    td.num {
                        @match tenant.oldest_due_at.and_then(|at| (now - at).to_std().ok()) {
                            Some(waited) => (format!("{:.1} s", waited.as_secs_f64())),
                            None => "-",
                        }
                    }
                }
            }
        }
    }
}

/// A bar per minute, oldest on the left.
fn throughput(done_per_minute: &[i64]) -> Markup {
    let peak = done_per_minute.iter().copied().max().unwrap_or(0);
    if peak == 0 {
        return html! { p.muted { "No events finished in the last hour." } };
    }
    let total: i64 = done_per_minute.iter().sum();
    html! {
        div.bars {
            @for (ago, done) in done_per_minute.iter().enumerate().rev() {
                @let height = if *done > 0 { (done * 100 / peak).max(3) } else { 0 };
                span style={ "height:" (height) "%" } title={ (done) " done, " (ago) " min ago" } {}
            }
        }
        p.muted {
            "oldest minute on the left · peak " (peak) "/min · " (total) " in the last hour"
        }
    }
}

/// A warning per webhook subscription the last reconcile run found the
/// provider no longer has (Shopify removes one after failed deliveries):
/// its events are not being sent at all.
fn missing_subscriptions(reconciled: &[ReconcileCursor]) -> Markup {
    let missing: Vec<(String, MissingSubscription)> = reconciled
        .iter()
        .filter_map(|row| {
            let summary: ReconcileSummary =
                serde_json::from_str(row.last_summary.as_deref()?).ok()?;
            Some(
                summary
                    .missing_subscriptions
                    .into_iter()
                    .map(|missing| (row.source.clone(), missing)),
            )
        })
        .flatten()
        .collect();
    html! {
        @for (source, missing) in &missing {
            p.notice.bad role="alert" {
                strong { "Subscription missing: " }
                (source) ": the provider has no subscription for " code { (missing.topic) }
                " to " code { (missing.callback_url) }
                ". Its events are not being sent: create the subscription again (docs/reconcile.md)."
            }
        }
    }
}

/// A warning per source whose last reconcile run failed: what the
/// provider's API missed is not being recovered until a run succeeds.
fn failed_runs(reconciled: &[ReconcileCursor]) -> Markup {
    let failed: Vec<(&ReconcileCursor, String)> = reconciled
        .iter()
        .filter_map(|row| {
            let summary: ReconcileSummary =
                serde_json::from_str(row.last_summary.as_deref()?).ok()?;
            Some((row, summary.error?))
        })
        .collect();
    html! {
        @for (row, error) in &failed {
            p.notice.bad role="alert" {
                strong { "Reconcile run failed: " }
                (row.source) " at " (html::maybe_time(row.last_run_finished_at.as_ref()))
                ": " (error)
                ". The next run resumes from the cursor (docs/reconcile.md)."
            }
        }
    }
}

/// Each reconciled source's cursor and last run, when any source has been
/// reconciled (docs/reconcile.md).
fn reconciliation(reconciled: &[ReconcileCursor]) -> Markup {
    if reconciled.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Reconciliation" }
        table.data {
            tr { th { "source" } th { "cursor at" } th { "last run" } th { "found" } th { "lease" } }
            @for row in reconciled {
                @let summary = ReconcileSummary::from_stored(row.last_summary.as_deref());
                tr {
                    td { (row.source) }
                    td { (html::maybe_time(row.cursor_at.as_ref())) }
                    td { (html::maybe_time(row.last_run_finished_at.as_ref())) }
                    td.wrap {
                        @if summary.as_ref().is_some_and(|summary| summary.error.is_some()) {
                            strong { "failed; " }
                        }
                        (summary.as_ref().map(ReconcileSummary::line).unwrap_or_default())
                    }
                    td { (row.lease_owner.as_deref().unwrap_or("-")) }
                }
            }
        }
    }
}

/// The latest dead letters, when there are any.
fn dead_letters(base: &Base, dead: &[EventRecord]) -> Markup {
    if dead.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Latest dead letters" }
        table.data {
            tr {
                th { "#" } th { "received" } th { "source" } th { "event id" } th { "kind" } th { "last error" }
            }
            @for record in dead {
                @let event = &record.event;
                @let link = base.event(event.seq);
                tr.fail {
                    td { a href=(link) { (event.seq) } }
                    td { (html::time(&event.received_at)) }
                    td { (event.source) }
                    td.wrap { a href=(link) { (event.id) } }
                    td { (event.kind) }
                    td.error { (clip(record.last_error.as_deref().unwrap_or(""), 200)) }
                }
            }
        }
        p { a href=(base.events([("state", "dead")])) { "All dead letters" } }
    }
}
