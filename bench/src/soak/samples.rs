//! The run's time series: one [`Sample`] per `--sample-every`, written as CSV.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use super::sampler::{is_tickmark, TableSize};

/// Whether deliveries were still being sent, or the run was draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The sender runs at its rate.
    Sending,
    /// The sender stopped; the workers finish what is left.
    Draining,
}

/// One sampling interval.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the start, at the end of the interval.
    pub t_s: f64,
    /// What the run was doing.
    pub phase: Phase,
    /// The interval's length, seconds.
    pub interval_s: f64,
    /// Requests answered 2xx.
    pub acks: u64,
    /// First deliveries answered `new`.
    pub new: u64,
    /// Redeliveries answered `duplicate`.
    pub duplicate: u64,
    /// Failed requests (retried).
    pub failed: u64,
    /// Events that ran their last step.
    pub finished: u64,
    /// Acknowledgement latency of each answered request, ms.
    pub latencies_ms: Vec<f32>,
    /// Events pruned since the start.
    pub pruned_total: u64,
    /// Every table of the run's schema.
    pub tables: Vec<TableSize>,
}

impl Sample {
    /// Acknowledgements per second.
    pub fn acks_per_s(&self) -> f64 {
        self.acks as f64 / self.interval_s
    }

    /// Events finished per second.
    pub fn finished_per_s(&self) -> f64 {
        self.finished as f64 / self.interval_s
    }

    /// The `p` quantile of the interval's acknowledgement latencies (0 when none).
    pub fn ack_ms(&self, p: f64) -> f64 {
        percentile(&self.latencies_ms, p)
    }

    /// tickmark's tables, summed: bytes.
    pub fn tickmark_bytes(&self) -> i64 {
        self.tickmark_tables().map(|t| t.total_bytes).sum()
    }

    /// tickmark's tables, summed: dead tuples.
    pub fn tickmark_dead(&self) -> i64 {
        self.tickmark_tables().map(|t| t.dead_tuples).sum()
    }

    /// One table, if the schema had it.
    pub fn table(&self, name: &str) -> Option<&TableSize> {
        self.tables.iter().find(|t| t.name == name)
    }

    fn tickmark_tables(&self) -> impl Iterator<Item = &TableSize> {
        self.tables.iter().filter(|t| is_tickmark(&t.name))
    }
}

/// The `p` quantile (nearest rank) of `values` (0 when empty).
pub fn percentile(values: &[f32], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let index = ((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1);
    f64::from(sorted[index.min(sorted.len() - 1)])
}

/// Every table name seen in any sample, in order.
pub fn table_names(samples: &[Sample]) -> Vec<String> {
    samples
        .iter()
        .flat_map(|s| s.tables.iter().map(|t| t.name.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Write every sample as one CSV row (overwriting `path`).
pub fn write_csv(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    let names = table_names(samples);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    write!(
        out,
        "t_s,phase,interval_s,acks_per_s,new_per_s,duplicate_per_s,failed,finished_per_s,\
         ack_p50_ms,ack_p99_ms,pruned_total,tickmark_bytes,tickmark_dead_tuples"
    )?;
    for name in &names {
        write!(
            out,
            ",{name}_bytes,{name}_index_bytes,{name}_live_tuples,{name}_dead_tuples"
        )?;
    }
    writeln!(out)?;
    for s in samples {
        write!(
            out,
            "{:.1},{},{:.2},{:.2},{:.2},{:.2},{},{:.2},{:.3},{:.3},{},{},{}",
            s.t_s,
            match s.phase {
                Phase::Sending => "sending",
                Phase::Draining => "draining",
            },
            s.interval_s,
            s.acks_per_s(),
            s.new as f64 / s.interval_s,
            s.duplicate as f64 / s.interval_s,
            s.failed,
            s.finished_per_s(),
            s.ack_ms(0.50),
            s.ack_ms(0.99),
            s.pruned_total,
            s.tickmark_bytes(),
            s.tickmark_dead()
        )?;
        for name in &names {
            match s.table(name) {
                Some(t) => write!(
                    out,
                    ",{},{},{},{}",
                    t.total_bytes, t.index_bytes, t.live_tuples, t.dead_tuples
                )?,
                None => write!(out, ",,,,")?,
            }
        }
        writeln!(out)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_the_nearest_rank() {
        let values: Vec<f32> = (1..=100).map(|v| v as f32).collect();
        assert_eq!(percentile(&values, 0.50), 50.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }
}
