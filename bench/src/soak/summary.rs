//! The run's verdict: the first segment against the last (throughput and
//! acknowledgement p99), how much the tables grew over the second half, the
//! most dead tuples seen, and the correctness counts that must be zero.

use std::fmt::Write as _;

use serde::Serialize;

use super::sampler::is_tickmark;
use super::samples::{percentile, table_names, Phase, Sample};

/// Figures of one segment of the sending phase.
#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    /// From, seconds since the start.
    pub from_s: f64,
    /// To, seconds since the start.
    pub to_s: f64,
    /// Acknowledgements per second.
    pub acks_per_s: f64,
    /// Events finished per second.
    pub finished_per_s: f64,
    /// Acknowledgement latency p50, ms (every request of the segment).
    pub ack_p50_ms: f64,
    /// Acknowledgement latency p99, ms.
    pub ack_p99_ms: f64,
}

/// One table over the run.
#[derive(Debug, Clone, Serialize)]
pub struct TableFigures {
    /// The table.
    pub name: String,
    /// Bytes (with indexes and TOAST) at the middle of the sending phase.
    pub bytes_mid: i64,
    /// Bytes at the end of the sending phase.
    pub bytes_end: i64,
    /// The most bytes seen.
    pub bytes_max: i64,
    /// The most live tuples seen.
    pub live_max: i64,
    /// The most dead tuples seen.
    pub dead_max: i64,
}

/// Counts from the sender, the pruner and the database at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Correctness {
    /// New events acknowledged `new`.
    pub accepted: u64,
    /// Redeliveries sent.
    pub redeliveries: u64,
    /// Late redeliveries sent (older than the retention plus a prune period).
    pub late_redeliveries: u64,
    /// Late redeliveries answered `duplicate`.
    pub late_answered_duplicate: u64,
    /// Redeliveries answered `new` (must be 0).
    pub duplicates_answered_new: u64,
    /// First deliveries answered `duplicate` at their first attempt (must be 0).
    pub first_deliveries_answered_duplicate: u64,
    /// New events never acknowledged (must be 0).
    pub lost: u64,
    /// Failed requests, retried (reported).
    pub failed_requests: u64,
    /// Effect rows applied more than once (must be 0).
    pub double_effects: i64,
    /// Effect rows (must equal `accepted`).
    pub effect_rows: i64,
    /// Events that ran their last step in this process (must equal `accepted`).
    pub finished: u64,
    /// Events still pending or running after the drain (must be 0).
    pub unfinished: i64,
    /// Events in another state than done after the drain (must be 0).
    pub not_done: i64,
    /// Successful prune runs.
    pub prune_runs: u64,
    /// Failed prune runs (must be 0).
    pub prune_failures: u64,
    /// Events deleted by prune.
    pub pruned: u64,
    /// Tombstones deleted by prune once older than the dedup window.
    pub tombstones_expired: u64,
    /// Tombstones at the end (`None`: no `tickmark_tombstones` table).
    pub tombstones_at_end: Option<i64>,
}

impl Correctness {
    /// What went wrong, one sentence each (empty: the run is correct).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let mut must_be_zero = |count: i64, what: &str| {
            if count != 0 {
                failures.push(format!("{count} {what} (must be 0)"));
            }
        };
        must_be_zero(
            self.duplicates_answered_new as i64,
            "redeliveries answered new",
        );
        must_be_zero(
            self.first_deliveries_answered_duplicate as i64,
            "first deliveries answered duplicate",
        );
        must_be_zero(self.lost as i64, "new events never acknowledged");
        must_be_zero(self.double_effects, "effects applied twice");
        must_be_zero(self.unfinished, "events unfinished after the drain");
        must_be_zero(self.not_done, "events finished in another state than done");
        must_be_zero(self.prune_failures as i64, "failed prune runs");
        if self.effect_rows != self.accepted as i64 {
            failures.push(format!(
                "{} effect rows for {} accepted events",
                self.effect_rows, self.accepted
            ));
        }
        if self.finished != self.accepted {
            failures.push(format!(
                "{} events finished for {} accepted",
                self.finished, self.accepted
            ));
        }
        if self.late_answered_duplicate != self.late_redeliveries {
            failures.push(format!(
                "{} of {} late redeliveries answered duplicate",
                self.late_answered_duplicate, self.late_redeliveries
            ));
        }
        if self.tombstones_at_end.is_none() {
            failures.push("no tickmark_tombstones table: a tickmark without tombstones".to_owned());
        }
        failures
    }
}

