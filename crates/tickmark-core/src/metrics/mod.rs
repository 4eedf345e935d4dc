//! Metrics in the OpenMetrics text format, through the official Prometheus
//! client (`prometheus-client`): what this process did (counters and a
//! step-duration histogram, kept in memory), and what the whole fleet has
//! queued (gauges read from the database at scrape time).
//!
//! | sample | type | labels |
//! |---|---|---|
//! | `tickmark_events_received_total` | counter | `source`, `outcome` (`new`, `duplicate`, `ignored`) |
//! | `tickmark_deliveries_rejected_total` | counter | `source`, `reason` (`bad_signature`, `payload_too_large`, `store_unavailable`, …) |
//! | `tickmark_steps_done_total` | counter | `step` |
//! | `tickmark_steps_failed_total` | counter | `step`, `then` (`retry`, `dead`) |
//! | `tickmark_step_duration_seconds` | histogram | `step` |
//! | `tickmark_steps_throttled_total` | counter | `limit` — step runs that found their rate-limit bucket empty and waited |
//! | `tickmark_waits_total` | counter | `outcome` (`waiting`, `matched`, `timed_out`, `slept`) — waits this process began (or resumed) and settled |
//! | `tickmark_lease_takeovers_total` | counter | |
//! | `tickmark_leases_lost_total` | counter | |
//! | `tickmark_events` | gauge | `state` — rows per state, from the database |
//! | `tickmark_events_superseded` | gauge | `source`, `kind` — events coalesced by debounce, from the database |
//! | `tickmark_oldest_pending_age_seconds` | gauge | age of the oldest due, unclaimed event |
//! | `tickmark_events_waiting` | gauge | events waiting at a wait step (for another event, or a time), from the database |
//! | `tickmark_events_stuck` | gauge | running events whose lease expired without a mark (their worker died or stalled) |
//! | `tickmark_tenant_events` | gauge | `tenant`, `state` (`pending`, `running`) — unfinished events per tenant of fair claiming: the ten with the most by name, the rest as `other`, from the database |
//! | `tickmark_tenant_oldest_due_age_seconds` | gauge | `tenant` — how long the tenant's oldest due, unclaimed event has waited (the same ten and `other`) |
//! | `tickmark_events_reconciled_total` | counter | `source`, `outcome` (`recorded`, `redelivered`) — missed events this process's reconciler recovered from the provider's API |
//! | `tickmark_reconcile_runs_failed_total` | counter | `source` — reconcile runs of this process that failed (the next resumes from the cursor) |
//! | `tickmark_reconcile_last_run_failed` | gauge | `source` — 1 when the source's last reconcile run (of any process) failed, else 0, from the database; its error is in `tickmark status` |
//! | `tickmark_webhook_subscriptions_missing` | gauge | `source` — subscriptions the handlers need that the provider (Shopify) no longer has, as the last reconcile run found, from the database |
//!
//! OpenMetrics names a counter's family without its `_total` suffix (`# TYPE
//! tickmark_steps_done counter`); the samples, which queries and alerts use,
//! keep their `_total` names.

mod render;

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

pub use render::{render, RenderError, CONTENT_TYPE};

/// Upper bounds of the step-duration histogram's buckets, in seconds: from
/// webhook-quick to multi-minute handlers.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// One label.
type Label = (&'static str, String);

/// A histogram with [`DURATION_BUCKETS`].
fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// This process's counters. Shared by the engine's receiver and workers;
/// each handle is cheap to clone and shares its values (the client's
/// metrics are atomics behind an `Arc`).
#[derive(Debug)]
pub struct Metrics {
    received: Family<[Label; 2], Counter>,
    rejected: Family<[Label; 2], Counter>,
    steps_done: Family<[Label; 1], Counter>,
    steps_failed: Family<[Label; 2], Counter>,
    step_duration: Family<[Label; 1], Histogram>,
    steps_throttled: Family<[Label; 1], Counter>,
    waits: Family<[Label; 1], Counter>,
    lease_takeovers: Counter,
    leases_lost: Counter,
    reconciled: Family<[Label; 2], Counter>,
    reconcile_runs_failed: Family<[Label; 1], Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            received: Family::default(),
            rejected: Family::default(),
            steps_done: Family::default(),
            steps_failed: Family::default(),
            step_duration: Family::new_with_constructor(duration_histogram),
            steps_throttled: Family::default(),
            waits: Family::default(),
            lease_takeovers: Counter::default(),
            leases_lost: Counter::default(),
            reconciled: Family::default(),
            reconcile_runs_failed: Family::default(),
        }
    }
}

impl Metrics {
    /// A delivery was accepted: `outcome` is `new`, `duplicate` or `ignored`.
    pub fn event_received(&self, source: &str, outcome: &'static str) {
        self.received
            .get_or_create(&[
                ("source", source.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
    }

    /// A delivery was refused (`reason` is the rejection's code).
    pub fn delivery_rejected(&self, source: &str, reason: &str) {
        self.rejected
            .get_or_create(&[("source", source.to_owned()), ("reason", reason.to_owned())])
            .inc();
    }

    /// A step was marked done after running for `duration`.
    pub fn step_done(&self, step: &str, duration: Duration) {
        let labels = [("step", step.to_owned())];
        self.steps_done.get_or_create(&labels).inc();
        self.step_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// A step attempt failed; `retried` when another attempt is scheduled.
    pub fn step_failed(&self, step: &str, retried: bool) {
        let then = if retried { "retry" } else { "dead" };
        self.steps_failed
            .get_or_create(&[("step", step.to_owned()), ("then", then.to_owned())])
            .inc();
    }

    /// A step found the bucket of rate limit `limit` empty and was given
    /// back until its next token.
    pub fn step_throttled(&self, limit: &str) {
        self.steps_throttled
            .get_or_create(&[("limit", limit.to_owned())])
            .inc();
    }

    /// A wait step went to wait (`waiting`), or settled (`matched`,
    /// `timed_out`, `slept`).
    pub fn wait(&self, outcome: &'static str) {
        self.waits
            .get_or_create(&[("outcome", outcome.to_owned())])
            .inc();
    }

    /// A claim took over an expired lease.
    pub fn lease_takeover(&self) {
        self.lease_takeovers.inc();
    }

    /// A reconcile run recovered an event of `source` the receiver missed:
    /// `outcome` is `recorded` (pulled into the inbox) or `redelivered`
    /// (the provider was asked to send it again).
    pub fn event_reconciled(&self, source: &str, outcome: &'static str) {
        self.reconciled
            .get_or_create(&[
                ("source", source.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
    }

    /// A reconcile run of `source` failed (the provider's API unreachable
    /// or refusing, a foreign account's events); the next run resumes from
    /// the cursor.
    pub fn reconcile_run_failed(&self, source: &str) {
        self.reconcile_runs_failed
            .get_or_create(&[("source", source.to_owned())])
            .inc();
    }

    /// A worker learnt it had lost `count` leases.
    pub fn leases_lost(&self, count: usize) {
        if count > 0 {
            self.leases_lost
                .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
        }
    }
}
