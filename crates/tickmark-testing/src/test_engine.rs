//! [`TestEngine`]: the user's handlers on a database of the test's own, run
//! by workers the kit drives: until idle (within a deadline), through a
//! crash at a chosen step boundary, on a clock that moves when told.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tickmark_core::handler::Handlers;
use tickmark_core::inbox::Accepted;
use tickmark_core::runner::WorkerConfig;
use tickmark_core::Engine;
use tickmark_core::EventStatus;
use tickmark_driver::event::{EventState, NewEvent, StepState};
use tickmark_driver::store::{Backend, Store, StoreError};

use super::boundaries::{BoundaryLog, Crash, CrashPoint};
use super::clock::FakeClock;
use super::database::TestDatabase;
use super::error::TestError;
use super::ledger::EffectLedger;

/// How often the drive loop looks whether the worker has gone idle.
const IDLE_CHECK_EVERY: Duration = Duration::from_millis(10);

/// Your handlers on a database of the test's own, run by workers this kit
/// drives. Cheap to clone: clones share the engine and the database, which
/// is removed when the last clone drops.
///
/// Built with [`sqlite`](Self::sqlite) (a temp file, a fake clock) or
/// [`postgres`](Self::postgres) (a schema of its own); give it the
/// resources your steps borrow with [`with_resource`](Self::with_resource),
/// as you would the [`Engine`].
#[derive(Debug, Clone)]
pub struct TestEngine {
    engine: Engine,
    database: Arc<TestDatabase>,
    clock: Option<FakeClock>,
    log: Arc<BoundaryLog>,
    ledger: Option<EffectLedger>,
    worker: WorkerConfig,
}

/// A worker running in a task of its own.
type WorkerTask = tokio::task::JoinHandle<Result<(), StoreError>>;

/// How a wait of the drive loop ended.
enum Watched<T> {
    Done(T),
    Interrupted(Interruption),
}

/// What stopped a wait before its work was done.
enum Interruption {
    /// A worker reached a boundary where it was to crash.
    Crash,
    /// The run's deadline passed.
    OutOfTime,
}

/// What a [`TestEngine::run_until_idle_within`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Workers started (one, plus one after each crash).
    pub workers: u32,
    /// Crashes at armed boundaries (or by always-replay).
    pub crashes: u32,
}

