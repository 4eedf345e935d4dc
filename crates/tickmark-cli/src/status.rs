//! `tickmark status`: the overview at a glance.

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;

use super::duration::human;
use super::format::time;
use super::table::Table;
use super::{Failure, Output};
use tickmark_driver::event::EventState;
use tickmark_driver::store::admin::TenantRow;
use tickmark_driver::store::ReconcileSummary;
use tickmark_driver::store::Store;

pub(crate) const LONG_ABOUT: &str = "\
What is queued, running, dead and stuck, at a glance.

Shows event counts by state and source; how long the oldest due, unclaimed event has
waited (a growing number means too few workers, or none); dead letters (events that
wait for an operator); stuck events (running, but their lease expired without a mark:
their worker died or stalled, and another worker will take them over); and how many
events finished per minute over the last --minutes minutes, newest first. When handlers
claim in fair shares per tenant, the five tenants with the most unfinished events too
(`tickmark tenants list` for more).";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  tickmark status
  tickmark status --minutes 60 --json | jq .done_per_minute";

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Throughput window: events done per minute over this many minutes
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..=1440))]
    minutes: u32,
}

#[derive(Serialize)]
struct Count {
    state: EventState,
    source: String,
    count: i64,
}

#[derive(Serialize)]
struct Status {
    counts: Vec<Count>,
    totals: BTreeMap<&'static str, i64>,
    oldest_pending_age_seconds: Option<f64>,
    dead: i64,
    stuck: i64,
    minutes: u32,
    done_per_minute: Vec<i64>,
    /// Webhook subscriptions the last reconcile runs found the provider no
    /// longer has (Shopify removes one after failed deliveries).
    missing_subscriptions: Vec<SourceMissing>,
    /// Sources whose last reconcile run failed: the error and when.
    reconcile_failures: Vec<ReconcileFailure>,
    /// The tenants of fair claiming with the most unfinished events.
    tenants: Vec<TenantRow>,
}

/// Tenants `tickmark status` shows (`tickmark tenants list` shows more).
const STATUS_TENANTS: u32 = 5;

#[derive(Serialize)]
struct ReconcileFailure {
    source: String,
    error: String,
    at: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Serialize)]
struct SourceMissing {
    source: String,
    topic: String,
    callback_url: String,
}

pub(crate) async fn run(store: &dyn Store, out: Output, args: StatusArgs) -> Result<(), Failure> {
    let report = store.status(args.minutes).await?;
    let reconciled = store.reconcile_cursors().await?;
    let reconcile_failures = reconciled
        .iter()
        .filter_map(|row| {
            let summary = ReconcileSummary::from_stored(row.last_summary.as_deref())?;
            Some(ReconcileFailure {
                source: row.source.clone(),
                error: summary.error?,
                at: row.last_run_finished_at,
            })
        })
        .collect();
    let missing_subscriptions = reconciled
        .into_iter()
        .flat_map(|row| {
            let summary = ReconcileSummary::from_stored(row.last_summary.as_deref());
            let source = row.source;
            summary
                .into_iter()
                .flat_map(|summary| summary.missing_subscriptions)
                .map(move |missing| SourceMissing {
                    source: source.clone(),
                    topic: missing.topic,
                    callback_url: missing.callback_url,
                })
        })
        .collect();
    let mut totals = BTreeMap::new();
    for (state, _, count) in &report.counts {
        *totals.entry(state.as_str()).or_insert(0) += count;
    }
    let dead = totals.get("dead").copied().unwrap_or(0);
    let status = Status {
        counts: report
            .counts
            .iter()
            .map(|(state, source, count)| Count {
                state: *state,
                source: source.clone(),
                count: *count,
            })
            .collect(),
        totals,
        oldest_pending_age_seconds: report.oldest_pending_age.map(|age| age.as_secs_f64()),
        dead,
        stuck: report.stuck,
        minutes: args.minutes,
        done_per_minute: report.done_per_minute.clone(),
        missing_subscriptions,
        reconcile_failures,
        tenants: store.tenants(STATUS_TENANTS).await?,
    };
    out.emit(&status, || render(&status, &report.oldest_pending_age))
}

fn render(status: &Status, oldest: &Option<std::time::Duration>) -> String {
    let mut text = String::new();
    if status.counts.is_empty() {
        text.push_str("no events yet\n");
    } else {
        let mut table = Table::new(["STATE", "SOURCE", "EVENTS"]).right_aligned(&[2]);
        for count in &status.counts {
            table.row(vec![
                count.state.to_string(),
                count.source.clone(),
                count.count.to_string(),
            ]);
        }
        let total: i64 = status.counts.iter().map(|c| c.count).sum();
        table.row(vec!["total".into(), String::new(), total.to_string()]);
        text.push_str(&table.render());
    }
    text.push('\n');
    let mut facts = Table::without_header(2);
    facts.row(vec![
        "oldest pending".into(),
        match oldest {
            Some(age) => format!(
                "{} waiting (due, not claimed yet{})",
                human(*age),
                if age.as_secs() > 60 {
                    "; are workers running?"
                } else {
                    ""
                }
            ),
            None => "none due".into(),
        },
    ]);
    facts.row(vec![
        "dead letters".into(),
        if status.dead > 0 {
            format!(
                "{} — `tickmark events list --state dead`, then `events explain ID`",
                status.dead
            )
        } else {
            "0".into()
        },
    ]);
    facts.row(vec![
        "stuck".into(),
        if status.stuck > 0 {
            format!(
                "{} running with an expired lease (worker died or stalled); the next claim \
                 takes them over — `tickmark events list --state running`",
                status.stuck
            )
        } else {
            "0".into()
        },
    ]);
    let done: i64 = status.done_per_minute.iter().sum();
    facts.row(vec![
        "done per minute".into(),
        format!(
            "{}  (last {} min, newest first; {} in all)",
            status
                .done_per_minute
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            status.minutes,
            done
        ),
    ]);
    text.push_str(&facts.render());
    if !status.tenants.is_empty() {
        text.push('\n');
        text.push_str(&super::tenants::table(&status.tenants, chrono::Utc::now()));
    }
    for missing in &status.missing_subscriptions {
        text.push_str(&format!(
            "warning: {}: the provider has no webhook subscription for {} to {}; its events \
             are not being sent — create it again (`tickmark reconcile --status`, docs/reconcile.md)\n",
            missing.source, missing.topic, missing.callback_url
        ));
    }
    for failure in &status.reconcile_failures {
        text.push_str(&format!(
            "warning: {}: the last reconcile run failed{}: {}; the next run resumes from the \
             cursor (`tickmark reconcile --status`, docs/reconcile.md)\n",
            failure.source,
            failure
                .at
                .map(|at| format!(" at {}", time(at)))
                .unwrap_or_default(),
            failure.error
        ));
    }
    text
}
