//! One scrape: this process's metrics and the database's gauges, encoded by
//! `prometheus-client` in the OpenMetrics text format.
//!
//! The gauges are read from the database at each scrape, so they are built
//! fresh in a registry of their own for that scrape: two scrapes at once
//! never see each other's half-set values, and a state that has emptied
//! disappears instead of lingering at its last count.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{Label, Metrics};
use tickmark_driver::store::admin::TenantRow;
use tickmark_driver::store::ReconcileSummary;
use tickmark_driver::store::{EventCounts, ReconcileCursor, Store, StoreError};

/// The content type of the exposition: OpenMetrics text 1.0.0, which
/// Prometheus asks for first and parses natively.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why a scrape could not be rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The database's gauges could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The client library refused to encode (never expected when writing to
    /// a `String`; kept as an error rather than a panic).
    #[error("the metrics could not be encoded")]
    Encode(#[from] std::fmt::Error),
}

impl RenderError {
    /// Whether trying again later may succeed (the database is unavailable).
    pub fn is_transient(&self) -> bool {
        matches!(self, RenderError::Store(error) if error.is_transient())
    }
}

/// Render this process's counters and the database's queue gauges.
pub async fn render(metrics: &Metrics, store: &dyn Store) -> Result<String, RenderError> {
    let counts = store.event_counts().await?;
    let reconciled = store.reconcile_cursors().await?;
    let tenants = store.tenants(MAX_TENANTS_READ).await?;
    Ok(exposition(metrics, &counts, &reconciled, &tenants)?)
}

/// Tenants shown by name on `/metrics`, those with the most unfinished
/// events; the rest add up under `tenant="other"`, so a platform of ten
/// thousand shops exports a dozen series, not ten thousand.
pub const TOP_TENANTS: usize = 10;

/// At most this many tenants read per scrape (those with the most
/// unfinished events); beyond them, `other` undercounts.
const MAX_TENANTS_READ: u32 = 10_000;

/// The exposition for `metrics`, the database's `counts`, the sources'
/// last reconcile runs and the tenants (most unfinished first).
fn exposition(
    metrics: &Metrics,
    counts: &EventCounts,
    reconciled: &[ReconcileCursor],
    tenants: &[TenantRow],
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    register_process(&mut registry, metrics);
    register_database(&mut registry, counts);
    register_tenants(&mut registry, tenants);
    register_subscriptions(&mut registry, reconciled);
    register_last_runs(&mut registry, reconciled);
    let mut out = String::with_capacity(4096);
    encode(&mut out, &registry)?;
    Ok(out)
}

/// This process's counters and histogram. Counter names go in without
/// `_total`: the client adds it to every sample.
fn register_process(registry: &mut Registry, metrics: &Metrics) {
    registry.register(
        "tickmark_events_received",
        "Deliveries accepted by this process's receiver, by source and outcome (new, duplicate, ignored)",
        metrics.received.clone(),
    );
    registry.register(
        "tickmark_deliveries_rejected",
        "Deliveries refused by this process's receiver, by source and reason",
        metrics.rejected.clone(),
    );
    registry.register(
        "tickmark_steps_done",
        "Steps marked done by this process's workers, by step name",
        metrics.steps_done.clone(),
    );
    registry.register(
        "tickmark_steps_failed",
        "Step attempts that failed in this process, by step name and what follows (retry, dead)",
        metrics.steps_failed.clone(),
    );
    registry.register(
        "tickmark_steps_throttled",
        "Step runs in this process that found their rate-limit bucket empty and waited for a token, by limit",
        metrics.steps_throttled.clone(),
    );
    registry.register(
        "tickmark_waits",
        "Wait steps in this process that went to wait (waiting) or settled (matched, timed_out, slept), by outcome",
        metrics.waits.clone(),
    );
    registry.register(
        "tickmark_lease_takeovers",
        "Claims by this process that took over an expired lease (a worker died or stalled)",
        metrics.lease_takeovers.clone(),
    );
    registry.register(
        "tickmark_leases_lost",
        "Leases this process's workers lost (taken over, or expired before renewal)",
        metrics.leases_lost.clone(),
    );
    registry.register(
        "tickmark_events_reconciled",
        "Missed events this process's reconciler recovered from the provider's API, by source and outcome (recorded, redelivered)",
        metrics.reconciled.clone(),
    );
    registry.register(
        "tickmark_reconcile_runs_failed",
        "Reconcile runs of this process that failed (the provider's API unreachable or refusing, a foreign account's events), by source; the next run resumes from the cursor",
        metrics.reconcile_runs_failed.clone(),
    );
    registry.register(
        "tickmark_step_duration_seconds",
        "How long steps ran before they were marked done, by step name",
        metrics.step_duration.clone(),
    );
}

