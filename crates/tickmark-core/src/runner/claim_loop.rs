//! A worker's claim loop: start what is ready, claim what there is room for,
//! then wait — for room under a backlog, or for a wake-up or the next due
//! time when idle — until shutdown; then give back what never started and
//! let running steps finish within the grace period.
//!
//! Exact blame for crashes (docs/guarantees.md): while events are quick a
//! worker claims far ahead of its slots, and a lease it loses that way is
//! refunded, not charged (the crash is not known to be that event's). A
//! *suspect* (an event lost twice in a batch, or once while held alone) is
//! taken over only by a claim alone: by a worker of an engine holding
//! nothing, which then claims nothing else until that event ends, so a
//! crash meanwhile is that event's own and is charged. A busy worker that
//! learns a suspect waits (a check every heartbeat interval) makes its
//! engine drain: no worker of it claims a batch until one of them, all
//! empty, has claimed alone, one suspect after another (`alone_gate.rs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::alone_gate::GateState;
use super::event_task::{hold_event, report_panic, start_event, HeldEvent};
use super::shared::RunnerShared;
use tickmark_driver::store::{ClaimParams, ClaimedEvent, Release, Store, StoreError, Wakeups};

/// Shortest nap between claims when rows are due but none could be taken
/// (another worker's claim holds them for a moment).
const MIN_NAP: Duration = Duration::from_millis(10);

/// Under a backlog, a claim waits up to this long for a batch's worth of
/// free slots before claiming fewer.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// While handlers claim in fair shares per tenant, at most this much work
/// (at the recent pace) is claimed ahead of the slots: an event claimed
/// ahead waits in this worker's queue in claim order, so a deep queue of one
/// tenant's events would hold a newly claimed event of another behind them
/// (docs/flow_control.md, "Fair share across tenants"). At 25 ms a quiet
/// tenant's p99 in `fair_bench` was 2.3x its idle p99; at 10 ms, 1.8x, with
/// the same throughput.
const FAIR_PREFETCH_HORIZON: Duration = Duration::from_millis(10);

/// Most prefetched events given back at once (statements in flight): 128
/// round trips for the 512 a worker may hold, and pool connections left to
/// the running steps' marks even when every release is stuck.
const RELEASES_AT_ONCE: usize = 4;

/// Whether the loop goes on.
enum Flow {
    Continue,
    Stop,
}

/// What the worker claims next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Batches of pending events (and expired batch leases on their second chance).
    Batch,
    /// The engine drains for a suspect: claim nothing until empty, then
    /// claim it alone once every worker of the engine is empty.
    Draining,
    /// An event claimed alone is in hand: claim nothing else until it ends,
    /// then the next suspect.
    Alone,
}

/// The state of one worker's claim loop.
pub(super) struct ClaimLoop {
    shared: Arc<RunnerShared>,
    tasks: JoinSet<()>,
    /// Prefetched events waited too long behind slow work and were given
    /// back: claim none ahead until a slot frees (and the pace has heard of
    /// the slow work), or the same events would be claimed back at once.
    prefetch_paused: bool,
    /// Claimed ahead, waiting for a slot (see `WorkerConfig::prefetch`).
    ready: VecDeque<HeldEvent>,
    wakeups: Option<Wakeups>,
    claim_failures: u32,
    /// Whether the last claim filled its batch, so more is probably due.
    backlog: bool,
    last_claim: Instant,
    mode: Mode,
    /// This worker is counted as holding a batch in the engine's gate (it
    /// holds the gate alone exactly while in `Mode::Alone`).
    in_batch: bool,
    /// The gate's changes, to wait for one when it refuses this worker.
    gate_changes: watch::Receiver<GateState>,
    /// When this worker last asked whether a suspect waits.
    suspects_checked: Instant,
    /// A suspect waits that this busy worker leaves to others: its due time
    /// says nothing of work for this worker's batch claims, so idle naps are
    /// not cut short by it.
    suspect_waits: bool,
}

