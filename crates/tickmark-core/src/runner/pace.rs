//! How long this worker's events take, on average: prefetching is only worth
//! its held leases while events are quick.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Events quicker than this on average are worth claiming ahead.
pub const QUICK_EVENT: Duration = Duration::from_millis(200);

/// A moving average of event run times.
#[derive(Debug)]
pub struct Pace {
    average_micros: AtomicU64,
}

impl Default for Pace {
    /// Start pessimistic: no prefetch until events have been seen to be quick.
    fn default() -> Self {
        Self {
            average_micros: AtomicU64::new(u64::MAX),
        }
    }
}

impl Pace {
    /// Fold one event's run time into the average (weight 1/8).
    pub fn record(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .average_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |average| {
                Some(if average == u64::MAX {
                    sample
                } else {
                    average - average / 8 + sample / 8
                })
            });
    }

    /// Whether events have been quick lately.
    pub fn is_quick(&self) -> bool {
        self.quick_average().is_some()
    }

    /// The average run time, when events have been quick lately.
    pub fn quick_average(&self) -> Option<Duration> {
        let average = self.average_micros.load(Ordering::Relaxed);
        let average = (average != u64::MAX).then(|| Duration::from_micros(average))?;
        (average < QUICK_EVENT).then_some(average)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_only_after_quick_events_and_not_after_slow_ones() {
        let pace = Pace::default();
        assert!(!pace.is_quick(), "unknown pace: no prefetch");
        for _ in 0..4 {
            pace.record(Duration::from_millis(3));
        }
        assert!(pace.is_quick());
        for _ in 0..40 {
            pace.record(Duration::from_secs(5));
        }
        assert!(!pace.is_quick());
    }
}
