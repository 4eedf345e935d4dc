//! The engine: a store and its handlers. It accepts events and builds workers.

use std::sync::Arc;

use crate::event_status::EventStatus;
use crate::handler::{HandlerConfigError, Handlers, Registry};
use crate::inbox::{self, Accepted};
use crate::metrics::Metrics;
use crate::operator::{
    replan, Actor, AdminError, Operations, ReplanIgnored, ReplanReport, RetryRequest,
};
use crate::privacy::{self, EraseReport, EraseRequest, Privacy, PrivacyError, Subject};
use crate::resources::Resources;
use crate::runner::{AloneGate, Worker, WorkerConfig, WorkerConfigError};
use tickmark_driver::event::NewEvent;
use tickmark_driver::store::admin::EventFilter;
use tickmark_driver::store::{
    AppConnection, EventCounts, EventRecord, StepTransaction, Store, StoreError,
};

/// Accepts events into the inbox and makes workers that run them.
///
/// Cheap to clone: clones share the store and the handlers.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    privacy: Arc<Privacy>,
    resources: Resources,
    metrics: Arc<Metrics>,
    /// One per engine, shared by its workers: a crash takes them all.
    alone_gate: Arc<AloneGate>,
}

impl Engine {
    /// Check and encode the handlers once; fails on a handler that could never
    /// run correctly (duplicate step names, bad names, no steps).
    pub fn new(store: Arc<dyn Store>, handlers: Handlers) -> Result<Self, HandlerConfigError> {
        Ok(Self {
            store,
            registry: Arc::new(handlers.compile()?),
            privacy: Arc::default(),
            resources: Resources::default(),
            metrics: Arc::new(Metrics::default()),
            alone_gate: Arc::new(AloneGate::default()),
        })
    }

