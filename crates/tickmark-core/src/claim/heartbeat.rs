//! The heartbeat: one loop per worker renews all its leases in one statement.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::LeaseBook;
use tickmark_driver::store::transient::retry_transient;
use tickmark_driver::store::Store;

/// Renew every held lease each `every`, until `stop` fires. A lease the
/// database no longer grants (taken over, expired) cancels its event, and
/// `on_lost` hears how many were lost (the worker counts them).
pub async fn heartbeat_loop(
    store: Arc<dyn Store>,
    book: Arc<LeaseBook>,
    lease_for: Duration,
    every: Duration,
    on_lost: impl Fn(usize) + Send,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            // In order, not at random: a simulated run repeats (docs/simulation.md).
            biased;
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let expired = book.cancel_expired(Instant::now());
        on_lost(expired);
        let leases = book.snapshot();
        if leases.is_empty() {
            continue;
        }
        let sent_at = Instant::now();
        // A deadline of one interval: a heartbeat stuck behind a pooler's
        // queue (or a hung connection) must not hold the loop, or the next
        // renewals and the expiry check above, past the leases themselves.
        // A stopping worker does not wait on a renewal either.
        let answer = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            answer = tokio::time::timeout(
                every,
                retry_transient("heartbeat", every / 2, || {
                    store.event_heartbeat_many(&leases, lease_for)
                }),
            ) => answer,
        };
        match answer {
            Ok(Ok(renewed)) => {
                let lost = book.renewed(&leases, &renewed, sent_at, lease_for);
                on_lost(lost);
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, leases = leases.len(), "heartbeat failed; leases run out unless the next one succeeds");
            }
            Err(_) => {
                tracing::warn!(
                    leases = leases.len(),
                    deadline = ?every,
                    "heartbeat got no answer within its interval (a pooler's queue, a hung connection?); leases run out unless the next one succeeds"
                );
            }
        }
    }
}
