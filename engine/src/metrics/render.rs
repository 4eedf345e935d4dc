//! The Prometheus text exposition format (version 0.0.4).

use std::fmt::Write as _;

use super::{Labels, Metrics, DURATION_BUCKETS};
use crate::store::{Store, StoreError};

const HELP: [(&str, &str, &str); 6] = [
    ("tickmark_events_received_total", "counter", "Deliveries accepted by this process's receiver, by source and outcome (new, duplicate, ignored)."),
    ("tickmark_deliveries_rejected_total", "counter", "Deliveries refused by this process's receiver, by source and reason."),
    ("tickmark_steps_done_total", "counter", "Steps marked done by this process's workers, by step name."),
    ("tickmark_steps_failed_total", "counter", "Step attempts that failed in this process, by step name and what follows (retry, dead)."),
    ("tickmark_lease_takeovers_total", "counter", "Claims by this process that took over an expired lease (a worker died or stalled)."),
    ("tickmark_leases_lost_total", "counter", "Leases this process's workers lost (taken over, or expired before renewal)."),
];

/// Render this process's counters and the database's queue gauges.
pub async fn render(metrics: &Metrics, store: &dyn Store) -> Result<String, StoreError> {
    let counts = store.event_counts().await?;
    let mut out = String::with_capacity(4096);
    metrics.with(|inner| {
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let mut any = false;
            for ((_, labels), value) in inner.counters.iter().filter(|((n, _), _)| *n == name) {
                let _ = writeln!(out, "{name}{} {value}", label_set(labels, None));
                any = true;
            }
            if !any && labels_free(name) {
                let _ = writeln!(out, "{name} 0");
            }
        }
        let name = "tickmark_step_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} How long steps ran before they were marked done, by step name.\n# TYPE {name} histogram"
        );
        for (step, histogram) in &inner.durations {
            let labels: Labels = vec![("step", step.clone())];
            for (bound, count) in DURATION_BUCKETS.iter().zip(histogram.buckets) {
                let le = bound.to_string();
                let _ = writeln!(out, "{name}_bucket{} {count}", label_set(&labels, Some(&le)));
            }
            let _ = writeln!(out, "{name}_bucket{} {}", label_set(&labels, Some("+Inf")), histogram.count);
            let _ = writeln!(out, "{name}_sum{} {}", label_set(&labels, None), histogram.sum);
            let _ = writeln!(out, "{name}_count{} {}", label_set(&labels, None), histogram.count);
        }
    });

    let name = "tickmark_events";
    let _ = writeln!(out, "# HELP {name} Events in the database, by state (the queue depth of the whole fleet).\n# TYPE {name} gauge");
    for (state, count) in &counts.by_state {
        let labels: Labels = vec![("state", state.as_str().to_owned())];
        let _ = writeln!(out, "{name}{} {count}", label_set(&labels, None));
    }
    let name = "tickmark_oldest_pending_age_seconds";
    let age = counts
        .oldest_pending_age
        .map(|age| age.as_secs_f64())
        .unwrap_or(0.0);
    let _ = writeln!(out, "# HELP {name} How long the oldest due, unclaimed event has waited (0 when none).\n# TYPE {name} gauge\n{name} {age}");
    let name = "tickmark_events_stuck";
    let _ = writeln!(out, "# HELP {name} Running events whose lease expired without a mark (their worker died or stalled).\n# TYPE {name} gauge\n{name} {}", counts.stuck);
    Ok(out)
}

fn labels_free(name: &str) -> bool {
    matches!(
        name,
        "tickmark_lease_takeovers_total" | "tickmark_leases_lost_total"
    )
}

fn label_set(labels: &Labels, le: Option<&str>) -> String {
    if labels.is_empty() && le.is_none() {
        return String::new();
    }
    let mut out = String::from("{");
    let mut first = true;
    let extra = le.map(|le| ("le", le.to_owned()));
    for (key, value) in labels.iter().cloned().chain(extra) {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{key}=\"{}\"", escape(&value));
    }
    out.push('}');
    out
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let labels: Labels = vec![("step", "a\"b\\c\nd".to_owned())];
        assert_eq!(label_set(&labels, None), r#"{step="a\"b\\c\nd"}"#);
        assert_eq!(label_set(&Vec::new(), Some("+Inf")), r#"{le="+Inf"}"#);
    }

    #[test]
    fn a_histogram_counts_into_every_bucket_at_or_above_the_value() {
        let metrics = Metrics::default();
        metrics.step_done("render", std::time::Duration::from_millis(300));
        metrics.with(|inner| {
            let h = &inner.durations["render"];
            assert_eq!(h.count, 1);
            let le_half = DURATION_BUCKETS.iter().position(|b| *b == 0.5).unwrap();
            assert_eq!(h.buckets[le_half], 1);
            assert_eq!(h.buckets[le_half - 1], 0);
        });
    }
}