    /// Share `value` with every step this engine's workers run
    /// ([`StepContext::resource`](crate::StepContext::resource)): clients,
    /// pools, settings, secrets — what must not be stored in a plan.
    pub fn with_resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.resources.insert(value);
        self
    }

    /// Seal payloads and step outputs at rest, and record subjects as keyed
    /// hashes, with `privacy`'s keys (`Privacy::from_env()` reads
    /// `TICKMARK_KEYS` and `TICKMARK_SUBJECT_KEY`; docs/privacy.md). The
    /// keys are checked against the database before the first accept and
    /// the first claim ([`check_keys`](Self::check_keys) checks them now).
    pub fn with_privacy(mut self, privacy: Privacy) -> Self {
        self.privacy = Arc::new(privacy);
        self
    }

    /// Check this engine's keys against its database now, as the first
    /// accept and the first claim do: call it at start to fail there, with
    /// an error that says what to do, rather than at the first delivery.
    pub async fn check_keys(&self) -> Result<(), StoreError> {
        self.privacy
            .ready(self.store.as_ref(), self.registry.declares_subjects())
            .await
    }

    /// Erase what this engine's database holds about `subject`: every event
    /// recorded with it ([`Handler::subject`](crate::Handler::subject))
    /// loses its payload, its steps' outputs and errors and its audit
    /// rows' free text; one that had not ended is cancelled and never runs.
    /// Each event's row (its dedup and replay keys) and its step-status
    /// rows stay, so a redelivery is still a duplicate and no step runs
    /// again. Events running under a live lease finish first: the erasure
    /// waits for them up to `request.wait_for_running`, then reports those
    /// still running ([`EraseReport::still_running`]). Fenced and audited.
    pub async fn erase_subject(
        &self,
        subject: &Subject,
        request: &EraseRequest<'_>,
    ) -> Result<EraseReport, PrivacyError> {
        let key = self
            .privacy
            .subject_key()
            .ok_or(PrivacyError::NoSubjectKey)?;
        privacy::erase_subject(self.store.as_ref(), key, subject, request).await
    }

    /// The engine's keys (for tickmark's own crates: the dashboard opens
    /// payloads with them).
    #[doc(hidden)]
    pub fn privacy(&self) -> &Arc<Privacy> {
        &self.privacy
    }

    /// Record an event once. The insert is the dedup decision; the handler's
    /// steps run later, in a worker, never inside this call.
    pub async fn accept(&self, event: NewEvent) -> Result<Accepted, StoreError> {
        inbox::accept(self.store.as_ref(), &self.registry, &self.privacy, &event).await
    }

    /// Record an event in the caller's transaction: the inbox row commits
    /// with the application's own writes, or not at all. The same dedup
    /// decision as [`accept`](Self::accept) (a redelivery, or an event
    /// accepted before, is [`Accepted::Duplicate`], a normal answer that
    /// leaves the transaction usable), one insert on `conn`, neither batched
    /// nor retried: on an error, roll the transaction back and retry it
    /// whole (`StoreError::is_transient` says whether that may help).
    ///
    /// `conn` is the application's transaction on the engine's database
    /// (`&mut tx`, a `sqlx::Transaction` on PostgreSQL or SQLite), usually
    /// on the pool the store was built on
    /// (`PostgresStore::from_pool`):
    ///
    /// ```no_run
    /// # async fn handle(engine: tickmark::Engine, pool: sqlx::PgPool, event: tickmark::NewEvent)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind("ord_1").execute(&mut *tx).await?;
    /// engine.accept_in(&mut tx, event).await?;
    /// tx.commit().await?; // the order and the event, together
    /// # Ok(()) }
    /// ```
    ///
    /// Workers are woken when the transaction commits on PostgreSQL (the
    /// `NOTIFY` is sent in it); on SQLite they find the event at their next
    /// poll ([`WorkerConfig::poll_every`]). On PostgreSQL the transaction
    /// must run at READ COMMITTED (the default). An event of a debounced
    /// handler is refused ([`StoreError::NotInCallerTransaction`]): accept
    /// it with [`accept`](Self::accept) after the commit.
    ///
    /// While the transaction is open, other accepts of the same event (a
    /// live delivery of it) do not wait for it on PostgreSQL: they fail
    /// with [`StoreError::AcceptInProgress`] (the receiver answers 503 and
    /// the provider retries), and other events are recorded as usual. On
    /// SQLite the transaction holds the file's only write lock: every
    /// other write waits for it, up to `busy_timeout` (docs/existing_service.md).
    pub async fn accept_in<'c>(
        &self,
        conn: impl Into<AppConnection<'c>>,
        event: NewEvent,
    ) -> Result<Accepted, StoreError> {
        inbox::accept_in(
            self.store.as_ref(),
            &self.registry,
            &self.privacy,
            &event,
            conn.into(),
        )
        .await
    }

    /// A worker that runs this engine's events with `config`. Workers need no
    /// handlers: each event carries its plan. Settings a worker could never
    /// run with (a zero lease, a heartbeat not shorter than the lease, zero
    /// concurrency or polling) are refused here, before anything runs.
    pub fn worker(&self, config: WorkerConfig) -> Result<Worker, WorkerConfigError> {
        config.validate()?;
        Ok(Worker::new(
            Arc::clone(&self.store),
            Arc::clone(&self.registry),
            Arc::clone(&self.privacy),
            self.resources.clone(),
            Arc::clone(&self.metrics),
            Arc::clone(&self.alone_gate),
            config,
        ))
    }

    /// This process's counters, shared by the receiver and the workers;
    /// render them with [`metrics::render`](crate::metrics::render). For
    /// tickmark's own crates: users read them at `GET /metrics`
    /// (`tickmark::ops::router`).
    #[doc(hidden)]
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// A transaction on the engine's own database, for your application's
    /// writes outside a step (creating its tables at start-up, say): SQL both
    /// backends accept through [`StepTransaction::query`], then
    /// [`commit`](StepTransaction::commit). Dropped uncommitted, it rolls back.
    ///
    /// On SQLite it holds this process's write turn until it ends: keep it short.
    pub async fn transaction(&self) -> Result<StepTransaction, StoreError> {
        self.store.step_transaction_begin().await
    }

    /// The compiled handlers (the receiver and the reconciler ask which
    /// kinds they name).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The event `source` recorded under `id` (its dedup key: the
    /// provider's event id, or `sha256:…` of a body without one) and its
    /// step-status table; `None` when no such event was accepted.
    ///
    /// Two reads, not one snapshot: a worker may mark a step between them,
    /// so a step can be a step further on than the event's own row says.
    pub async fn event_status(
        &self,
        source: &str,
        id: &str,
    ) -> Result<Option<EventStatus>, StoreError> {
        let Some(mut record) = self.store.event_find(source, id).await? else {
            return Ok(None);
        };
        let mut steps = self.store.step_status(record.event.seq).await?;
        self.open_payload(&mut record)?;
        for step in &mut steps {
            if let Some(output) = step.output.take() {
                step.output = Some(self.privacy.open(output).map_err(StoreError::from)?);
            }
        }
        Ok(Some(EventStatus { record, steps }))
    }

    /// How many events are in each state, how many wait, and how long the
    /// oldest due event has waited: what `tickmark status` and `/metrics`
    /// show, in one read.
    pub async fn event_counts(&self) -> Result<EventCounts, StoreError> {
        self.store.event_counts().await
    }

    /// The events `filter` selects, newest first (at most `filter.limit`).
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let mut records = self.store.event_list(filter).await?;
        for record in &mut records {
            self.open_payload(record)?;
        }
        Ok(records)
    }

    /// `record`'s payload opened with this engine's keys (docs/privacy.md).
    fn open_payload(&self, record: &mut EventRecord) -> Result<(), StoreError> {
        let payload = std::mem::take(&mut record.event.payload);
        record.event.payload = self.privacy.open(payload).map_err(StoreError::from)?;
        Ok(())
    }

    /// Give the ignored events `request` names the plans this engine's
    /// handlers have for them: after a deploy adds a handler for a kind
    /// that was recorded `ignored`, its events run as if the handler had
    /// been there when they arrived (each re-plan is a fenced, audited
    /// operator action). Only an engine knows the handlers, so this is the
    /// engine's, not the `tickmark` command line's.
    pub async fn replan_ignored(
        &self,
        request: &ReplanIgnored<'_>,
    ) -> Result<ReplanReport, AdminError> {
        replan::replan_ignored(self.store.as_ref(), &self.registry, &self.privacy, request).await
    }

    /// The store, for tickmark's own crates (the receiver, the dashboard,
    /// reconcile, the command line). Outside semver: read an engine's state
    /// through [`Engine::event_status`], [`Engine::event_counts`] and
    /// [`Engine::events`].
    #[doc(hidden)]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

