//! A claimed event on its way through this worker: held (its lease in the
//! book, so the heartbeat renews it), then run in a task of its own in one of
//! the worker's slots and under its source's and kind's limits, counted in
//! `in_flight` however the task ends. The lease is held until the task ends,
//! which is after the event's last mark is durable, even when the slot was
//! handed on before (`slots.rs`).

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::event_end::EventEnd;
use super::run_event::run_event;
use super::shared::RunnerShared;
use super::WorkerSignals;
use crate::claim::HeldLease;
use tickmark_driver::store::{ClaimedEvent, Release};

/// A claimed event whose lease this worker holds (renewed by the heartbeat),
/// waiting for a free slot or about to start.
pub(super) struct HeldEvent {
    pub claimed: ClaimedEvent,
    /// When its claim was sent: how long it has waited for a slot.
    pub claimed_at: Instant,
    held: HeldLease,
    cancel: CancellationToken,
}

/// Record a claimed event's lease in the book, so the heartbeat keeps it.
pub(super) fn hold_event(
    shared: &Arc<RunnerShared>,
    claimed: ClaimedEvent,
    claimed_at: Instant,
) -> HeldEvent {
    let cancel = shared.hard_stop.child_token();
    let held = shared.book.hold(
        claimed.lease,
        cancel.clone(),
        claimed_at,
        shared.config.lease,
    );
    let took_over = claimed.took_over;
    shared.signals.update(|s| {
        s.claimed += 1;
        s.takeovers += u64::from(took_over);
    });
    if took_over {
        shared.metrics.lease_takeover();
    }
    HeldEvent {
        claimed,
        claimed_at,
        held,
        cancel,
    }
}

/// Run a held event in its own task, under its source's and kind's limits.
pub(super) fn start_event(tasks: &mut JoinSet<()>, shared: &Arc<RunnerShared>, event: HeldEvent) {
    let HeldEvent {
        claimed,
        held,
        cancel,
        ..
    } = event;
    if cancel.is_cancelled() {
        // Its lease was lost while it waited: another worker has it.
        return;
    }
    let Some(limit) = shared
        .limits
        .try_take(&claimed.event.source, &claimed.event.kind)
    else {
        // Claimed past a limit (the batch held more of one source than it had
        // room for): give it straight back, attempt refunded.
        let store = Arc::clone(&shared.store);
        tasks.spawn(async move {
            let _held = held;
            if let Err(error) = store.event_release(&claimed.lease, &Release::now(true)).await {
                tracing::debug!(%error, "could not give back an event over its limit; its lease will expire");
            }
        });
        return;
    };
    let took_over = claimed.took_over;
    let mut slot = shared.slots.take();
    shared.signals.update(|s| s.in_flight += 1);
    let span = tracing::info_span!(
        "event",
        event_id = %claimed.event.id,
        source = %claimed.event.source,
        kind = %claimed.event.kind,
        seq = claimed.lease.event_seq,
        took_over
    );
    let shared = Arc::clone(shared);
    tasks.spawn(
        async move {
            let _held = held;
            let _limit = limit;
            let _in_flight = InFlight(shared.signals.clone());
            if took_over {
                tracing::warn!("took over an expired lease: resuming at the first unfinished step");
            }
            let started = Instant::now();
            let end = run_event(&shared, claimed, cancel, &mut slot).await;
            drop(slot);
            shared.pace.record(started.elapsed());
            shared.signals.update(|s| match end {
                EventEnd::Done => s.events_done += 1,
                EventEnd::Dead => s.events_dead += 1,
                EventEnd::Parked => s.events_parked += 1,
                EventEnd::Stale => s.events_stale += 1,
                _ => {}
            });
            tracing::debug!(?end, "event run ended");
        }
        .instrument(span),
    );
}

/// Counts an event out of `in_flight` however its task ends.
struct InFlight(WorkerSignals);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .update(|s| s.in_flight = s.in_flight.saturating_sub(1));
    }
}

/// Log an event task that panicked; its lease expires and the event resumes.
pub(super) fn report_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined {
        tracing::error!(%error, "an event task panicked; its lease will expire and the event resume");
    }
}
