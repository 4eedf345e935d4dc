//! Counters a worker publishes, so tests and tools can wait on progress
//! instead of sleeping.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::watch;

/// What a worker has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WorkerStats {
    /// Events leased by claims.
    pub claimed: u64,
    /// Claims that took over an expired lease.
    pub takeovers: u64,
    /// Steps marked done.
    pub steps_done: u64,
    /// Step attempts that failed (retried, dead, or parking the event).
    pub steps_failed: u64,
    /// Events finished (every step done).
    pub events_done: u64,
    /// Events dead-lettered.
    pub events_dead: u64,
    /// Events parked: on a step type or rate limit this build lacks, or by
    /// a step that cannot handle them (a payload that does not decode).
    pub events_parked: u64,
    /// Events recorded as stale (not newer than their resource's last applied one).
    pub events_stale: u64,
    /// Leases lost (taken over, or expired before renewal).
    pub leases_lost: u64,
    /// Events running now.
    pub in_flight: u64,
    /// Times the claim loop went idle, waiting for a wake-up or its poll.
    pub idle_waits: u64,
}

/// The sending side, shared by a worker's tasks.
#[derive(Debug, Clone)]
pub struct WorkerSignals {
    sender: Arc<watch::Sender<WorkerStats>>,
}

impl Default for WorkerSignals {
    fn default() -> Self {
        Self {
            sender: Arc::new(watch::Sender::new(WorkerStats::default())),
        }
    }
}

impl WorkerSignals {
    #[doc(hidden)]
    pub fn subscribe(&self) -> watch::Receiver<WorkerStats> {
        self.sender.subscribe()
    }

    #[doc(hidden)]
    pub fn update(&self, f: impl FnOnce(&mut WorkerStats)) {
        self.sender.send_modify(f);
    }

    #[doc(hidden)]
    pub fn leases_lost(&self, count: usize) {
        if count > 0 {
            self.update(|s| s.leases_lost += count as u64);
        }
    }
}
