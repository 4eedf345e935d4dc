//! A worker: claims due events in batches, runs each in its own task, keeps
//! their leases alive, and shuts down gracefully.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::claim_loop::ClaimLoop;
use super::limits::Limits;
use super::pace::Pace;
use super::plan_cache::PlanCache;
use super::shared::RunnerShared;
use super::slots::Slots;
use super::AloneGate;
use super::{WorkerConfig, WorkerSignals, WorkerStats};
use crate::claim::{heartbeat_loop, LeaseBook};
use crate::handler::Registry;
use crate::metrics::Metrics;
use crate::privacy::Privacy;
use crate::resources::Resources;
use tickmark_driver::store::{Store, StoreError};

/// Runs events from a store. Build it with [`Engine::worker`](crate::Engine::worker).
#[derive(Debug)]
pub struct Worker {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    privacy: Arc<Privacy>,
    resources: Resources,
    metrics: Arc<Metrics>,
    gate: Arc<AloneGate>,
    config: WorkerConfig,
    signals: WorkerSignals,
}

impl Worker {
    #[doc(hidden)]
    pub fn new(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        privacy: Arc<Privacy>,
        resources: Resources,
        metrics: Arc<Metrics>,
        gate: Arc<AloneGate>,
        config: WorkerConfig,
    ) -> Self {
        Self {
            store,
            registry,
            privacy,
            resources,
            metrics,
            gate,
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
    ///
    /// `shutdown` is `tickmark::CancellationToken`
    /// (`tokio_util`'s, re-exported):
    ///
    /// ```no_run
    /// # async fn example(engine: tickmark::Engine) -> Result<(), Box<dyn std::error::Error>> {
    /// use tickmark::{CancellationToken, WorkerConfig};
    ///
    /// let shutdown = CancellationToken::new();
    /// let worker = engine.worker(WorkerConfig::default())?;
    /// let running = tokio::spawn(worker.run(shutdown.clone()));
    /// // … on SIGTERM:
    /// shutdown.cancel();
    /// running.await??;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StoreError> {
        self.privacy_ready(&shutdown).await?;
        let shared = self.into_shared(&shutdown);
        let config = &shared.config;
        let heartbeat = HeartbeatTask::start(&shared);
        tracing::info!(worker = %config.name, concurrency = config.concurrency, lease_s = config.lease.as_secs_f64(), backend = %shared.store.backend(), "worker started");
        ClaimLoop::new(Arc::clone(&shared))
            .run(&shutdown, &heartbeat.handle)
            .await;
        heartbeat.stop().await;
        tracing::info!(worker = %config.name, "worker stopped");
        Ok(())
    }

    /// Check the engine's keys against the database before the first claim
    /// (`Privacy::check`): a misconfigured worker stops here, saying what
    /// to do, instead of writing outputs in clear beside sealed rows. A
    /// database that is down is asked again until it answers or shutdown.
    async fn privacy_ready(&self, shutdown: &CancellationToken) -> Result<(), StoreError> {
        loop {
            let declares_subjects = self.registry.declares_subjects();
            match self
                .privacy
                .ready(self.store.as_ref(), declares_subjects)
                .await
            {
                Err(error) if error.is_transient() && !shutdown.is_cancelled() => {
                    tracing::warn!(%error, "checking the encryption keys; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = shutdown.cancelled() => {}
                    }
                }
                // Shut down before the database answered: nothing to run.
                Err(error) if error.is_transient() => return Ok(()),
                other => return other,
            }
        }
    }

    /// What this worker's event tasks share while it runs.
    fn into_shared(self, shutdown: &CancellationToken) -> Arc<RunnerShared> {
        let limits = Limits::new(
            self.config.source_limits.clone(),
            self.config.kind_limits.clone(),
        );
        let slots = Slots::new(self.config.concurrency);
        Arc::new(RunnerShared {
            store: self.store,
            registry: self.registry,
            privacy: self.privacy,
            resources: self.resources,
            metrics: self.metrics,
            config: self.config,
            signals: self.signals,
            book: Arc::new(LeaseBook::default()),
            limits: Arc::new(limits),
            slots,
            plans: PlanCache::default(),
            pace: Pace::default(),
            gate: self.gate,
            shutdown: shutdown.clone(),
            hard_stop: CancellationToken::new(),
        })
    }

    /// Run until no event is pending or running (including events leased by
    /// workers that died: their leases expire and this worker takes them over),
    /// then shut down. Events waiting at a wait step for another event or a
    /// time do not keep it running (they hold nothing; a later worker
    /// settles them). For batch jobs, examples and tests.
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
                // In order, not at random: a simulated run repeats (docs/simulation.md).
                biased;
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

/// The worker's heartbeat, in a task of its own, which ends with the worker:
/// when `run`'s future is dropped (a `select!`, an aborted task), the
/// heartbeat is aborted too rather than ticking on for the process's life.
struct HeartbeatTask {
    handle: JoinHandle<()>,
    stop: CancellationToken,
}

impl Drop for HeartbeatTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl HeartbeatTask {
    /// Renew the leases in `shared`'s book; count lost ones in the worker's
    /// signals and the process's metrics.
    fn start(shared: &Arc<RunnerShared>) -> Self {
        let stop = CancellationToken::new();
        let on_lost = {
            let (signals, metrics) = (shared.signals.clone(), Arc::clone(&shared.metrics));
            move |lost: usize| {
                signals.leases_lost(lost);
                metrics.leases_lost(lost);
            }
        };
        let handle = tokio::spawn(heartbeat_loop(
            Arc::clone(&shared.store),
            Arc::clone(&shared.book),
            shared.config.lease,
            shared.config.heartbeat_every,
            on_lost,
            stop.clone(),
        ));
        Self { handle, stop }
    }

    /// Stop it and wait for it to end. Its panic is never swallowed: a worker
    /// whose leases were not being renewed must not look as if it had stopped
    /// cleanly.
    async fn stop(mut self) {
        self.stop.cancel();
        if let Err(join) = (&mut self.handle).await {
            if join.is_panic() {
                std::panic::resume_unwind(join.into_panic());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::Handlers;

    #[tokio::test(flavor = "current_thread")]
    async fn dropping_the_run_future_stops_the_heartbeat_too() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("worker.db").display());
        let store: Arc<dyn tickmark_driver::Store> = Arc::new(
            tickmark_sqlite::SqliteStore::connect(&url)
                .await
                .expect("store"),
        );
        let worker = Worker::new(
            store,
            Arc::new(Handlers::new().compile().expect("no handlers compile")),
            Arc::default(),
            Resources::default(),
            Arc::new(Metrics::default()),
            Arc::new(AloneGate::default()),
            WorkerConfig::default().with_lease(Duration::from_millis(300)),
        );
        let metrics = tokio::runtime::Handle::current().metrics();
        let running = tokio::spawn(worker.run(CancellationToken::new()));
        // Past a few heartbeats, so the worker's tasks are all running.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let while_running = metrics.num_alive_tasks();
        running.abort();
        assert!(running.await.is_err_and(|join| join.is_cancelled()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = metrics.num_alive_tasks();
        assert!(
            after + 2 <= while_running,
            "the worker's run and its heartbeat both end: {while_running} tasks, then {after}"
        );
    }
}