/// The fleet-wide gauges, as the database has them now.
fn register_database(registry: &mut Registry, counts: &EventCounts) {
    let events = Family::<[Label; 1], Gauge>::default();
    for (state, count) in &counts.by_state {
        events
            .get_or_create(&[("state", state.as_str().to_owned())])
            .set(*count);
    }
    registry.register(
        "tickmark_events",
        "Events in the database, by state (the queue depth of the whole fleet)",
        events,
    );
    let superseded = Family::<[Label; 2], Gauge>::default();
    for (source, kind, count) in &counts.superseded {
        superseded
            .get_or_create(&[("source", source.clone()), ("kind", kind.clone())])
            .set(*count);
    }
    registry.register(
        "tickmark_events_superseded",
        "Events coalesced by debounce into a later event of their key, by source and kind (from the database)",
        superseded,
    );
    let oldest = Gauge::<f64, AtomicU64>::default();
    oldest.set(
        counts
            .oldest_pending_age
            .map(|age| age.as_secs_f64())
            .unwrap_or(0.0),
    );
    registry.register(
        "tickmark_oldest_pending_age_seconds",
        "How long the oldest due, unclaimed event has waited (0 when none)",
        oldest,
    );
    let waiting = Gauge::<i64>::default();
    waiting.set(counts.waiting);
    registry.register(
        "tickmark_events_waiting",
        "Events waiting at a wait step, for another event or a time, holding no lease (from the database)",
        waiting,
    );
    let stuck = Gauge::<i64>::default();
    stuck.set(counts.stuck);
    registry.register(
        "tickmark_events_stuck",
        "Running events whose lease expired without a mark (their worker died or stalled)",
        stuck,
    );
}

/// Per tenant of fair claiming, the [`TOP_TENANTS`] with the most
/// unfinished events by name and the rest as `other`: events pending and
/// running, and how long the oldest due one has waited.
fn register_tenants(registry: &mut Registry, tenants: &[TenantRow]) {
    let events = Family::<[Label; 2], Gauge>::default();
    let waited = Family::<[Label; 1], Gauge<f64, AtomicU64>>::default();
    let now = chrono::Utc::now();
    for (rank, tenant) in tenants.iter().enumerate() {
        let name = if rank < TOP_TENANTS {
            tenant.tenant.clone()
        } else {
            "other".to_owned()
        };
        for (state, count) in [("pending", tenant.pending), ("running", tenant.running)] {
            events
                .get_or_create(&[("tenant", name.clone()), ("state", state.to_owned())])
                .inc_by(count);
        }
        let age = tenant
            .oldest_due_at
            .and_then(|at| (now - at).to_std().ok())
            .map_or(0.0, |age| age.as_secs_f64());
        let gauge = waited.get_or_create(&[("tenant", name)]);
        if age > gauge.get() {
            gauge.set(age);
        }
    }
    registry.register(
        "tickmark_tenant_events",
        "Unfinished events of each tenant of fair claiming, by state (pending, running): the tenants with the most by name, the rest as tenant=\"other\" (from the database)",
        events,
    );
    registry.register(
        "tickmark_tenant_oldest_due_age_seconds",
        "How long each tenant's oldest due, unclaimed event has waited (0 when none): the tenants with the most unfinished events by name, the rest as tenant=\"other\" (from the database)",
        waited,
    );
}

/// Per source whose last reconcile run checked subscriptions: how many the
/// handlers need that the provider no longer has.
fn register_subscriptions(registry: &mut Registry, reconciled: &[ReconcileCursor]) {
    let missing = Family::<[Label; 1], Gauge>::default();
    for row in reconciled {
        let Some(summary) = ReconcileSummary::from_stored(row.last_summary.as_deref()) else {
            continue;
        };
        if summary.provider == "shopify" {
            let count = i64::try_from(summary.missing_subscriptions.len()).unwrap_or(i64::MAX);
            missing
                .get_or_create(&[("source", row.source.clone())])
                .set(count);
        }
    }
    registry.register(
        "tickmark_webhook_subscriptions_missing",
        "Webhook subscriptions the handlers need that the provider no longer has (removed after failed deliveries), by source, as the last reconcile run found (from the database)",
        missing,
    );
}

