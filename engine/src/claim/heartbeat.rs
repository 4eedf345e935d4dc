//! The heartbeat: one loop per worker renews all its leases in one statement.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::LeaseBook;
use crate::metrics::Metrics;
use crate::runner::WorkerSignals;
use crate::store::transient::retry_transient;
use crate::store::Store;

/// Renew every held lease each `every`, until `stop` fires. A lease the
/// database no longer grants (taken over, expired) cancels its event.
pub(crate) async fn heartbeat_loop(
    store: Arc<dyn Store>,
    book: Arc<LeaseBook>,
    lease_for: Duration,
    every: Duration,
    signals: WorkerSignals,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let expired = book.cancel_expired(Instant::now());
        record_lost(&signals, &metrics, expired);
        let leases = book.snapshot();
        if leases.is_empty() {
            continue;
        }
        let sent_at = Instant::now();
        let answer = retry_transient("heartbeat", every / 2, || {
            store.event_heartbeat_many(&leases, lease_for)
        })
        .await;
        match answer {
            Ok(renewed) => {
                let lost = book.renewed(&leases, &renewed, sent_at, lease_for);
                record_lost(&signals, &metrics, lost);
            }
            Err(error) => {
                tracing::warn!(%error, leases = leases.len(), "heartbeat failed; leases run out unless the next one succeeds");
            }
        }
    }
}

fn record_lost(signals: &WorkerSignals, metrics: &Metrics, lost: usize) {
    signals.leases_lost(lost);
    metrics.leases_lost(lost);
}