impl ClaimLoop {
    pub fn new(shared: Arc<RunnerShared>) -> Self {
        let gate_changes = shared.gate.subscribe();
        Self {
            shared,
            tasks: JoinSet::new(),
            prefetch_paused: false,
            ready: VecDeque::new(),
            wakeups: None,
            claim_failures: 0,
            backlog: false,
            last_claim: Instant::now(),
            mode: Mode::Batch,
            in_batch: false,
            gate_changes,
            suspects_checked: Instant::now(),
            suspect_waits: false,
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
            self.hand_back_surplus().await;
            if self.is_empty() {
                self.leave_batch();
            }
            match (self.mode, self.shared.gate.draining()) {
                // Another worker of this engine learnt that a suspect waits.
                (Mode::Batch, true) => self.mode = Mode::Draining,
                // Another worker took the suspects alone, and found no more.
                (Mode::Draining, false) => self.mode = Mode::Batch,
                _ => {}
            }

            let flow = match self.mode {
                Mode::Draining | Mode::Alone if !self.is_empty() => {
                    self.wait_for_a_task(shutdown).await
                }
                Mode::Draining | Mode::Alone => self.next_suspect(shutdown).await,
                Mode::Batch => self.batch_turn(shutdown).await,
            };
            if let Flow::Stop = flow {
                break;
            }
        }
        let (gate, alone, in_batch) = (
            Arc::clone(&self.shared.gate),
            self.mode == Mode::Alone,
            self.in_batch,
        );
        self.shut_down().await;
        if alone {
            // Stopping: the drain, if any, is left to the other workers.
            gate.alone_ended(false);
        }
        if in_batch {
            gate.released();
        }
    }

    /// Claim a batch if there is room (after an empty claim by an empty
    /// worker, a suspect alone), else wait.
    async fn batch_turn(&mut self, shutdown: &CancellationToken) -> Flow {
        self.check_suspects().await;
        if self.mode == Mode::Draining {
            return Flow::Continue;
        }
        let Some(limit) = self.claim_size() else {
            return self.wait(shutdown).await;
        };
        if !self.in_batch {
            self.gate_changes.borrow_and_update();
            if !self.shared.gate.enter_batch() {
                // Another worker of this engine runs an event alone, or
                // the engine began to drain.
                return self.wait_for_gate(shutdown).await;
            }
            self.in_batch = true;
        }
        match self.claim(limit).await {
            Ok(claimed) if claimed == limit as usize => Flow::Continue,
            Ok(0) if self.is_empty() => {
                self.leave_batch();
                match self.next_suspect(shutdown).await {
                    Flow::Continue if self.mode == Mode::Batch => self.wait(shutdown).await,
                    flow => flow,
                }
            }
            Ok(_) => self.wait(shutdown).await,
            Err(wait) => sleep_unless(shutdown, wait).await,
        }
    }

    /// With nothing in hand, claim the next suspect alone and run it alone
    /// (mode `Alone`). While the engine drains and another worker still
    /// holds events (or runs one alone), wait for the gate to change; none
    /// left: back to batches.
    async fn next_suspect(&mut self, shutdown: &CancellationToken) -> Flow {
        let gate = Arc::clone(&self.shared.gate);
        if self.mode != Mode::Alone {
            self.gate_changes.borrow_and_update();
            if !gate.enter_alone() {
                if gate.draining() {
                    self.mode = Mode::Draining;
                    return self.wait_for_gate(shutdown).await;
                }
                self.mode = Mode::Batch;
                return Flow::Continue;
            }
        }
        match self.claim_alone().await {
            Ok(true) => {
                self.mode = Mode::Alone;
                Flow::Continue
            }
            Ok(false) => {
                gate.alone_ended(true);
                self.mode = Mode::Batch;
                Flow::Continue
            }
            Err(wait) => {
                gate.alone_ended(false);
                self.mode = if gate.draining() {
                    Mode::Draining
                } else {
                    Mode::Batch
                };
                sleep_unless(shutdown, wait).await
            }
        }
    }

    /// Wait for the engine's gate to change (a worker emptied, a run alone
    /// ended, a drain began or ended), at most a polling interval.
    async fn wait_for_gate(&mut self, shutdown: &CancellationToken) -> Flow {
        tokio::select! {
            // In order, not at random: a simulated run repeats (docs/simulation.md).
            biased;
            _ = shutdown.cancelled() => Flow::Stop,
            _ = self.gate_changes.changed() => Flow::Continue,
            // Look at the heartbeat now and then (the loop checks it).
            _ = tokio::time::sleep(self.shared.config.poll_every) => Flow::Continue,
        }
    }

    /// This worker holds nothing of a batch any more: say so to the gate.
    fn leave_batch(&mut self) {
        if self.in_batch {
            self.shared.gate.released();
            self.in_batch = false;
        }
    }