/// Per source with a stored run: whether its last run failed (from the
/// database, so any process's `/metrics` shows a failure of the process that
/// reconciles).
fn register_last_runs(registry: &mut Registry, reconciled: &[ReconcileCursor]) {
    let failed = Family::<[Label; 1], Gauge>::default();
    for row in reconciled {
        let Some(summary) = ReconcileSummary::from_stored(row.last_summary.as_deref()) else {
            continue;
        };
        failed
            .get_or_create(&[("source", row.source.clone())])
            .set(i64::from(summary.error.is_some()));
    }
    registry.register(
        "tickmark_reconcile_last_run_failed",
        "1 when the source's last reconcile run failed, else 0, by source (from the database; `tickmark status` shows the error)",
        failed,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tickmark_driver::event::EventState;

    fn counts() -> EventCounts {
        EventCounts {
            by_state: vec![(EventState::Pending, 3), (EventState::Dead, 1)],
            superseded: vec![("shopify".into(), "products/update".into(), 7)],
            oldest_pending_age: Some(Duration::from_millis(2500)),
            stuck: 2,
            waiting: 4,
        }
    }

    #[test]
    fn counters_keep_their_total_names_and_end_with_eof() {
        let metrics = Metrics::default();
        metrics.step_done("render", Duration::from_millis(300));
        metrics.step_failed("send", true);
        metrics.leases_lost(3);
        metrics.wait("matched");
        let text = exposition(&metrics, &counts(), &[], &[]).unwrap();
        for line in [
            "# TYPE tickmark_steps_done counter",
            "tickmark_steps_done_total{step=\"render\"} 1",
            "tickmark_steps_failed_total{step=\"send\",then=\"retry\"} 1",
            "tickmark_lease_takeovers_total 0",
            "tickmark_leases_lost_total 3",
            "tickmark_events{state=\"pending\"} 3",
            "tickmark_events{state=\"dead\"} 1",
            "tickmark_oldest_pending_age_seconds 2.5",
            "tickmark_events_stuck 2",
            "tickmark_events_waiting 4",
            "tickmark_waits_total{outcome=\"matched\"} 1",
            "tickmark_events_superseded{source=\"shopify\",kind=\"products/update\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_histogram_counts_into_every_bucket_at_or_above_the_value() {
        let metrics = Metrics::default();
        metrics.step_done("render", Duration::from_millis(300));
        let text = exposition(&metrics, &counts(), &[], &[]).unwrap();
        let bucket = |le: &str| {
            format!("tickmark_step_duration_seconds_bucket{{le=\"{le}\",step=\"render\"}}")
        };
        let value = |le: &str| {
            let prefix = bucket(le);
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(str::trim)
                .unwrap_or_else(|| panic!("{prefix} in\n{text}"))
                .to_owned()
        };
        assert_eq!(value("0.25"), "0");
        assert_eq!(value("0.5"), "1");
        assert_eq!(value("+Inf"), "1");
    }

    fn tenant(name: &str, pending: i64) -> TenantRow {
        TenantRow {
            tenant: name.to_owned(),
            weight: 1.0,
            pending,
            running: 1,
            oldest_due_at: None,
        }
    }

    #[test]
    fn the_top_tenants_are_named_and_the_rest_add_up_as_other() {
        let tenants: Vec<TenantRow> = (0..13)
            .map(|n| tenant(&format!("shop-{n}"), 100 - n))
            .collect();
        let text = exposition(&Metrics::default(), &counts(), &[], &tenants).unwrap();
        for line in [
            "tickmark_tenant_events{tenant=\"shop-0\",state=\"pending\"} 100",
            "tickmark_tenant_events{tenant=\"shop-9\",state=\"running\"} 1",
            // shop-10, 11 and 12: 90 + 89 + 88 pending, one running each.
            "tickmark_tenant_events{tenant=\"other\",state=\"pending\"} 267",
            "tickmark_tenant_events{tenant=\"other\",state=\"running\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("shop-10"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::default();
        metrics.step_done("a\"b\\c\nd", Duration::ZERO);
        let text = exposition(&metrics, &counts(), &[], &[]).unwrap();
        assert!(
            text.contains(r#"tickmark_steps_done_total{step="a\"b\\c\nd"} 1"#),
            "{text}"
        );
    }
}