/// The whole verdict, also written as `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Minutes of sending.
    pub minutes: f64,
    /// Deliveries per second asked for.
    pub rate: f64,
    /// Samples taken (sending and draining).
    pub samples: usize,
    /// The first segment of the sending phase.
    pub first: Option<Segment>,
    /// The last segment of the sending phase.
    pub last: Option<Segment>,
    /// Last ÷ first, acknowledgements per second.
    pub throughput_ratio: Option<f64>,
    /// Last ÷ first, events finished per second.
    pub finished_ratio: Option<f64>,
    /// Last ÷ first, acknowledgement p99.
    pub ack_p99_ratio: Option<f64>,
    /// tickmark's tables at the middle of the sending phase, bytes.
    pub tickmark_bytes_mid: i64,
    /// tickmark's tables at the end of the sending phase, bytes.
    pub tickmark_bytes_end: i64,
    /// End ÷ middle: how much tickmark's tables grew over the second half.
    pub growth_last_half: Option<f64>,
    /// The most dead tuples seen in tickmark's tables at once.
    pub tickmark_dead_max: i64,
    /// Each table.
    pub tables: Vec<TableFigures>,
    /// The correctness counts.
    pub correctness: Correctness,
    /// What failed (empty: passed).
    pub failures: Vec<String>,
}

/// How long a comparison segment is: ten minutes of a run of 30 minutes or
/// more, a tenth of a shorter one.
pub fn segment_seconds(sending_s: f64) -> f64 {
    if sending_s >= 30.0 * 60.0 {
        600.0
    } else {
        sending_s / 10.0
    }
}

impl Summary {
    /// The verdict over `samples`.
    pub fn new(samples: &[Sample], minutes: f64, rate: f64, correctness: Correctness) -> Self {
        let sending: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.phase == Phase::Sending)
            .collect();
        let end_s = sending.last().map_or(0.0, |s| s.t_s);
        let length = segment_seconds(end_s);
        let first = segment(&sending, 0.0, length);
        let last = segment(&sending, end_s - length, end_s);
        let ratio = |f: fn(&Segment) -> f64| match (&first, &last) {
            (Some(a), Some(b)) if f(a) > 0.0 => Some(f(b) / f(a)),
            _ => None,
        };
        let mid = sending.iter().find(|s| s.t_s >= end_s / 2.0).copied();
        let end = sending.last().copied();
        let bytes = |s: Option<&Sample>| s.map_or(0, Sample::tickmark_bytes);
        let tables = table_names(samples)
            .into_iter()
            .map(|name| {
                let of = |s: Option<&Sample>, f: fn(&super::sampler::TableSize) -> i64| {
                    s.and_then(|s| s.table(&name)).map_or(0, f)
                };
                let max = |f: fn(&super::sampler::TableSize) -> i64| {
                    samples
                        .iter()
                        .filter_map(|s| s.table(&name).map(f))
                        .max()
                        .unwrap_or(0)
                };
                TableFigures {
                    bytes_mid: of(mid, |t| t.total_bytes),
                    bytes_end: of(end, |t| t.total_bytes),
                    bytes_max: max(|t| t.total_bytes),
                    live_max: max(|t| t.live_tuples),
                    dead_max: max(|t| t.dead_tuples),
                    name,
                }
            })
            .collect();
        let failures = correctness.failures();
        Summary {
            minutes,
            rate,
            samples: samples.len(),
            throughput_ratio: ratio(|s| s.acks_per_s),
            finished_ratio: ratio(|s| s.finished_per_s),
            ack_p99_ratio: ratio(|s| s.ack_p99_ms),
            first,
            last,
            tickmark_bytes_mid: bytes(mid),
            tickmark_bytes_end: bytes(end),
            growth_last_half: (bytes(mid) > 0).then(|| bytes(end) as f64 / bytes(mid) as f64),
            tickmark_dead_max: samples.iter().map(Sample::tickmark_dead).max().unwrap_or(0),
            tables,
            correctness,
            failures,
        }
    }

    /// Whether every correctness check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The summary as the run prints it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mb = |bytes: i64| bytes as f64 / 1_048_576.0;
        let ratio = |r: Option<f64>| r.map_or("–".to_owned(), |r| format!("{r:.2}"));
        let _ = writeln!(
            out,
            "soak: {:.1} min at {:.0} deliveries/s, {} samples",
            self.minutes, self.rate, self.samples
        );
        for (name, segment) in [("first", &self.first), ("last", &self.last)] {
            if let Some(s) = segment {
                let _ = writeln!(
                    out,
                    "  {name:<5} {:>6.0}–{:<6.0}s  acks {:>7.1}/s  finished {:>7.1}/s  ack p50 {:>6.2} ms  p99 {:>7.2} ms",
                    s.from_s, s.to_s, s.acks_per_s, s.finished_per_s, s.ack_p50_ms, s.ack_p99_ms
                );
            }
        }
        let _ = writeln!(
            out,
            "  last ÷ first: acks {}, finished {}, ack p99 {}",
            ratio(self.throughput_ratio),
            ratio(self.finished_ratio),
            ratio(self.ack_p99_ratio)
        );
        let _ = writeln!(
            out,
            "  tickmark tables: {:.2} MB at mid-run, {:.2} MB at the end (growth over the last half: {}); most dead tuples at once: {}",
            mb(self.tickmark_bytes_mid),
            mb(self.tickmark_bytes_end),
            ratio(self.growth_last_half),
            self.tickmark_dead_max
        );
        let _ = writeln!(
            out,
            "  {:<24} {:>9} {:>9} {:>9} {:>10} {:>10}",
            "table", "mid MB", "end MB", "max MB", "max live", "max dead"
        );
        for t in &self.tables {
            let _ = writeln!(
                out,
                "  {:<24} {:>9.2} {:>9.2} {:>9.2} {:>10} {:>10}{}",
                t.name,
                mb(t.bytes_mid),
                mb(t.bytes_end),
                mb(t.bytes_max),
                t.live_max,
                t.dead_max,
                if is_tickmark(&t.name) {
                    ""
                } else {
                    "  (the soak's own table: grows by design)"
                }
            );
        }
        let c = &self.correctness;
        let _ = writeln!(
            out,
            "  accepted {} new, {} redeliveries ({} late: {} answered duplicate); failed requests {} (retried)",
            c.accepted, c.redeliveries, c.late_redeliveries, c.late_answered_duplicate, c.failed_requests
        );
        let _ = writeln!(
            out,
            "  duplicates answered new {}, first deliveries answered duplicate {}, lost {}, effects applied twice {}, effect rows {}, finished {}, unfinished {}, not done {}",
            c.duplicates_answered_new,
            c.first_deliveries_answered_duplicate,
            c.lost,
            c.double_effects,
            c.effect_rows,
            c.finished,
            c.unfinished,
            c.not_done
        );
        let _ = writeln!(
            out,
            "  prune: {} runs, {} failed, {} events deleted, {} tombstones expired; tombstones at the end: {}",
            c.prune_runs,
            c.prune_failures,
            c.pruned,
            c.tombstones_expired,
            c.tombstones_at_end
                .map_or("no tombstone table".to_owned(), |n| n.to_string())
        );
        if self.passed() {
            let _ = writeln!(out, "  correctness: PASSED");
        } else {
            let _ = writeln!(out, "  correctness: FAILED: {}", self.failures.join("; "));
        }
        out
    }
}

