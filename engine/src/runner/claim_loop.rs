//! A worker's claim loop: start what is ready, claim what there is room for,
//! then wait — for room under a backlog, or for a wake-up or the next due
//! time when idle — until shutdown; then give back what never started and
//! let running steps finish within the grace period.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::event_task::{hold_event, report_panic, start_event, HeldEvent};
use super::shared::RunnerShared;
use crate::store::{ClaimParams, Release, Store, Wakeups};

/// Shortest nap between claims when rows are due but none could be taken
/// (another worker's claim holds them for a moment).
const MIN_NAP: Duration = Duration::from_millis(10);

/// Under a backlog, a claim waits up to this long for a batch's worth of
/// free slots before claiming fewer.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Whether the loop goes on.
enum Flow {
    Continue,
    Stop,
}

/// The state of one worker's claim loop.
pub(super) struct ClaimLoop {
    shared: Arc<RunnerShared>,
    tasks: JoinSet<()>,
    /// Claimed ahead, waiting for a slot (see `WorkerConfig::prefetch`).
    ready: VecDeque<HeldEvent>,
    wakeups: Option<Wakeups>,
    claim_failures: u32,
    /// Whether the last claim filled its batch, so more is probably due.
    backlog: bool,
    last_claim: Instant,
}

impl ClaimLoop {
    pub fn new(shared: Arc<RunnerShared>) -> Self {
        Self {
            shared,
            tasks: JoinSet::new(),
            ready: VecDeque::new(),
            wakeups: None,
            claim_failures: 0,
            backlog: false,
            last_claim: Instant::now(),
        }
    }

