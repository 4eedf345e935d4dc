//! How long an event waited after its node was killed (or frozen).
//!
//! Right after a SIGKILL has taken effect (the process is gone), the events
//! the node held a lease on are read from the database: those are its
//! orphans. A watcher polls them every [`POLL`]; an orphan's **wait** is the
//! time from the SIGKILL until the database shows it leased by another worker
//! (or no longer running). The longest wait is bounded by the lease (what was
//! left of it at the kill), plus a claimer's polling interval, plus this
//! watcher's own [`POLL`] — and by the database's downtime when a kill falls
//! in the outage.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::database::Judge;

/// How often orphans are looked at.
pub const POLL: Duration = Duration::from_millis(100);

/// Why the events were orphaned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Their node was SIGKILLed.
    Kill,
    /// Their node was SIGSTOPped past its lease (a zombie).
    Freeze,
}

#[derive(Debug)]
struct Orphan {
    event_seq: i64,
    owner: String,
    since: Instant,
    cause: Cause,
}

/// The orphans and the waits measured so far.
#[derive(Debug, Default)]
pub struct Orphans {
    waiting: Mutex<Vec<Orphan>>,
    waits: Mutex<Vec<(Cause, Duration)>>,
}

impl Orphans {
    /// Note `events`, held by `owner`, orphaned at `since`.
    pub fn add(&self, owner: &str, events: &[i64], since: Instant, cause: Cause) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.extend(events.iter().map(|&event_seq| Orphan {
            event_seq,
            owner: owner.to_owned(),
            since,
            cause,
        }));
    }

    /// Orphans not yet claimed by another worker.
    pub fn still_waiting(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Orphans resumed, and the longest wait, for `cause`.
    pub fn summary(&self, cause: Cause) -> (usize, Option<Duration>) {
        let waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        let of_cause: Vec<Duration> = waits
            .iter()
            .filter(|(c, _)| *c == cause)
            .map(|(_, d)| *d)
            .collect();
        (of_cause.len(), of_cause.iter().max().copied())
    }

    /// Poll until `stop` fires.
    pub async fn watch(self: Arc<Self>, judge: Judge, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(POLL) => {}
            }
            let owners: Vec<(String, Vec<i64>)> = {
                let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                let mut by_owner: Vec<(String, Vec<i64>)> = Vec::new();
                for orphan in waiting.iter() {
                    match by_owner.iter_mut().find(|(o, _)| *o == orphan.owner) {
                        Some((_, ids)) => ids.push(orphan.event_seq),
                        None => by_owner.push((orphan.owner.clone(), vec![orphan.event_seq])),
                    }
                }
                by_owner
            };
            for (owner, ids) in owners {
                // The database may be down for a while: try again next poll.
                let Ok(released) = judge.released_from(&owner, &ids).await else {
                    continue;
                };
                let now = Instant::now();
                let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
                waiting.retain(|orphan| {
                    let resumed = orphan.owner == owner && released.contains(&orphan.event_seq);
                    if resumed {
                        waits.push((orphan.cause, now - orphan.since));
                    }
                    !resumed
                });
            }
        }
    }
}
