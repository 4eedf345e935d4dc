//! A worker: claims due events in batches, runs each in its own task, keeps
//! their leases alive, and shuts down gracefully.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::limits::Limits;
use super::pace::Pace;
use super::plan_cache::PlanCache;
use super::run_event::{run_event, EventEnd, RunnerShared};
use super::{WorkerConfig, WorkerSignals, WorkerStats};
use crate::claim::{heartbeat_loop, HeldLease, LeaseBook};
use crate::handler::Registry;
use crate::metrics::Metrics;
use crate::resources::Resources;
use crate::store::{ClaimParams, ClaimedEvent, Release, Store, StoreError, Wakeups};

/// Shortest nap between claims when rows are due but none could be taken
/// (another worker's claim holds them for a moment).
const MIN_NAP: Duration = Duration::from_millis(10);

/// Under a backlog, a claim waits up to this long for a batch's worth of
/// free slots before claiming fewer.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Runs events from a store. Build it with [`Engine::worker`](crate::Engine::worker).
#[derive(Debug)]
pub struct Worker {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    resources: Resources,
    metrics: Arc<Metrics>,
    config: WorkerConfig,
    signals: WorkerSignals,
}

impl Worker {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        resources: Resources,
        metrics: Arc<Metrics>,
        config: WorkerConfig,
    ) -> Self {
        Self {
            store,
            registry,
            resources,
            metrics,
            config,
            signals: WorkerSignals::default(),
        }
    }

    /// The worker's settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Live counters; `changed().await` on the receiver to wait for progress.
    pub fn stats(&self) -> watch::Receiver<WorkerStats> {
        self.signals.subscribe()
    }

    /// Run until `shutdown` fires. Then: stop claiming, let running steps
    /// finish within the grace period, give back leases of events that have
    /// steps left (so another worker picks them up at once), and return.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StoreError> {
        let config = self.config;
        let shared = Arc::new(RunnerShared {
            store: Arc::clone(&self.store),
            registry: self.registry,
            resources: self.resources,
            metrics: self.metrics,
            config: config.clone(),
            signals: self.signals.clone(),
            book: Arc::new(LeaseBook::default()),
            limits: Arc::new(Limits::new(
                config.source_limits.clone(),
                config.kind_limits.clone(),
            )),
            plans: PlanCache::default(),
            pace: Pace::default(),
            shutdown: shutdown.clone(),
            hard_stop: CancellationToken::new(),
        });
        let heartbeat_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat_loop(
            Arc::clone(&shared.store),
            Arc::clone(&shared.book),
            config.lease,
            config.heartbeat_every,
            shared.signals.clone(),
            Arc::clone(&shared.metrics),
            heartbeat_stop.clone(),
        ));
        tracing::info!(worker = %config.name, concurrency = config.concurrency, lease_s = config.lease.as_secs_f64(), backend = %shared.store.backend(), "worker started");

        let mut wakeups: Option<Wakeups> = None;
        let mut tasks: JoinSet<()> = JoinSet::new();
        // Claimed ahead, waiting for a slot (see `WorkerConfig::prefetch`).
        let mut ready: VecDeque<HeldEvent> = VecDeque::new();
        let mut claim_failures: u32 = 0;
        // Whether the last claim filled its batch, so more is probably due.
        let mut backlog = false;
        let mut last_claim = Instant::now();
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
                shared.hard_stop.cancel();
                break;
            }
            if wakeups.is_none() {
                wakeups = subscribe(shared.store.as_ref()).await;
            }
            while let Some(joined) = tasks.try_join_next() {
                report_panic(joined);
            }
            while tasks.len() < config.concurrency {
                let Some(event) = ready.pop_front() else {
                    break;
                };
                start_event(&mut tasks, &shared, event);
            }

            // Claim ahead only while events are quick: a prefetched event's
            // lease is held while it waits, so no other worker can run it.
            let prefetch = if shared.pace.is_quick() {
                config.prefetch
            } else {
                0
            };
            let free = (config.concurrency + prefetch).saturating_sub(tasks.len() + ready.len());
            // Under a backlog, claim in batches (a quarter of the concurrency
            // at least) instead of one event each time one finishes.
            let min_claim = if tasks.is_empty() || last_claim.elapsed() >= BATCH_WINDOW {
                1
            } else {
                (config.concurrency / 4).max(1)
            };
            let mut full_batch = false;
            if free >= min_claim {
                let limit = u32::try_from(free)
                    .unwrap_or(u32::MAX)
                    .min(config.claim_batch.max(1));
                let claimed_at = Instant::now();
                last_claim = claimed_at;
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
                        claim_failures = 0;
                        full_batch = events.len() == limit as usize;
                        backlog = full_batch;
                        for event in events {
                            let held = hold_event(&shared, event, claimed_at);
                            if tasks.len() < config.concurrency {
                                start_event(&mut tasks, &shared, held);
                            } else {
                                ready.push_back(held);
                            }
                        }
                    }
                    Err(error) => {
                        claim_failures = claim_failures.saturating_add(1);
                        let wait = config
                            .poll_every
                            .min(Duration::from_millis(100) * claim_failures.min(20));
                        tracing::warn!(%error, retry_in_ms = wait.as_millis() as u64, "claim failed");
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(wait) => continue,
                        }
                    }
                }
            }
            if full_batch {
                continue;
            }
            if backlog && !tasks.is_empty() {
                // More is due: wait for room, not for a wake-up or a poll.
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    Some(joined) = tasks.join_next() => report_panic(joined),
                    _ = tokio::time::sleep(BATCH_WINDOW) => {}
                }
                continue;
            }

            let has_room = tasks.len() < config.concurrency;
            let nap = if has_room {
                match shared.store.event_next_due().await {
                    Ok(Some(due)) => due.clamp(MIN_NAP, config.poll_every),
                    Ok(None) | Err(_) => config.poll_every,
                }
            } else {
                config.poll_every
            };
            shared.signals.update(|s| s.idle_waits += 1);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = wait_for_wakeup(&mut wakeups), if has_room => {}
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => report_panic(joined),
                _ = tokio::time::sleep(nap) => {}
            }
        }

        release_unstarted(&shared, &mut ready).await;
        let running = tasks.len();
        if running > 0 {
            tracing::info!(
                running,
                grace_s = config.grace.as_secs_f64(),
                "shutting down: letting running steps finish"
            );
        }
        let finished_in_grace = tokio::time::timeout(config.grace, drain(&mut tasks))
            .await
            .is_ok();
        if !finished_in_grace {
            tracing::warn!(
                running = tasks.len(),
                "grace period over: cancelling running steps"
            );
            shared.hard_stop.cancel();
            drain(&mut tasks).await;
        }
        heartbeat_stop.cancel();
        if let Err(join) = heartbeat.await {
            // Never swallowed: a worker whose leases were not being renewed
            // must not look as if it had stopped cleanly.
            if join.is_panic() {
                std::panic::resume_unwind(join.into_panic());
            }
        }
        tracing::info!(worker = %config.name, "worker stopped");
        Ok(())
    }

    /// Run until no event is pending or running (including events leased by
    /// workers that died: their leases expire and this worker takes them over),
    /// then shut down. For batch jobs, examples and tests.
    pub async fn run_until_idle(self) -> Result<WorkerStats, StoreError> {
        let store = Arc::clone(&self.store);
        let mut stats = self.stats();
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(self.run(shutdown.clone()));
        loop {
            // Only an empty worker can be idle; ask the database only then.
            let in_flight = stats.borrow_and_update().in_flight;
            if in_flight == 0 && store.event_count_active().await? == 0 {
                break;
            }
            if in_flight > 0 {
                let _ = stats.wait_for(|s| s.in_flight == 0).await;
                continue;
            }
            tokio::select! {
                _ = stats.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        shutdown.cancel();
        match running.await {
            Ok(result) => result?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
        let final_stats = *stats.borrow();
        Ok(final_stats)
    }
}

/// A claimed event whose lease this worker holds (renewed by the heartbeat),
/// waiting for a free slot or about to start.
struct HeldEvent {
    claimed: ClaimedEvent,
    held: HeldLease,
    cancel: CancellationToken,
}

/// Record a claimed event's lease in the book, so the heartbeat keeps it.
fn hold_event(shared: &Arc<RunnerShared>, claimed: ClaimedEvent, claimed_at: Instant) -> HeldEvent {
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
        held,
        cancel,
    }
}

/// Give back prefetched events that will not run here (shutdown).
async fn release_unstarted(shared: &RunnerShared, ready: &mut VecDeque<HeldEvent>) {
    for event in ready.drain(..) {
        let released = shared
            .store
            .event_release(&event.claimed.lease, &Release::now(true))
            .await;
        if let Err(error) = released {
            tracing::debug!(%error, "could not give back a prefetched event; its lease will expire");
        }
    }
}

/// Run a held event in its own task, under its source's and kind's limits.
fn start_event(tasks: &mut JoinSet<()>, shared: &Arc<RunnerShared>, event: HeldEvent) {
    let HeldEvent {
        claimed,
        held,
        cancel,
    } = event;
    if cancel.is_cancelled() {
        // Its lease was lost while it waited: another worker has it.
        return;
    }
    let Some(slot) = shared
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
            let _slot = slot;
            let _in_flight = InFlight(shared.signals.clone());
            if took_over {
                tracing::warn!("took over an expired lease: resuming at the first unfinished step");
            }
            let started = Instant::now();
            let end = run_event(&shared, claimed, cancel).await;
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

fn report_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined {
        tracing::error!(%error, "an event task panicked; its lease will expire and the event resume");
    }
}