    /// Claim and run events until `shutdown` fires (or the heartbeat dies),
    /// then shut down gracefully.
    pub async fn run(mut self, shutdown: &CancellationToken, heartbeat: &JoinHandle<()>) {
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            if heartbeat.is_finished() {
                // Only a panic ends the heartbeat early. Without it every
                // lease runs out under its running step: stop now, and let
                // the panic surface once the tasks are cancelled.
                tracing::error!(
                    "the heartbeat stopped: cancelling running steps and stopping the worker"
                );
                self.shared.hard_stop.cancel();
                break;
            }
            if self.wakeups.is_none() {
                self.wakeups = subscribe(self.shared.store.as_ref()).await;
            }
            self.start_ready();

            let flow = match self.claim_size() {
                Some(limit) => match self.claim(limit).await {
                    Ok(true) => Flow::Continue,
                    Ok(false) => self.wait(shutdown).await,
                    Err(wait) => sleep_unless(shutdown, wait).await,
                },
                None => self.wait(shutdown).await,
            };
            if let Flow::Stop = flow {
                break;
            }
        }
        self.shut_down().await;
    }

    /// Reap finished tasks and start claimed-ahead events while there is room.
    fn start_ready(&mut self) {
        while let Some(joined) = self.tasks.try_join_next() {
            report_panic(joined);
        }
        while self.has_room() {
            let Some(event) = self.ready.pop_front() else {
                break;
            };
            start_event(&mut self.tasks, &self.shared, event);
        }
    }

    /// Whether an event can start now: a slot is free.
    fn has_room(&self) -> bool {
        self.shared.slots.running() < self.shared.config.concurrency
    }

    /// How many events to claim now, if any.
    fn claim_size(&self) -> Option<u32> {
        let config = &self.shared.config;
        // Claim ahead only while events are quick: a prefetched event's
        // lease is held while it waits, so no other worker can run it.
        let prefetch = if self.shared.pace.is_quick() {
            config.prefetch
        } else {
            0
        };
        let running = self.shared.slots.running();
        let free = (config.concurrency + prefetch).saturating_sub(running + self.ready.len());
        // Under a backlog, claim in batches (a quarter of the concurrency
        // at least) instead of one event each time one finishes.
        let min_claim = if running == 0 || self.last_claim.elapsed() >= BATCH_WINDOW {
            1
        } else {
            (config.concurrency / 4).max(1)
        };
        (free >= min_claim).then(|| {
            u32::try_from(free)
                .unwrap_or(u32::MAX)
                .min(config.claim_batch.max(1))
        })
    }

    /// Claim up to `limit` events and start (or queue) each. `Ok(true)` when
    /// the batch came back full, so more is due at once; `Err(wait)` after a
    /// failed claim, with how long to wait before the next.
    async fn claim(&mut self, limit: u32) -> Result<bool, Duration> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let claimed_at = Instant::now();
        self.last_claim = claimed_at;
        let (skip_sources, skip_kinds) = shared.limits.saturated();
        let params = ClaimParams {
            skip_sources: &skip_sources,
            skip_kinds: &skip_kinds,
            ..ClaimParams::new(&config.name, limit, config.lease)
        };
        let claim_span = tracing::debug_span!("claim", worker = %config.name, limit);
        match shared
            .store
            .event_claim_many(&params)
            .instrument(claim_span)
            .await
        {
            Ok(events) => {
                self.claim_failures = 0;
                let full_batch = events.len() == limit as usize;
                self.backlog = full_batch;
                for event in events {
                    let held = hold_event(&shared, event, claimed_at);
                    if self.has_room() {
                        start_event(&mut self.tasks, &shared, held);
                    } else {
                        self.ready.push_back(held);
                    }
                }
                Ok(full_batch)
            }
            Err(error) => {
                self.claim_failures = self.claim_failures.saturating_add(1);
                let wait = config
                    .poll_every
                    .min(Duration::from_millis(100) * self.claim_failures.min(20));
                tracing::warn!(%error, retry_in_ms = wait.as_millis() as u64, "claim failed");
                Err(wait)
            }
        }
    }

    /// Wait for what could make the next claim worthwhile.
    async fn wait(&mut self, shutdown: &CancellationToken) -> Flow {
        if self.backlog && self.shared.slots.running() > 0 {
            // More is due: wait for room, not for a wake-up or a poll.
            tokio::select! {
                // In order, not at random: a simulated run repeats (docs/simulation.md).
                biased;
                _ = shutdown.cancelled() => return Flow::Stop,
                _ = self.shared.slots.freed() => {}
                Some(joined) = self.tasks.join_next() => report_panic(joined),
                _ = tokio::time::sleep(BATCH_WINDOW) => {}
            }
            return Flow::Continue;
        }
        self.idle(shutdown).await
    }

    /// Nap until a wake-up, a finished task, or the next due time (at most
    /// the polling interval: a wake-up can be missed).
    async fn idle(&mut self, shutdown: &CancellationToken) -> Flow {
        let config = &self.shared.config;
        let has_room = self.has_room();
        let nap = if has_room {
            match self.shared.store.event_next_due().await {
                Ok(Some(due)) => due.clamp(MIN_NAP, config.poll_every),
                Ok(None) | Err(_) => config.poll_every,
            }
        } else {
            config.poll_every
        };
        self.shared.signals.update(|s| s.idle_waits += 1);
        tokio::select! {
            // In order, not at random: a simulated run repeats (docs/simulation.md).
            biased;
            _ = shutdown.cancelled() => return Flow::Stop,
            _ = wait_for_wakeup(&mut self.wakeups), if has_room => {}
            _ = self.shared.slots.freed(), if !has_room => {}
            Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => report_panic(joined),
            _ = tokio::time::sleep(nap) => {}
        }
        Flow::Continue
    }

    /// Give back prefetched events, let running steps finish within the
    /// grace period, then cancel what is still running.
    async fn shut_down(mut self) {
        self.release_unstarted().await;
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let running = self.tasks.len();
        if running > 0 {
            tracing::info!(
                running,
                grace_s = config.grace.as_secs_f64(),
                "shutting down: letting running steps finish"
            );
        }
        let finished_in_grace = tokio::time::timeout(config.grace, drain(&mut self.tasks))
            .await
            .is_ok();
        if !finished_in_grace {
            tracing::warn!(
                running = self.tasks.len(),
                "grace period over: cancelling running steps"
            );
            self.shared.hard_stop.cancel();
            drain(&mut self.tasks).await;
        }
    }

    /// Give back prefetched events that will not run here (shutdown).
    async fn release_unstarted(&mut self) {
        for event in self.ready.drain(..) {
            let released = self
                .shared
                .store
                .event_release(&event.claimed.lease, &Release::now(true))
                .await;
            if let Err(error) = released {
                tracing::debug!(%error, "could not give back a prefetched event; its lease will expire");
            }
        }
    }
}

async fn sleep_unless(shutdown: &CancellationToken, wait: Duration) -> Flow {
    tokio::select! {
        // In order, not at random: a simulated run repeats (docs/simulation.md).
        biased;
        _ = shutdown.cancelled() => Flow::Stop,
        _ = tokio::time::sleep(wait) => Flow::Continue,
    }
}

async fn subscribe(store: &dyn Store) -> Option<Wakeups> {
    match store.wakeups().await {
        Ok(wakeups) => Some(wakeups),
        Err(error) => {
            tracing::warn!(%error, "no wake-up subscription yet; polling");
            None
        }
    }
}

async fn wait_for_wakeup(wakeups: &mut Option<Wakeups>) {
    match wakeups {
        Some(wakeups) => wakeups.wait().await,
        None => std::future::pending().await,
    }
}

async fn drain(tasks: &mut JoinSet<()>) {
    while let Some(joined) = tasks.join_next().await {
        report_panic(joined);
    }
}