    /// Whether this worker holds no lease: no task runs (a task holds its
    /// event's lease until the last mark is durable, after its slot was
    /// handed on) and nothing waits for a slot.
    fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.ready.is_empty()
    }

    /// Claim one suspect (an expired lease) alone and start it, to run
    /// alone. `Ok(true)` when one was claimed.
    async fn claim_alone(&mut self) -> Result<bool, Duration> {
        let claimed_at = Instant::now();
        self.suspects_checked = claimed_at;
        let span = tracing::debug_span!("claim alone", worker = %self.shared.config.name);
        let events = self.lease(1, true, span).await?;
        let Some(event) = events.into_iter().next() else {
            return Ok(false);
        };
        tracing::info!(
            event_id = %event.event.id,
            attempt = event.attempt,
            charged = event.charged_attempt(),
            "took over a suspect (an expired lease): running it alone"
        );
        let held = hold_event(&self.shared, event, claimed_at);
        start_event(&mut self.tasks, &self.shared, held);
        Ok(true)
    }

    /// Lease up to `limit` events in one claim: a batch of pending events
    /// (and expired batch leases on their second chance), or `alone`, one
    /// suspect only. `Err(wait)` after a failed claim, with how long to
    /// wait before the next.
    async fn lease(
        &mut self,
        limit: u32,
        alone: bool,
        span: tracing::Span,
    ) -> Result<Vec<ClaimedEvent>, Duration> {
        let config = &self.shared.config;
        let (skip_sources, skip_kinds) = self.shared.limits.saturated();
        let params = ClaimParams {
            skip_sources: &skip_sources,
            skip_kinds: &skip_kinds,
            alone,
            pending: !alone,
            ..ClaimParams::new(&config.name, limit, config.lease)
        };
        let claimed = self
            .shared
            .store
            .event_claim_many(&params)
            .instrument(span)
            .await;
        match claimed {
            Ok(events) => {
                self.claim_failures = 0;
                Ok(events)
            }
            Err(error) => Err(self.claim_failed(&error)),
        }
    }

    /// Every heartbeat interval, ask whether a suspect waits that a claim
    /// alone could take. A worker of quick events makes the engine drain
    /// for it; a worker of long events does so only once the suspect has
    /// waited a whole lease (no worker with nothing in hand came for it).
    async fn check_suspects(&mut self) {
        let config = &self.shared.config;
        if self.suspects_checked.elapsed() < config.heartbeat_every {
            return;
        }
        self.suspects_checked = Instant::now();
        match self.shared.store.event_suspect_waits().await {
            Ok(Some(waited)) if self.shared.pace.is_quick() || waited >= config.lease => {
                tracing::debug!(
                    waited_ms = waited.as_millis() as u64,
                    "a suspect waits: the engine finishes what it holds, then claims it alone"
                );
                self.shared.gate.drain();
                self.mode = Mode::Draining;
            }
            Ok(waits) => self.suspect_waits = waits.is_some(),
            Err(error) => tracing::debug!(%error, "could not ask whether a suspect waits"),
        }
    }

    /// Wait for one of this worker's tasks to end (or shutdown).
    async fn wait_for_a_task(&mut self, shutdown: &CancellationToken) -> Flow {
        tokio::select! {
            // In order, not at random: a simulated run repeats (docs/simulation.md).
            biased;
            _ = shutdown.cancelled() => Flow::Stop,
            Some(joined) = self.tasks.join_next() => {
                report_panic(joined);
                Flow::Continue
            }
            _ = self.shared.slots.freed() => Flow::Continue,
            // Look at the heartbeat now and then (the loop checks it).
            _ = tokio::time::sleep(self.shared.config.poll_every) => Flow::Continue,
        }
    }

    /// Reap finished tasks and start claimed-ahead events while there is room.
    fn start_ready(&mut self) {
        while let Some(joined) = self.tasks.try_join_next() {
            report_panic(joined);
        }
        if self.has_room() {
            self.prefetch_paused = false;
        }
        while self.has_room() {
            let Some(event) = self.ready.pop_front() else {
                break;
            };
            start_event(&mut self.tasks, &self.shared, event);
        }
    }

    /// Give back prefetched events this worker should no longer hold: those
    /// beyond the depth the recent pace allows (events turned slow: the
    /// newest claimed first), and those that waited a heartbeat interval for
    /// a slot (behind slow work), so that other workers run them.
    async fn hand_back_surplus(&mut self) {
        let depth = self.prefetch_depth();
        let waited_too_long = self.shared.config.heartbeat_every;
        let now = Instant::now();
        let mut surplus = Vec::new();
        while self.ready.len() > depth {
            surplus.extend(self.ready.pop_back());
        }
        while self
            .ready
            .front()
            .is_some_and(|event| now.duration_since(event.claimed_at) >= waited_too_long)
        {
            surplus.extend(self.ready.pop_front());
            self.prefetch_paused = true;
        }
        if surplus.is_empty() {
            return;
        }
        tracing::debug!(
            count = surplus.len(),
            "giving back prefetched events that would wait behind slow work"
        );
        release_all(
            self.shared.store.as_ref(),
            surplus,
            self.shared.config.grace,
        )
        .await;
    }

    /// Whether an event can start now: a slot is free.
    fn has_room(&self) -> bool {
        self.shared.slots.running() < self.shared.config.concurrency
    }

    /// How many events to claim now, if any.
    fn claim_size(&self) -> Option<u32> {
        let config = &self.shared.config;
        let depth = self.prefetch_depth();
        let running = self.shared.slots.running();
        let queued = self.ready.len();
        if depth > 0 && queued > depth / 2 {
            // Plenty claimed ahead: claim again when it runs low, in one
            // big batch, not a few events each time a few finish.
            return None;
        }
        let free = (config.concurrency + depth).saturating_sub(running + queued);
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

    /// How many events to hold claimed ahead of a free slot. None unless
    /// events are quick: a prefetched event's lease is held while it waits,
    /// so no other worker can run it. Then up to `WorkerConfig::prefetch`,
    /// but no more than the slots would start within a heartbeat interval
    /// at the recent pace, so an event claimed ahead starts long before
    /// its lease would need renewing, and a lease lost with this worker is
    /// never held back for long.
    fn prefetch_depth(&self) -> usize {
        if self.prefetch_paused {
            return 0;
        }
        let config = &self.shared.config;
        let Some(average) = self.shared.pace.quick_average() else {
            return 0;
        };
        let per_event = average.max(Duration::from_micros(100)).as_secs_f64();
        let horizon = if self.shared.registry.has_tenants() {
            FAIR_PREFETCH_HORIZON.min(config.heartbeat_every)
        } else {
            config.heartbeat_every
        };
        let startable = horizon.as_secs_f64() / per_event * config.concurrency as f64;
        config.prefetch.min(startable as usize)
    }

    /// Claim up to `limit` events and start (or queue) each: `Ok` with how
    /// many were claimed (all of `limit`: more is probably due at once);
    /// `Err(wait)` after a failed claim, with how long to wait before the next.
    async fn claim(&mut self, limit: u32) -> Result<usize, Duration> {
        let claimed_at = Instant::now();
        self.last_claim = claimed_at;
        let span = tracing::debug_span!("claim", worker = %self.shared.config.name, limit);
        let events = self.lease(limit, false, span).await?;
        let claimed = events.len();
        self.backlog = claimed == limit as usize;
        for event in events {
            let held = hold_event(&self.shared, event, claimed_at);
            if self.has_room() {
                start_event(&mut self.tasks, &self.shared, held);
            } else {
                self.ready.push_back(held);
            }
        }
        Ok(claimed)
    }

    /// Count a failed claim; returns how long to wait before the next.
    fn claim_failed(&mut self, error: &StoreError) -> Duration {
        self.claim_failures = self.claim_failures.saturating_add(1);
        let wait = self
            .shared
            .config
            .poll_every
            .min(Duration::from_millis(100) * self.claim_failures.min(20));
        tracing::warn!(%error, retry_in_ms = wait.as_millis() as u64, "claim failed");
        wait
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
        // A suspect is due at once but only for a claim alone: a busy
        // worker that leaves it to others naps at least a heartbeat
        // interval instead of polling for it (wake-ups still come at once).
        let shortest = if self.suspect_waits {
            config.heartbeat_every.min(config.poll_every)
        } else {
            MIN_NAP
        };
        let nap = if has_room {
            match self.shared.store.event_next_due().await {
                Ok(Some(due)) => due.clamp(shortest, config.poll_every),
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
        let unstarted: Vec<HeldEvent> = self.ready.drain(..).collect();
        release_all(
            self.shared.store.as_ref(),
            unstarted,
            self.shared.config.grace,
        )
        .await;
    }
}

/// Give `events` back (their attempts refunded: their steps never started),
/// [`RELEASES_AT_ONCE`] at a time, within `deadline`: what is not given
/// back by then (a store that does not answer) waits for its lease to
/// expire, as after a crash.
async fn release_all(store: &dyn Store, events: Vec<HeldEvent>, deadline: Duration) {
    let count = events.len();
    let release = Release::now(true);
    let releases = async {
        for batch in events.chunks(RELEASES_AT_ONCE) {
            let mut released = Vec::with_capacity(batch.len());
            for event in batch {
                released.push(store.event_release(&event.claimed.lease, &release));
            }
            for answer in futures_util::future::join_all(released).await {
                if let Err(error) = answer {
                    tracing::debug!(%error, "could not give back a prefetched event; its lease will expire");
                }
            }
        }
    };
    if tokio::time::timeout(deadline, releases).await.is_err() {
        tracing::warn!(
            count,
            deadline = ?deadline,
            "prefetched events not all given back in time; the rest wait for their leases to expire"
        );
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
