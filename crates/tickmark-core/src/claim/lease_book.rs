//! The leases one worker holds, each with the cancellation token of the event
//! running under it and a conservative local expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tickmark_driver::store::Lease;

#[derive(Debug)]
struct Held {
    token: i64,
    cancel: CancellationToken,
    /// Measured from before the claim or heartbeat was sent, so it is never
    /// later than the database's own expiry.
    expires: Instant,
    /// The event's run is ending: the write that takes it out of `running`
    /// (its final mark, a failure, a release) is on its way.
    settling: bool,
}

/// The leases of one worker.
#[derive(Debug, Default)]
pub struct LeaseBook {
    held: Mutex<HashMap<i64, Held>>,
}

/// Removes its lease from the book when the event's task ends, however it ends.
#[derive(Debug)]
pub struct HeldLease {
    book: Arc<LeaseBook>,
    event_seq: i64,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.book.with(|held| held.remove(&self.event_seq));
    }
}

impl LeaseBook {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<i64, Held>) -> T) -> T {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut held)
    }

    /// Record a lease taken by a claim sent at `claimed_at`.
    pub fn hold(
        self: &Arc<Self>,
        lease: Lease,
        cancel: CancellationToken,
        claimed_at: Instant,
        lease_for: Duration,
    ) -> HeldLease {
        self.with(|held| {
            held.insert(
                lease.event_seq,
                Held {
                    token: lease.token,
                    cancel,
                    expires: claimed_at + lease_for,
                    settling: false,
                },
            )
        });
        HeldLease {
            book: Arc::clone(self),
            event_seq: lease.event_seq,
        }
    }

    /// The leases to renew.
    pub fn snapshot(&self) -> Vec<Lease> {
        self.with(|held| {
            held.iter()
                .map(|(&event_seq, h)| Lease {
                    event_seq,
                    token: h.token,
                })
                .collect()
        })
    }

    /// The run of `event_seq` is ending: no step runs under its lease any
    /// more, and the write that takes the event out of `running` is on its
    /// way. A heartbeat that no longer renews the lease is then expected (that
    /// write may commit first), not a loss; the write's own fencing tells
    /// whether the lease held.
    pub fn settling(&self, event_seq: i64) {
        self.with(|held| {
            if let Some(h) = held.get_mut(&event_seq) {
                h.settling = true;
            }
        });
    }

    /// Apply a heartbeat's answer: leases in `renewed` last until
    /// `sent_at + lease_for`; the others among `asked` are lost, and their
    /// events are cancelled, unless they are [settling](Self::settling).
    /// Returns how many were lost.
    pub fn renewed(
        &self,
        asked: &[Lease],
        renewed: &[i64],
        sent_at: Instant,
        lease_for: Duration,
    ) -> usize {
        self.with(|held| {
            let mut lost = 0;
            for lease in asked {
                let Some(h) = held.get_mut(&lease.event_seq) else {
                    continue;
                };
                if h.token != lease.token {
                    continue;
                }
                if renewed.contains(&lease.event_seq) {
                    h.expires = sent_at + lease_for;
                } else if !h.settling && !h.cancel.is_cancelled() {
                    tracing::warn!(event_seq = lease.event_seq, "lease lost: another worker took the event over or it expired; stopping its step");
                    h.cancel.cancel();
                    lost += 1;
                }
            }
            lost
        })
    }

    /// Cancel events whose lease has certainly expired by the local clock
    /// (heartbeats could not reach the database).
    pub fn cancel_expired(&self, now: Instant) -> usize {
        self.with(|held| {
            let mut expired = 0;
            for (event_seq, h) in held.iter() {
                if h.expires <= now && !h.cancel.is_cancelled() {
                    tracing::warn!(
                        event_seq,
                        "lease expired before a heartbeat could renew it; stopping its step"
                    );
                    h.cancel.cancel();
                    expired += 1;
                }
            }
            expired
        })
    }

    /// Whether the lease on `event_seq` is still ours by the local clock:
    /// held, not cancelled, and not past its conservative expiry.
    pub fn is_live(&self, event_seq: i64, now: Instant) -> bool {
        self.with(|held| {
            held.get(&event_seq)
                .is_some_and(|h| !h.cancel.is_cancelled() && h.expires > now)
        })
    }

    /// How many leases are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.with(|held| held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lease_missing_from_the_heartbeat_answer_cancels_its_event() {
        let book = Arc::new(LeaseBook::default());
        let now = Instant::now();
        let kept = CancellationToken::new();
        let lost = CancellationToken::new();
        let _a = book.hold(
            Lease {
                event_seq: 1,
                token: 7,
            },
            kept.clone(),
            now,
            Duration::from_secs(30),
        );
        let _b = book.hold(
            Lease {
                event_seq: 2,
                token: 3,
            },
            lost.clone(),
            now,
            Duration::from_secs(30),
        );
        let asked = book.snapshot();
        assert_eq!(book.renewed(&asked, &[1], now, Duration::from_secs(30)), 1);
        assert!(!kept.is_cancelled());
        assert!(lost.is_cancelled());
    }

    /// The heartbeat raced the event's final mark and the mark committed
    /// first: the event left `running` under this very lease. Nothing runs
    /// under it to stop, and nothing was lost (seen as spurious "lease lost"
    /// warnings in the fleet benchmark and the soak).
    #[tokio::test]
    async fn a_settling_lease_missing_from_the_heartbeat_answer_is_not_lost() {
        let book = Arc::new(LeaseBook::default());
        let now = Instant::now();
        let cancel = CancellationToken::new();
        let _held = book.hold(
            Lease {
                event_seq: 1,
                token: 7,
            },
            cancel.clone(),
            now,
            Duration::from_secs(30),
        );
        book.settling(1);
        let asked = book.snapshot();
        assert_eq!(book.renewed(&asked, &[], now, Duration::from_secs(30)), 0);
        assert!(!cancel.is_cancelled());
    }

    #[tokio::test]
    async fn dropping_the_guard_forgets_the_lease() {
        let book = Arc::new(LeaseBook::default());
        let guard = book.hold(
            Lease {
                event_seq: 1,
                token: 1,
            },
            CancellationToken::new(),
            Instant::now(),
            Duration::from_secs(1),
        );
        assert_eq!(book.len(), 1);
        drop(guard);
        assert_eq!(book.len(), 0);
    }

    #[tokio::test]
    async fn a_locally_expired_lease_cancels_its_event() {
        let book = Arc::new(LeaseBook::default());
        let start = Instant::now();
        let cancel = CancellationToken::new();
        let _g = book.hold(
            Lease {
                event_seq: 1,
                token: 1,
            },
            cancel.clone(),
            start,
            Duration::from_secs(5),
        );
        assert_eq!(book.cancel_expired(start + Duration::from_secs(4)), 0);
        assert_eq!(book.cancel_expired(start + Duration::from_secs(5)), 1);
        assert!(cancel.is_cancelled());
    }
}
