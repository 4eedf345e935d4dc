//! Simulated time. Tokio's clock is paused: it moves only when every task
//! of the simulation waits, straight to the next timer. The wall clock the
//! store reads is that time from a fixed start, plus any forward jumps the
//! simulation injected (a wall clock can jump; tokio's monotonic clock,
//! which leases are counted on in the worker, does not).
//!
//! Only the simulation's thread may read tokio's paused clock: on the
//! database thread `Instant::now()` is the real time. So the simulation
//! thread observes the time before every database call, and the store reads
//! that observation.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tokio::time::Instant;

/// The simulated wall clock.
#[derive(Debug, Clone)]
pub struct SimClock {
    start: Instant,
    epoch: DateTime<Utc>,
    jumped_ms: Arc<AtomicI64>,
    /// Simulated time since the start, in microseconds, as last observed.
    observed_us: Arc<AtomicU64>,
}

impl SimClock {
    /// A clock reading 2026-01-01T00:00:00Z now (call inside the paused runtime).
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
            epoch: Utc
                .with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
                .single()
                .unwrap_or_default(),
            jumped_ms: Arc::new(AtomicI64::new(0)),
            observed_us: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Simulated time since the start (tokio's clock, without jumps), read
    /// on the simulation's thread and recorded for the database thread.
    pub fn elapsed(&self) -> Duration {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.observed_us.store(us, Ordering::SeqCst);
        elapsed
    }

    /// The wall clock at the last observation (on any thread).
    pub fn now(&self) -> DateTime<Utc> {
        let us = i64::try_from(self.observed_us.load(Ordering::SeqCst)).unwrap_or(i64::MAX);
        let elapsed = chrono::Duration::microseconds(us);
        self.epoch + elapsed + chrono::Duration::milliseconds(self.jumped_ms.load(Ordering::SeqCst))
    }

    /// Jump the wall clock forward by `by` (an NTP step, a VM resumed).
    pub fn jump(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.jumped_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// The store's view of this clock.
    pub fn for_store(&self) -> tickmark_driver::store::Clock {
        let clock = self.clone();
        tickmark_driver::store::Clock::from_fn(move || clock.now())
    }
}
