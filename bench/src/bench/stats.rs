//! Percentiles of a sample.

use std::time::Duration;

/// The `p`-th percentile (0–100) of `samples`, in milliseconds.
pub fn percentile_ms(samples: &mut [Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)].as_secs_f64() * 1000.0
}