impl TestEngine {
    /// Your handlers on a new SQLite file in a temp dir (removed with the
    /// engine), whose store reads a fake clock that stands still until
    /// [`advance`](Self::advance) moves it.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub async fn sqlite(handlers: Handlers) -> Result<Self, TestError> {
        let clock = FakeClock::starting_now();
        let (database, store) = super::database::sqlite(&clock).await?;
        Self::on(database, store, Some(clock), handlers)
    }

    /// Your handlers on a new schema in the PostgreSQL database at `url`
    /// (`postgres://postgres@127.0.0.1:5432/test`, say), dropped with the
    /// engine. Times are the server's own `now()`: no fake clock.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn postgres(url: &str, handlers: Handlers) -> Result<Self, TestError> {
        let (database, store) = super::database::postgres(url).await?;
        Self::on(database, store, None, handlers)
    }

    fn on(
        database: TestDatabase,
        store: Arc<dyn Store>,
        clock: Option<FakeClock>,
        handlers: Handlers,
    ) -> Result<Self, TestError> {
        let log = Arc::new(BoundaryLog::default());
        let engine = Engine::new(store, handlers)?.with_resource(log.faults());
        let worker = WorkerConfig {
            name: "tickmark-test".to_owned(),
            concurrency: 4,
            poll_every: Duration::from_millis(50),
            grace: Duration::from_secs(1),
            ..WorkerConfig::default()
        };
        Ok(Self {
            engine,
            database: Arc::new(database),
            clock,
            log,
            ledger: None,
            worker,
        })
    }

    /// Share `value` with the steps, as [`Engine::with_resource`] does.
    pub fn with_resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.engine = self.engine.with_resource(value);
        self
    }

    /// Record your steps' outbound calls in `ledger` and check it with the
    /// rest: a call without an idempotency key is blamed on the step that
    /// was running when it arrived. Point the clients your steps use at
    /// [`EffectLedger::url`].
    pub fn with_ledger(mut self, ledger: &EffectLedger) -> Self {
        let log = Arc::clone(&self.log);
        ledger.attribute_with(move || log.running());
        self.ledger = Some(ledger.clone());
        self
    }

    /// Run every non-transactional step twice: each is stopped once after
    /// its effect, before its mark, and run again, as after a crash. A step
    /// that is safe to re-run leaves the same end state.
    pub fn always_replay(self, on: bool) -> Self {
        self.log.set_always_replay(on);
        self
    }

    /// The engine under test (to accept events, read statuses, open a
    /// transaction on its database).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The test database's URL, for your application's own pool on it.
    pub fn database_url(&self) -> &str {
        self.database.url()
    }

    /// Which backend the test database is.
    pub fn backend(&self) -> Backend {
        self.database.backend()
    }

    /// Run `sql` (no parameters; DDL, or a fixture's rows) on the test
    /// database, and commit.
    pub async fn execute(&self, sql: &str) -> Result<(), TestError> {
        let mut transaction = self.engine.transaction().await?;
        transaction
            .query(sql)
            .execute()
            .await
            .map_err(StoreError::from)?;
        transaction.commit().await?;
        Ok(())
    }

    /// Deliver `event` once, as the receiver would.
    pub async fn deliver(&self, event: NewEvent) -> Result<Accepted, TestError> {
        Ok(self.engine.accept(event).await?)
    }

    /// Stop the worker dead the first time any event's step `step` reaches
    /// `at`; the next [`run_until_idle_within`](Self::run_until_idle_within)
    /// then resumes the event in a new worker, as after a process crash.
    pub fn crash_once(&self, step: &str, at: Crash) {
        self.log.arm(CrashPoint {
            step: step.to_owned(),
            at,
        });
    }

    /// Move the fake clock on by `by`: waits, snoozes and retries due by
    /// then run at the next [`run_until_idle_within`](Self::run_until_idle_within).
    pub fn advance(&self, by: Duration) -> Result<(), TestError> {
        let clock = self.clock.as_ref().ok_or(TestError::FakeClockNeedsSqlite)?;
        clock.advance(by);
        Ok(())
    }

    /// The fake clock's time (SQLite), or the system's (PostgreSQL).
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        match &self.clock {
            Some(clock) => clock.now(),
            None => chrono::Utc::now(),
        }
    }

    /// Run workers until no event is running or due now, within `limit`.
    /// A crash (armed with [`crash_once`](Self::crash_once), or by
    /// [`always_replay`](Self::always_replay)) kills the worker; its leases
    /// are expired at once (as if their time had run out) and a new worker
    /// resumes the events. Events due later (a retry, a snooze, a wait's
    /// deadline) do not keep it running: [`advance`](Self::advance) the clock.
    pub async fn run_until_idle_within(&self, limit: Duration) -> Result<RunReport, TestError> {
        let deadline = Instant::now() + limit;
        let mut report = RunReport::default();
        loop {
            let worker = self.engine.worker(self.worker.clone())?;
            let stats = worker.stats();
            let shutdown = CancellationToken::new();
            let mut running = tokio::spawn(worker.run(shutdown.clone()));
            report.workers += 1;
            let idle = async {
                loop {
                    if stats.borrow().in_flight == 0 && self.nothing_to_do().await? {
                        return Ok::<(), TestError>(());
                    }
                    tokio::time::sleep(IDLE_CHECK_EVERY).await;
                }
            };
            match self.watch(deadline, idle).await {
                Watched::Done(idle) => idle?,
                Watched::Interrupted(why) => {
                    self.interrupted(running, why, &mut report, limit).await?;
                    continue;
                }
            }
            // Stop the worker, then look again with no worker about: what
            // it gave back on the way out is due again.
            shutdown.cancel();
            match self.watch(deadline, &mut running).await {
                Watched::Done(Ok(result)) => result?,
                Watched::Done(Err(join)) if join.is_panic() => {
                    std::panic::resume_unwind(join.into_panic())
                }
                Watched::Done(Err(_)) => {}
                Watched::Interrupted(why) => {
                    self.interrupted(running, why, &mut report, limit).await?;
                    continue;
                }
            }
            self.log.worker_stopped();
            if self.nothing_to_do().await? {
                return Ok(report);
            }
        }
    }

    /// `work`, unless a crash or the deadline comes first.
    async fn watch<T>(&self, deadline: Instant, work: impl Future<Output = T>) -> Watched<T> {
        tokio::select! {
            biased;
            _ = self.log.crashed() => Watched::Interrupted(Interruption::Crash),
            done = work => Watched::Done(done),
            _ = tokio::time::sleep_until(deadline) => Watched::Interrupted(Interruption::OutOfTime),
        }
    }

    /// Kill the worker; after a crash the run goes on (`Ok`) with a new
    /// one, out of time it fails.
    async fn interrupted(
        &self,
        running: WorkerTask,
        why: Interruption,
        report: &mut RunReport,
        limit: Duration,
    ) -> Result<(), TestError> {
        self.kill(running).await?;
        match why {
            Interruption::Crash => {
                report.crashes += 1;
                Ok(())
            }
            Interruption::OutOfTime => Err(self.not_idle(limit).await),
        }
    }

    /// Kill a worker as a crash would (its event tasks and heartbeat with
    /// it), then expire the leases it held, so the next worker takes them
    /// over now instead of a lease's length from now.
    async fn kill(&self, running: WorkerTask) -> Result<(), TestError> {
        running.abort();
        let _ = running.await;
        self.log.worker_stopped();
        self.database.end_killed_sessions().await?;
        let expire = match self.backend() {
            Backend::Postgres => {
                "UPDATE tickmark_events SET due_at = now() - interval '1 minute' WHERE state = 'running'"
            }
            Backend::Sqlite => {
                "UPDATE tickmark_events SET due_at = '1970-01-01T00:00:00.000Z' WHERE state = 'running'"
            }
        };
        self.execute(expire).await
    }

    /// Nothing running, nothing due now.
    async fn nothing_to_do(&self) -> Result<bool, TestError> {
        let store = self.engine.store();
        let due_now = store
            .event_next_due()
            .await?
            .is_some_and(|wait| wait.is_zero());
        if due_now {
            return Ok(false);
        }
        let counts = store.event_counts().await?;
        let running = counts
            .by_state
            .iter()
            .any(|(state, count)| *state == EventState::Running && *count > 0);
        Ok(!running)
    }

    async fn not_idle(&self, within: Duration) -> TestError {
        match self.engine.store().event_count_active().await {
            Ok(active) => TestError::NotIdle { within, active },
            Err(error) => error.into(),
        }
    }

    /// The event `source` recorded under `id`, with its step-status table.
    pub async fn status(&self, source: &str, id: &str) -> Result<EventStatus, TestError> {
        self.engine
            .event_status(source, id)
            .await?
            .ok_or_else(|| TestError::NoSuchEvent {
                event_source: source.to_owned(),
                id: id.to_owned(),
            })
    }

    /// `Ok` when the event is in `expected`; otherwise an error that shows
    /// each step's state and last error.
    pub async fn assert_event(
        &self,
        source: &str,
        id: &str,
        expected: EventState,
    ) -> Result<EventStatus, TestError> {
        let status = self.status(source, id).await?;
        if status.state() == expected {
            return Ok(status);
        }
        Err(TestError::EventState {
            event_source: source.to_owned(),
            id: id.to_owned(),
            expected,
            actual: status.state(),
            steps: describe_steps(&status),
        })
    }

    /// `Ok` when every step of the event is done.
    pub async fn assert_done(&self, source: &str, id: &str) -> Result<EventStatus, TestError> {
        self.assert_event(source, id, EventState::Done).await
    }

    /// `Ok` when the event's step `step` is in `expected`.
    pub async fn assert_step(
        &self,
        source: &str,
        id: &str,
        step: &str,
        expected: StepState,
    ) -> Result<(), TestError> {
        let status = self.status(source, id).await?;
        let Some(found) = status.step(step) else {
            return Err(TestError::NoSuchStep {
                event_source: source.to_owned(),
                id: id.to_owned(),
                step: step.to_owned(),
                steps: describe_steps(&status),
            });
        };
        if found.state == expected {
            return Ok(());
        }
        Err(TestError::StepState {
            event_source: source.to_owned(),
            id: id.to_owned(),
            step: step.to_owned(),
            expected,
            actual: found.state,
            last_error: found.last_error.clone(),
        })
    }

    /// How many times the code of event `source`/`id`'s step `step` started.
    pub fn runs_of(&self, source: &str, id: &str, step: &str) -> usize {
        self.log
            .started()
            .iter()
            .filter(|started| {
                started.owner.source == source
                    && started.owner.event_id == id
                    && started.owner.step == step
            })
            .count()
    }

    /// The ledger attached with [`with_ledger`](Self::with_ledger).
    pub fn ledger(&self) -> Option<&EffectLedger> {
        self.ledger.as_ref()
    }

    /// `Ok` unless the attached ledger ([`with_ledger`](Self::with_ledger))
    /// saw a double effect.
    pub fn check_ledger(&self) -> Result<(), TestError> {
        match &self.ledger {
            Some(ledger) => ledger.check().map_err(TestError::DoubleEffect),
            None => Ok(()),
        }
    }

    pub(crate) fn log(&self) -> &BoundaryLog {
        &self.log
    }
}

/// `credit_account: done; send_receipt: failed (connection refused)`.
pub(crate) fn describe_steps(status: &EventStatus) -> String {
    status
        .steps
        .iter()
        .map(|step| match &step.last_error {
            Some(error) => format!("{}: {} ({error})", step.step, step.state.as_str()),
            None => format!("{}: {}", step.step, step.state.as_str()),
        })
        .collect::<Vec<_>>()
        .join("; ")
}