/// The figures of the samples whose interval ended in `(from, to]` (the
/// first segment includes the first sample).
fn segment(sending: &[&Sample], from: f64, to: f64) -> Option<Segment> {
    let inside: Vec<&Sample> = sending
        .iter()
        .filter(|s| (s.t_s > from || from <= 0.0) && s.t_s <= to + 1e-9)
        .copied()
        .collect();
    let seconds: f64 = inside.iter().map(|s| s.interval_s).sum();
    if inside.is_empty() || seconds <= 0.0 {
        return None;
    }
    let latencies: Vec<f32> = inside
        .iter()
        .flat_map(|s| s.latencies_ms.iter().copied())
        .collect();
    Some(Segment {
        from_s: inside[0].t_s - inside[0].interval_s,
        to_s: inside[inside.len() - 1].t_s,
        acks_per_s: inside.iter().map(|s| s.acks).sum::<u64>() as f64 / seconds,
        finished_per_s: inside.iter().map(|s| s.finished).sum::<u64>() as f64 / seconds,
        ack_p50_ms: percentile(&latencies, 0.50),
        ack_p99_ms: percentile(&latencies, 0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_s: f64, acks: u64, latency: f32) -> Sample {
        Sample {
            t_s,
            phase: Phase::Sending,
            interval_s: 10.0,
            acks,
            new: acks,
            duplicate: 0,
            failed: 0,
            finished: acks,
            latencies_ms: vec![latency; acks as usize],
            pruned_total: 0,
            tables: Vec::new(),
        }
    }

    #[test]
    fn first_and_last_tenths_are_compared() {
        let samples: Vec<Sample> = (1..=20)
            .map(|i| sample(f64::from(i) * 10.0, if i <= 2 { 500 } else { 400 }, 2.0))
            .collect();
        let correctness = Correctness {
            tombstones_at_end: Some(0),
            ..Correctness::default()
        };
        let summary = Summary::new(&samples, 200.0 / 60.0, 50.0, correctness);
        let (first, last) = (
            summary.first.clone().unwrap(),
            summary.last.clone().unwrap(),
        );
        assert_eq!((first.from_s, first.to_s), (0.0, 20.0));
        assert_eq!((last.from_s, last.to_s), (180.0, 200.0));
        assert_eq!(first.acks_per_s, 50.0);
        assert_eq!(last.acks_per_s, 40.0);
        assert_eq!(summary.throughput_ratio, Some(0.8));
        assert!(summary.passed());
    }

    #[test]
    fn a_redelivery_answered_new_fails_the_run() {
        let correctness = Correctness {
            accepted: 10,
            effect_rows: 10,
            finished: 10,
            duplicates_answered_new: 1,
            tombstones_at_end: Some(3),
            ..Correctness::default()
        };
        let failures = correctness.failures();
        assert_eq!(failures, ["1 redeliveries answered new (must be 0)"]);
    }

    #[test]
    fn a_double_effect_and_a_missing_tombstone_table_fail_the_run() {
        let correctness = Correctness {
            accepted: 10,
            effect_rows: 10,
            finished: 10,
            double_effects: 2,
            ..Correctness::default()
        };
        let failures = correctness.failures();
        assert_eq!(failures.len(), 2, "{failures:?}");
    }
}
