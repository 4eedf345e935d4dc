//! Metrics in the Prometheus text format: what this process did (counters and
//! a step-duration histogram, kept in memory), and what the whole fleet has
//! queued (gauges read from the database at scrape time).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tickmark_events_received_total` | counter | `source`, `outcome` (`new`, `duplicate`, `ignored`) |
//! | `tickmark_deliveries_rejected_total` | counter | `source`, `reason` (`bad_signature`, `payload_too_large`, `store_unavailable`, …) |
//! | `tickmark_steps_done_total` | counter | `step` |
//! | `tickmark_steps_failed_total` | counter | `step`, `then` (`retry`, `dead`) |
//! | `tickmark_step_duration_seconds` | histogram | `step` |
//! | `tickmark_lease_takeovers_total` | counter | |
//! | `tickmark_leases_lost_total` | counter | |
//! | `tickmark_events` | gauge | `state` — rows per state, from the database |
//! | `tickmark_oldest_pending_age_seconds` | gauge | age of the oldest due, unclaimed event |
//! | `tickmark_events_stuck` | gauge | running events whose lease expired without a mark (their worker died or stalled) |

mod render;

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

pub use render::render;

/// Upper bounds of the step-duration histogram's buckets, in seconds: from
/// webhook-quick to multi-minute handlers.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; DURATION_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (bucket, bound) in self.buckets.iter_mut().zip(DURATION_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

#[derive(Debug, Default)]
struct Inner {
    counters: BTreeMap<(&'static str, Labels), u64>,
    durations: BTreeMap<String, Histogram>,
}

/// This process's counters. Shared by the engine's receiver and workers.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn count(&self, name: &'static str, labels: Labels) {
        self.with(|inner| *inner.counters.entry((name, labels)).or_default() += 1);
    }

    /// A delivery was accepted: `outcome` is `new`, `duplicate` or `ignored`.
    pub fn event_received(&self, source: &str, outcome: &'static str) {
        self.count(
            "tickmark_events_received_total",
            vec![
                ("source", source.to_owned()),
                ("outcome", outcome.to_owned()),
            ],
        );
    }

    /// A delivery was refused (`reason` is the rejection's code).
    pub fn delivery_rejected(&self, source: &str, reason: &str) {
        self.count(
            "tickmark_deliveries_rejected_total",
            vec![("source", source.to_owned()), ("reason", reason.to_owned())],
        );
    }

    /// A step was marked done after running for `duration`.
    pub fn step_done(&self, step: &str, duration: Duration) {
        self.count("tickmark_steps_done_total", vec![("step", step.to_owned())]);
        self.with(|inner| {
            inner
                .durations
                .entry(step.to_owned())
                .or_default()
                .observe(duration.as_secs_f64())
        });
    }

    /// A step attempt failed; `retried` when another attempt is scheduled.
    pub fn step_failed(&self, step: &str, retried: bool) {
        let then = if retried { "retry" } else { "dead" };
        self.count(
            "tickmark_steps_failed_total",
            vec![("step", step.to_owned()), ("then", then.to_owned())],
        );
    }

    /// A claim took over an expired lease.
    pub fn lease_takeover(&self) {
        self.count("tickmark_lease_takeovers_total", Vec::new());
    }

    /// A worker learnt it had lost `count` leases.
    pub fn leases_lost(&self, count: usize) {
        if count > 0 {
            self.with(|inner| {
                *inner
                    .counters
                    .entry(("tickmark_leases_lost_total", Vec::new()))
                    .or_default() += count as u64;
            });
        }
    }
}
