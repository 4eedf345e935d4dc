//! A meeting point for the steps of chosen events in one process: each waits
//! until all have arrived. When they all pass, they were provably running at
//! the same time: proof of concurrency by rendezvous, not by comparing
//! timings that depend on how the machine scheduled them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tickmark::StepError;
use tokio::sync::Barrier;

/// Register it with `Engine::with_resource`; a step with `meet: true`
/// ([`Record`](crate::test_steps::Record)) of an expected event waits here.
#[derive(Debug, Clone)]
pub struct Meeting {
    expected: Arc<BTreeSet<String>>,
    barrier: Arc<Barrier>,
    met: Arc<AtomicUsize>,
    limit: Duration,
}

impl Meeting {
    /// A meeting of these events' steps; each waits at most `limit`.
    pub fn of(events: &[&str], limit: Duration) -> Meeting {
        let expected: BTreeSet<String> = events.iter().map(|e| (*e).to_owned()).collect();
        Meeting {
            barrier: Arc::new(Barrier::new(expected.len())),
            expected: Arc::new(expected),
            met: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Wait for the others if `event` is expected here (else return at once);
    /// a terminal failure if they do not all come within the limit.
    pub async fn attend(&self, event: &str) -> Result<(), StepError> {
        if !self.expected.contains(event) {
            return Ok(());
        }
        if tokio::time::timeout(self.limit, self.barrier.wait())
            .await
            .is_err()
        {
            return Err(StepError::terminal(format!(
                "event {event} waited {:?} at the meeting and not everyone came",
                self.limit
            )));
        }
        self.met.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Whether every expected event came and passed.
    pub fn everyone_met(&self) -> bool {
        self.met.load(Ordering::SeqCst) == self.expected.len()
    }
}