/// The operator's actions, on the engine's store: the same fenced, audited
/// transitions as `tickmark retry`, `cancel` and `skip` and the dashboard's
/// retry button.
#[async_trait::async_trait]
impl Operations for Engine {
    async fn event_retry(&self, request: &RetryRequest<'_>) -> Result<EventRecord, AdminError> {
        self.store.event_retry(request).await
    }

    async fn event_cancel(
        &self,
        event_seq: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.store.event_cancel(event_seq, actor).await
    }

    async fn step_skip(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.store.step_skip(event_seq, step, actor).await
    }

    async fn step_mark_done_by_hand(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.store
            .step_mark_done_by_hand(event_seq, step, actor)
            .await
    }

    async fn wait_feed(
        &self,
        event_seq: i64,
        step: &str,
        fed: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.store.wait_feed(event_seq, step, fed, actor).await
    }

    async fn wait_time_out(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.store.wait_time_out(event_seq, step, actor).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::handler::Handlers;

    /// Before, a zero lease was accepted and the heartbeat's interval
    /// panicked inside its task, where the panic was swallowed: the worker
    /// ran with no heartbeat. Now it is refused when the worker is built.
    #[tokio::test]
    async fn a_worker_with_settings_that_could_never_run_is_refused_when_built() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("engine.db").display());
        let store = tickmark_sqlite::SqliteStore::connect(&url).await.unwrap();
        let engine = Engine::new(std::sync::Arc::new(store), Handlers::new()).unwrap();

        let zero_lease = engine.worker(WorkerConfig::default().with_lease(Duration::ZERO));
        assert!(matches!(zero_lease, Err(WorkerConfigError::ZeroLease)));
        let no_heartbeat = engine.worker(WorkerConfig {
            heartbeat_every: Duration::ZERO,
            ..WorkerConfig::default()
        });
        let error = no_heartbeat.expect_err("a zero heartbeat is refused");
        assert!(error.to_string().contains("heartbeat"), "{error}");
        assert!(engine.worker(WorkerConfig::default()).is_ok());
    }
}
