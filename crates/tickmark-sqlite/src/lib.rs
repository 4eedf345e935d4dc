//! The SQLite store: one file, zero set-up, the default.
//!
//! WAL mode with `synchronous = FULL`: an event is on disk before the receiver
//! answers 200 (NORMAL would be faster but may lose the last commits on power
//! loss — a lost accepted event, which tickmark promises never to cause).
//! Every write transaction is `BEGIN IMMEDIATE` (it takes the write lock up
//! front, so a read-then-write transaction cannot fail to upgrade), and writers
//! of one process take turns on an in-process mutex so they do not spin in
//! SQLite's busy handler. Several processes may share the file; they wait on
//! `busy_timeout`. Times are the process clock's UTC, as fixed-width text.

mod admin;
mod admin_sql;
mod caller_transaction;
mod debounce;
mod fair;
mod migrate;
mod pragmas;
mod privacy;
mod reconcile;
mod reconcile_sql;
mod sql;
mod time;
mod wait;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};
use tokio::sync::{watch, Mutex, OwnedMutexGuard};

use tickmark_driver::event::{Event, EventState};
use tickmark_driver::store::group_commit::{copy_error, FlushFn, GroupCommit, Overlap};
use tickmark_driver::store::records::{OwnedEventInsert, OwnedMarkDone};
use tickmark_driver::store::tombstone::{key_hash, KeyKind};
use tickmark_driver::store::transaction::Inner;
use tickmark_driver::store::twin;
use tickmark_driver::store::{
    app_connection, decode, AfterFailure, AppConnection, Backend, ClaimParams, ClaimedEvent, Clock,
    EventCounts, EventInsert, EventRecord, InsertOutcome, Lease, MarkDone, MarkFailed, PlanGroup,
    RateTake, RateTaken, ReconcileCursor, ReconcileLease, Release, SequenceCheck, StepStatus,
    StepTransaction, Store, StoreError, WaitSettled, WaitStep, Wakeups,
};
use tickmark_driver::trace_context::TraceContext;
use time::{format_time, parse_time, parse_time_opt};

/// Apply tickmark's schema on an application's pool (what `tickmark::migrate` does).
pub use migrate::run as migrate_pool;

/// The newest schema migration this build applies (`migrations/sqlite`). A
/// database that records a newer one was migrated by a newer tickmark, and
/// opening it fails with
/// [`MigrationError::NewerSchema`](tickmark_driver::store::migration::MigrationError::NewerSchema).
pub fn schema_version() -> i64 {
    tickmark_driver::store::migration::plan::newest(migrate::migrations())
}

/// Connection settings for [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Pool size per process.
    pub max_connections: u32,
    /// How long a writer waits for another process's write lock.
    pub busy_timeout: Duration,
    /// Where the store reads the time: the system clock, or a simulated one.
    pub clock: Clock,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            max_connections: 4,
            busy_timeout: Duration::from_secs(30),
            clock: Clock::system(),
        }
    }
}

/// tickmark's tables in one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    write_turn: Arc<Mutex<()>>,
    accepted: watch::Sender<u64>,
    marks: Arc<GroupCommit<OwnedMarkDone, Result<bool, StoreError>>>,
    inserts: Arc<GroupCommit<OwnedEventInsert, Result<InsertOutcome, StoreError>>>,
    clock: Clock,
}

impl SqliteStore {
    /// Open (creating if missing) with default options and apply the schema.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, SqliteOptions::default()).await
    }

    /// Open (creating if missing) and apply the schema.
    pub async fn connect_with(url: &str, options: SqliteOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true)
            // A row rewritten (a claim, a mark) leaves no copy of its old
            // bytes in the page's free space: an erased payload, or one
            // sealed with a retired key, is not left behind in the file
            // (docs/privacy.md). `fast`: zeroed only where that costs no
            // extra I/O, within the pages being written anyway.
            .pragma("secure_delete", "fast");
        let pool = open_pool(connect, options.max_connections).await?;
        let store = Self::on(pool, options.clock);
        store.migrate().await?;
        Ok(store)
    }

    /// Open an existing file and apply nothing: for a tool that only reads
    /// (`tickmark reconcile --status`, `--dry-run`), which must leave the
    /// file as it finds it (no file is created, no journal mode set). Fails
    /// with a [`MigrationError`](tickmark_driver::store::migration::MigrationError)
    /// unless the file holds exactly this build's schema: none or an older
    /// one ([`Unmigrated`](tickmark_driver::store::migration::MigrationError::Unmigrated)),
    /// a newer tickmark's
    /// ([`NewerSchema`](tickmark_driver::store::migration::MigrationError::NewerSchema)).
    pub async fn connect_without_migrating(
        url: &str,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(false)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true);
        let pool = open_pool(connect, options.max_connections).await?;
        migrate::check_current(&pool).await?;
        Ok(Self::on(pool, options.clock))
    }

    /// A store on the application's own pool: no pool of tickmark's, and
    /// **no migration** — call `tickmark::migrate(&pool)`
    /// first (beside the application's own `sqlx::migrate!`, in either
    /// order), or run `tickmark migrate` in a deploy step.
    ///
    /// Fails with a [`MigrationError`](tickmark_driver::store::migration::MigrationError)
    /// unless the file holds exactly this build's schema, and with
    /// [`StoreError::UnsuitablePool`] unless the pool's connections have
    /// what tickmark's own pool sets (checked on one connection; the
    /// pool's `SqliteConnectOptions` apply to all): `journal_mode = wal`,
    /// `synchronous = full` (or `extra`: an accepted event is on disk
    /// before the receiver answers), `foreign_keys = on` (pruning an event
    /// removes its steps) and a `busy_timeout` (sqlx's default, 5 s, will
    /// do):
    ///
    /// ```no_run
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::str::FromStr;
    /// use tickmark::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
    ///
    /// let options = SqliteConnectOptions::from_str("sqlite://app.db")?
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal)
    ///     .synchronous(SqliteSynchronous::Full);
    /// let pool = SqlitePool::connect_with(options).await?;
    /// tickmark::migrate(&pool).await?;
    /// let store = tickmark::store::sqlite::SqliteStore::from_pool(pool).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// The application's writes do not take the store's in-process write
    /// turn; they and tickmark's wait for each other on `busy_timeout`.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, StoreError> {
        pragmas::check(&pool).await?;
        migrate::check_current(&pool).await?;
        Ok(Self::on(pool, Clock::system()))
    }

    /// The store on `pool`, reading the time from `clock`.
    fn on(pool: SqlitePool, clock: Clock) -> Self {
        let write_turn = Arc::new(Mutex::new(()));
        Self {
            inserts: Arc::new(GroupCommit::start(
                1,
                Overlap::SideBySide,
                MAX_INSERT_BATCH,
                INSERT_QUEUE,
                insert_many(pool.clone(), Arc::clone(&write_turn), clock.clone()),
            )),
            marks: Arc::new(GroupCommit::start(
                1,
                Overlap::SideBySide,
                MAX_MARK_BATCH,
                MARK_QUEUE,
                mark_many(pool.clone(), Arc::clone(&write_turn), clock.clone()),
            )),
            pool,
            write_turn,
            accepted: watch::Sender::new(0),
            clock,
        }
    }

    /// The pool, for the application's own queries on the same file.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Take this process's write turn, then the file's write lock.
    async fn begin_write(
        &self,
    ) -> Result<(OwnedMutexGuard<()>, Transaction<'static, Sqlite>), StoreError> {
        let turn = Arc::clone(&self.write_turn).lock_owned().await;
        let transaction = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok((turn, transaction))
    }

    /// Mark `lease`'s step done on `conn` at `now` (the caller commits):
    /// false when the lease was not held, and nothing was written.
    async fn mark_done_on(
        now: DateTime<Utc>,
        conn: &mut SqliteConnection,
        mark: &MarkDone<'_>,
    ) -> Result<bool, StoreError> {
        let now = format_time(now);
        let advanced = sqlx::query(sql::EVENT_ADVANCE)
            .bind(mark.lease.event_seq)
            .bind(mark.lease.token)
            .bind(mark.position)
            .bind(&now)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if advanced == 0 {
            return Ok(false);
        }
        sqlx::query(sql::STEP_UPSERT_DONE)
            .bind(mark.lease.event_seq)
            .bind(mark.position)
            .bind(mark.step)
            .bind(mark.attempt)
            .bind(mark.lease.token)
            .bind(format_time(mark.started_at))
            .bind(format_time(mark.finished_at))
            .bind(mark.output_json)
            .bind(mark.skipped)
            .execute(&mut *conn)
            .await?;
        Ok(true)
    }

    /// Record a failed attempt of `lease`'s step on `conn` at `now` (the
    /// caller commits): false when the lease was not held, and nothing was
    /// written.
    async fn mark_failed_on(
        now: DateTime<Utc>,
        conn: &mut SqliteConnection,
        mark: &MarkFailed<'_>,
    ) -> Result<bool, StoreError> {
        let (dead, retry_at) = match mark.then {
            AfterFailure::RetryIn(delay) => (false, after(now, delay)),
            AfterFailure::Dead => (true, now),
        };
        let now = format_time(now);
        let changed = sqlx::query(sql::EVENT_FAIL)
            .bind(mark.lease.event_seq)
            .bind(mark.lease.token)
            .bind(mark.position)
            .bind(&now)
            .bind(dead)
            .bind(format_time(retry_at))
            .bind(mark.error)
            .bind(mark.attempt)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if changed == 0 {
            return Ok(false);
        }
        sqlx::query(sql::STEP_UPSERT_FAILED)
            .bind(mark.lease.event_seq)
            .bind(mark.position)
            .bind(mark.step)
            .bind(if dead { "dead" } else { "failed" })
            .bind(mark.attempt)
            .bind(mark.lease.token)
            .bind(format_time(mark.started_at))
            .bind(format_time(mark.finished_at))
            .bind(mark.error)
            .execute(&mut *conn)
            .await?;
        Ok(true)
    }

    async fn confirm_mark(
        &self,
        lease: &Lease,
        position: i32,
        state: &str,
    ) -> Result<(), StoreError> {
        twin::step_mark_confirm(&self.pool, sql::STEP_MARK_CONFIRM, lease, position, state).await
    }

    fn wake_workers(&self) {
        self.accepted
            .send_modify(|count| *count = count.wrapping_add(1));
    }
}

/// Open the pool (its first connection, with the pragmas). Several
/// processes opening a new file at once may see "database is locked" here
/// at once, `busy_timeout` notwithstanding (seen by
/// `app_pool::sqlite_stores_opening_a_new_file_at_once_all_start`, about
/// one run in twenty under load, while another process switched the new
/// file to WAL): retried a few times, as the migration is.
async fn open_pool(
    connect: SqliteConnectOptions,
    max_connections: u32,
) -> Result<SqlitePool, StoreError> {
    let mut tries = 1;
    loop {
        let opened = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .connect_with(connect.clone())
            .await
            .map_err(StoreError::from);
        match opened {
            Err(error) if error.is_transient() && tries < OPEN_TRIES => {
                tracing::debug!(%error, "opening the file raced another process; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(tries))).await;
                tries += 1;
            }
            opened => return opened,
        }
    }
}

/// How often opening the file is tried when another process holds its lock.
const OPEN_TRIES: u32 = 4;

/// A due event as a claim reads it: row number, state, concurrency key and
/// limit, the key's running events, tenant, rank (due time less head start).
type DueRow = (
    i64,
    String,
    Option<String>,
    Option<i32>,
    i64,
    Option<String>,
    String,
);

/// What a claim binds to the statements that choose its events
/// (`claimable!`'s `?1`–`?6`).
struct ClaimBinds<'a> {
    now: &'a str,
    batch: i64,
    skip_sources: &'a str,
    skip_kinds: &'a str,
    alone: bool,
    pending: bool,
}

/// The due events `statement` chooses for a claim: [`sql::EVENT_DUE`], or
/// [`sql::EVENT_DUE_OF_TENANT`] with its `tenant` (`?7`).
async fn due_rows(
    conn: &mut SqliteConnection,
    statement: &'static str,
    binds: &ClaimBinds<'_>,
    tenant: Option<&str>,
) -> Result<Vec<DueRow>, StoreError> {
    let mut query = sqlx::query_as(statement)
        .bind(binds.now)
        .bind(binds.batch)
        .bind(binds.skip_sources)
        .bind(binds.skip_kinds)
        .bind(binds.alone)
        .bind(binds.pending);
    if let Some(tenant) = tenant {
        query = query.bind(tenant);
    }
    Ok(query.fetch_all(conn).await?)
}

/// Keep a claim batch within each key's concurrency limit: `held` counts the
/// key's running events before this claim, so the batch may add only
/// `limit_n - held` more. (Inside the write transaction: exact.)
fn within_key_limits(due: Vec<DueRow>) -> Vec<(i64, String, Option<String>)> {
    let mut added: HashMap<String, i64> = HashMap::new();
    due.into_iter()
        .filter_map(|(seq, state, limit_key, limit_n, held, tenant, _)| {
            if let (Some(key), Some(limit)) = (limit_key, limit_n) {
                let added = added.entry(key).or_insert(0);
                if held + *added >= i64::from(limit) {
                    return None;
                }
                *added += 1;
            }
            Some((seq, state, tenant))
        })
        .collect()
}

/// Most events in one insert transaction.
const MAX_INSERT_BATCH: usize = 256;
/// Most accepts waiting for an insert transaction; beyond it an accept is
/// refused at once (`StoreError::Overloaded`, a 503 from the receiver).
const INSERT_QUEUE: usize = 2 * MAX_INSERT_BATCH;

/// Insert a batch of events in one `BEGIN IMMEDIATE` transaction (one fsync);
/// each answer is New or Duplicate (a repeat within the batch is a Duplicate).
fn insert_many(
    pool: SqlitePool,
    write_turn: Arc<Mutex<()>>,
    clock: Clock,
) -> FlushFn<OwnedEventInsert, Result<InsertOutcome, StoreError>> {
    Arc::new(move |events: Vec<OwnedEventInsert>| {
        let pool = pool.clone();
        let write_turn = Arc::clone(&write_turn);
        let clock = clock.clone();
        Box::pin(async move {
            let written = async {
                let now = clock.now();
                let _turn = write_turn.lock_owned().await;
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let mut outcomes = Vec::with_capacity(events.len());
                for event in &events {
                    outcomes.push(insert_one(&mut tx, event, now).await?);
                }
                tx.commit().await?;
                Ok::<_, StoreError>(outcomes)
            }
            .await;
            match written {
                Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
                Err(error) => events.iter().map(|_| Err(copy_error(&error))).collect(),
            }
        })
    })
}

/// Insert one event on `conn` at `now`, in its write transaction (the
/// caller commits): refused as a duplicate if a tombstone has its keys,
/// recorded under its match keys (waiters woken) when new.
async fn insert_one(
    conn: &mut SqliteConnection,
    event: &OwnedEventInsert,
    now: DateTime<Utc>,
) -> Result<InsertOutcome, StoreError> {
    let keys = (
        event.source.as_str(),
        event.dedup_key.as_str(),
        event.replay_key.as_deref(),
    );
    if tombstoned(&mut *conn, keys).await? {
        return Ok(InsertOutcome::Duplicate);
    }
    let inserted: Option<i64> = sqlx::query_scalar(sql::EVENT_INSERT)
        .bind(&event.source)
        .bind(&event.dedup_key)
        .bind(&event.kind)
        .bind(&event.payload_json)
        .bind(&event.plan_json)
        .bind(event.state.as_str())
        .bind(event.step_count)
        .bind(format_time(event.not_before.unwrap_or(now)))
        .bind(format_time(now))
        .bind(event.resource_key.as_deref())
        .bind(event.resource_seq)
        .bind(event.replay_key.as_deref())
        .bind(event.limit_key.as_deref())
        .bind(event.limit_n)
        .bind(event.tenant_key.as_deref())
        .bind(event.head_start_ms)
        .bind(event.trace.as_ref().map(TraceContext::traceparent))
        .bind(event.trace.as_ref().and_then(TraceContext::tracestate))
        .bind(event.subjects.as_deref())
        .fetch_optional(&mut *conn)
        .await?;
    if let (Some(seq), false) = (inserted, event.match_keys.is_empty()) {
        // Recorded under its match keys, waiters woken, in the insert's
        // transaction (the write lock serialises it with every wait being
        // decided).
        wait::record_match_keys(&mut *conn, seq, &event.match_keys, now).await?;
    }
    Ok(match inserted {
        Some(seq) => InsertOutcome::New(seq),
        None => InsertOutcome::Duplicate,
    })
}

/// Whether a tombstone says an event with these keys (source, dedup key,
/// replay key) was accepted before and pruned (store/tombstone.rs). Asked in
/// the accept's write transaction, which keeps any prune out until it ends.
pub(crate) async fn tombstoned(
    conn: &mut SqliteConnection,
    (source, dedup_key, replay_key): (&str, &str, Option<&str>),
) -> Result<bool, StoreError> {
    let found: Option<i64> = sqlx::query_scalar(sql::TOMBSTONED)
        .bind(source)
        .bind(&key_hash(KeyKind::Dedup, dedup_key)[..])
        .bind(replay_key.map(|key| key_hash(KeyKind::Replay, key).to_vec()))
        .fetch_optional(conn)
        .await?;
    Ok(found.is_some())
}

/// Most marks in one transaction.
const MAX_MARK_BATCH: usize = 512;
/// Most marks waiting for a transaction; beyond it a mark waits for room.
const MARK_QUEUE: usize = 4 * MAX_MARK_BATCH;

/// Write a batch of marks in one `BEGIN IMMEDIATE` transaction (one fsync);
/// each answer says whether that mark was applied.
fn mark_many(
    pool: SqlitePool,
    write_turn: Arc<Mutex<()>>,
    clock: Clock,
) -> FlushFn<OwnedMarkDone, Result<bool, StoreError>> {
    Arc::new(move |marks: Vec<OwnedMarkDone>| {
        let pool = pool.clone();
        let write_turn = Arc::clone(&write_turn);
        let clock = clock.clone();
        Box::pin(async move {
            let written = async {
                let _turn = write_turn.lock_owned().await;
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let now = clock.now();
                let mut applied = Vec::with_capacity(marks.len());
                for mark in &marks {
                    applied.push(SqliteStore::mark_done_on(now, &mut tx, &mark.as_mark()).await?);
                }
                tx.commit().await?;
                Ok::<_, StoreError>(applied)
            }
            .await;
            match written {
                Ok(applied) => applied.into_iter().map(Ok).collect(),
                Err(error) => marks.iter().map(|_| Err(copy_error(&error))).collect(),
            }
        })
    })
}

fn event_from_row(row: &SqliteRow) -> Result<Event, StoreError> {
    let payload: String = row.try_get("payload")?;
    Ok(Event {
        seq: row.try_get("id")?,
        source: row.try_get("source")?,
        id: row.try_get("dedup_key")?,
        kind: row.try_get("kind")?,
        payload: decode::json(&payload, "event payload")?,
        received_at: parse_time(&row.try_get::<String, _>("received_at")?)?,
    })
}

fn record_from_row(row: &SqliteRow) -> Result<EventRecord, StoreError> {
    let state: String = row.try_get("state")?;
    Ok(EventRecord {
        event: event_from_row(row)?,
        state: decode::state(&state, "event state")?,
        step_count: row.try_get("step_count")?,
        next_step: row.try_get("next_step")?,
        attempt: row.try_get("attempt")?,
        due_at: parse_time(&row.try_get::<String, _>("due_at")?)?,
        lease_owner: row.try_get("lease_owner")?,
        lease_token: row.try_get("lease_token")?,
        takeovers: row.try_get("takeovers")?,
        interrupted: row.try_get("interrupted")?,
        last_error: row.try_get("last_error")?,
        finished_at: parse_time_opt(row.try_get("finished_at")?)?,
        trace: trace_from_row(row)?,
        erased_at: parse_time_opt(row.try_get("erased_at")?)?,
    })
}

/// The trace context stored with the event (migration 0014), if any.
fn trace_from_row(row: &SqliteRow) -> Result<Option<TraceContext>, sqlx::Error> {
    Ok(TraceContext::from_columns(
        row.try_get("traceparent")?,
        row.try_get("tracestate")?,
    ))
}

fn status_from_row(row: &SqliteRow) -> Result<StepStatus, StoreError> {
    let state: String = row.try_get("state")?;
    let output: Option<String> = row.try_get("output")?;
    Ok(StepStatus {
        position: row.try_get("position")?,
        step: row.try_get("step")?,
        idempotency_key: row.try_get("idempotency_key")?,
        state: decode::state(&state, "step state")?,
        attempts: row.try_get("attempts")?,
        started_at: parse_time_opt(row.try_get("started_at")?)?,
        finished_at: parse_time_opt(row.try_get("finished_at")?)?,
        retry_at: parse_time_opt(row.try_get("retry_at")?)?,
        lease_until: parse_time_opt(row.try_get("lease_until")?)?,
        worker: row.try_get("worker")?,
        last_error: row.try_get("last_error")?,
        output: decode::json_opt(output, "step output")?,
        progress: row.try_get("progress")?,
        progress_message: row.try_get("progress_message")?,
    })
}

fn json_list(items: &[String]) -> Result<String, StoreError> {
    serde_json::to_string(items).map_err(|e| StoreError::Corrupt(format!("list: {e}")))
}

/// `duration` after `now` (the distant future if it overflows).
fn after(now: chrono::DateTime<Utc>, duration: Duration) -> chrono::DateTime<Utc> {
    now + chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}

impl tickmark_driver::store::unstable::StoreImplementation for SqliteStore {}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // Several processes may open a new file at once: they take turns
        // on the write lock (`migrate.rs`).
        migrate::run(&self.pool).await
    }

    async fn event_insert(&self, event: &EventInsert<'_>) -> Result<InsertOutcome, StoreError> {
        if let Some(debounce) = &event.debounce {
            return self.insert_debounced(event, debounce).await;
        }
        let outcome = self.inserts.try_submit(event.to_owned_insert()).await??;
        // A new event with match keys may have woken waiting ones.
        let may_wake = event.state == EventState::Pending || !event.match_keys.is_empty();
        if matches!(outcome, InsertOutcome::New(_)) && may_wake {
            self.wake_workers();
        }
        Ok(outcome)
    }

    async fn event_insert_in(
        &self,
        conn: AppConnection<'_>,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        match conn.inner {
            app_connection::Inner::Sqlite(conn) => self.insert_in(conn, event).await,
            #[allow(unreachable_patterns)] // without the postgres feature
            _ => Err(StoreError::NotInCallerTransaction(
                "a PostgreSQL connection was handed to the SQLite store: pass a transaction \
                 on the SQLite file the store uses"
                    .into(),
            )),
        }
    }

    async fn event_claim_many(
        &self,
        params: &ClaimParams<'_>,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        // Look before taking the write lock: an idle worker only reads.
        let now = format_time(self.clock.now());
        let skip_sources = json_list(params.skip_sources)?;
        let skip_kinds = json_list(params.skip_kinds)?;
        let any_due: Option<String> = sqlx::query_scalar(sql::EVENT_ANY_DUE)
            .bind(&now)
            .bind(i64::from(params.limit))
            .bind(&skip_sources)
            .bind(&skip_kinds)
            .bind(params.alone)
            .bind(params.pending)
            .fetch_optional(&self.pool)
            .await?;
        if any_due.is_none() {
            return Ok(Vec::new());
        }

        let (_turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let batch = i64::from(params.batch_limit());
        // A batch claim is fair while an unfinished event has a tenant
        // (`fair.rs`); a claim alone takes the oldest suspect.
        let binds = ClaimBinds {
            now: &format_time(now),
            batch,
            skip_sources: &skip_sources,
            skip_kinds: &skip_kinds,
            alone: params.alone,
            pending: params.pending,
        };
        let fair = !params.alone && fair::any_tenant(&mut tx).await?;
        let (due, fair_clock) = if fair {
            let (due, clock) = fair::choose(&mut tx, &binds).await?;
            (due, Some(clock))
        } else {
            (due_rows(&mut tx, sql::EVENT_DUE, &binds, None).await?, None)
        };
        let mut due = within_key_limits(due);
        due.truncate(usize::try_from(batch).unwrap_or(usize::MAX));
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let seqs: Vec<i64> = due.iter().map(|(seq, ..)| *seq).collect();
        let seqs_json = serde_json::to_string(&seqs)
            .map_err(|e| StoreError::Corrupt(format!("claim list: {e}")))?;
        let rows = sqlx::query(sql::EVENT_CLAIM)
            .bind(params.worker)
            .bind(format_time(after(now, params.lease_for)))
            .bind(format_time(now))
            .bind(seqs_json)
            .bind(params.alone)
            .fetch_all(&mut *tx)
            .await?;
        if let Some(clock) = fair_clock {
            // Every event chosen is claimed: the choice and the claim share
            // this write transaction.
            let tenants = due.iter().filter_map(|(_, _, tenant)| tenant.clone());
            fair::charge(&mut tx, tenants, clock).await?;
        }
        tx.commit().await?;

        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get("id")?;
                let took_over = due
                    .iter()
                    .any(|(due_seq, state, _)| *due_seq == seq && state == "running");
                Ok(ClaimedEvent {
                    event: event_from_row(row)?,
                    plan_json: row.try_get("plan")?,
                    next_step: row.try_get("next_step")?,
                    attempt: row.try_get("attempt")?,
                    interrupted: row.try_get("interrupted")?,
                    lease: Lease {
                        event_seq: seq,
                        token: row.try_get("lease_token")?,
                    },
                    took_over,
                    resource_key: row.try_get("resource_key")?,
                    resource_seq: row.try_get("resource_seq")?,
                    trace: trace_from_row(row)?,
                })
            })
            .collect()
    }

    async fn event_heartbeat_many(
        &self,
        leases: &[Lease],
        lease_for: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let pairs: Vec<[i64; 2]> = leases.iter().map(|l| [l.event_seq, l.token]).collect();
        let pairs_json = serde_json::to_string(&pairs)
            .map_err(|e| StoreError::Corrupt(format!("lease list: {e}")))?;
        let (_turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let held: Vec<i64> = sqlx::query_scalar(sql::EVENT_HEARTBEAT_MANY)
            .bind(format_time(after(now, lease_for)))
            .bind(format_time(now))
            .bind(pairs_json)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(held)
    }

    async fn event_release(&self, lease: &Lease, release: &Release<'_>) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let changed = sqlx::query(sql::EVENT_RELEASE)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(format_time(after(self.clock.now(), release.delay)))
            .bind(release.refund_attempt)
            .bind(release.snoozed)
            .bind(release.note)
            .bind(release.throttled_by)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        if changed > 0 {
            self.wake_workers();
        }
        decode::lease_kept(changed, lease)
    }

    async fn rate_take(&self, take: &RateTake<'_>) -> Result<RateTaken, StoreError> {
        let now_us = self.clock.now().timestamp_micros();
        let (refill_us, burst) = (take.refill_micros(), take.burst_tokens());
        let (_turn, mut tx) = self.begin_write().await?;
        let taken: Option<i64> = sqlx::query_scalar(sql::RATE_TAKE)
            .bind(take.bucket)
            .bind(now_us)
            .bind(refill_us)
            .bind(burst)
            .fetch_optional(&mut *tx)
            .await?;
        let answer = match taken {
            Some(_) => RateTaken::Granted,
            None => {
                let wake_in_us: Option<i64> = sqlx::query_scalar(sql::RATE_WAIT)
                    .bind(take.bucket)
                    .bind(now_us)
                    .bind(refill_us)
                    .bind(burst)
                    .fetch_optional(&mut *tx)
                    .await?;
                decode::rate_waiting(wake_in_us.unwrap_or(0))
            }
        };
        tx.commit().await?;
        Ok(answer)
    }

    async fn step_wait(&self, wait: &WaitStep<'_>) -> Result<WaitSettled, StoreError> {
        self.settle_wait(wait).await
    }

    async fn event_progress(
        &self,
        lease: &Lease,
        fraction: f32,
        message: &str,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let changed = sqlx::query(sql::EVENT_PROGRESS)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(fraction)
            .bind(message)
            .bind(format_time(self.clock.now()))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        decode::lease_kept(changed, lease)
    }

    async fn event_sequence_check(
        &self,
        lease: &Lease,
        resource_key: &str,
        resource_seq: i64,
    ) -> Result<SequenceCheck, StoreError> {
        let now = format_time(self.clock.now());
        let (_turn, mut tx) = self.begin_write().await?;
        let applied: Option<i64> = sqlx::query_scalar(sql::RESOURCE_APPLY)
            .bind(lease.event_seq)
            .bind(resource_key)
            .bind(resource_seq)
            .bind(&now)
            .bind(lease.token)
            .fetch_optional(&mut *tx)
            .await?;
        if applied.is_some() {
            tx.commit().await?;
            return Ok(SequenceCheck::Apply);
        }
        let last_seq: i64 = sqlx::query_scalar(sql::RESOURCE_LAST)
            .bind(resource_key)
            .fetch_optional(&mut *tx)
            .await?
            .unwrap_or(resource_seq);
        let changed = sqlx::query(sql::EVENT_MARK_STALE)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(decode::stale_reason(resource_key, resource_seq, last_seq))
            .bind(&now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        decode::lease_kept(changed, lease)?;
        Ok(SequenceCheck::Stale { last_seq })
    }

    async fn event_park(&self, lease: &Lease, reason: &str) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let changed = sqlx::query(sql::EVENT_PARK)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(reason)
            .bind(format_time(self.clock.now()))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        decode::lease_kept(changed, lease)
    }

    async fn event_next_due(&self) -> Result<Option<Duration>, StoreError> {
        let due: Option<String> = sqlx::query_scalar(sql::EVENT_NEXT_DUE)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match due {
            Some(text) => Some(
                (parse_time(&text)? - self.clock.now())
                    .to_std()
                    .unwrap_or(Duration::ZERO),
            ),
            None => None,
        })
    }

    async fn event_suspect_waits(&self) -> Result<Option<Duration>, StoreError> {
        // Asked as a claim alone of suspects would be: the same statement.
        let now = self.clock.now();
        let due: Option<String> = sqlx::query_scalar(sql::EVENT_SUSPECT_WAITS)
            .bind(format_time(now))
            .bind(1_i64)
            .bind("[]")
            .bind("[]")
            .bind(true)
            .bind(false)
            .fetch_optional(&self.pool)
            .await?;
        due.map(|text| {
            Ok((now - parse_time(&text)?)
                .to_std()
                .unwrap_or(Duration::ZERO))
        })
        .transpose()
    }

    async fn event_count_active(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(sql::EVENT_COUNT_ACTIVE)
            .bind(format_time(self.clock.now()))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn event_counts(&self) -> Result<EventCounts, StoreError> {
        let rows: Vec<(String, Option<String>, Option<String>, i64)> =
            sqlx::query_as(sql::EVENT_COUNT_BY_STATE)
                .fetch_all(&self.pool)
                .await?;
        let now = self.clock.now();
        let oldest: Option<String> = sqlx::query_scalar(sql::EVENT_OLDEST_PENDING)
            .bind(format_time(now))
            .fetch_one(&self.pool)
            .await?;
        Ok(EventCounts {
            by_state: decode::counts_by_state(&rows)?,
            superseded: decode::superseded_by_handler(&rows),
            oldest_pending_age: match oldest {
                Some(text) => Some(
                    (now - parse_time(&text)?)
                        .to_std()
                        .unwrap_or(Duration::ZERO),
                ),
                None => None,
            },
            stuck: sqlx::query_scalar(sql::EVENT_COUNT_STUCK)
                .bind(format_time(now))
                .fetch_one(&self.pool)
                .await?,
            waiting: sqlx::query_scalar(sql::EVENT_COUNT_WAITING)
                .fetch_one(&self.pool)
                .await?,
        })
    }

    async fn plans_unfinished(&self) -> Result<Vec<PlanGroup>, StoreError> {
        twin::plans_unfinished(&self.pool, sql::PLANS_UNFINISHED).await
    }

    async fn event_get(&self, event_seq: i64) -> Result<Option<EventRecord>, StoreError> {
        twin::event_get(&self.pool, sql::EVENT_GET, event_seq, record_from_row).await
    }

    async fn event_find(
        &self,
        source: &str,
        dedup_key: &str,
    ) -> Result<Option<EventRecord>, StoreError> {
        twin::event_find(
            &self.pool,
            sql::EVENT_FIND,
            source,
            dedup_key,
            record_from_row,
        )
        .await
    }

    async fn event_find_by_replay_key(
        &self,
        source: &str,
        replay_key: &str,
    ) -> Result<Option<EventRecord>, StoreError> {
        twin::event_find(
            &self.pool,
            sql::EVENT_FIND_BY_REPLAY_KEY,
            source,
            replay_key,
            record_from_row,
        )
        .await
    }

    async fn step_outputs(
        &self,
        event_seq: i64,
    ) -> Result<Vec<(i32, serde_json::Value)>, StoreError> {
        twin::step_outputs(&self.pool, sql::STEP_OUTPUTS, event_seq).await
    }

    async fn step_transaction_begin(&self) -> Result<StepTransaction, StoreError> {
        let (turn, transaction) = self.begin_write().await?;
        Ok(StepTransaction::sqlite_from(transaction, turn))
    }

    async fn step_mark_done(
        &self,
        mark: &MarkDone<'_>,
        transaction: Option<StepTransaction>,
    ) -> Result<(), StoreError> {
        let (transaction, turn) = match transaction.map(StepTransaction::into_inner) {
            Some(Inner::Sqlite {
                transaction,
                _write_turn,
            }) => (transaction, _write_turn),
            // The other backend's transaction (a driver built with both).
            #[allow(unreachable_patterns)]
            Some(_) => {
                return Err(StoreError::Corrupt(
                    "a PostgreSQL transaction was handed to the SQLite store".into(),
                ))
            }
            None if mark.skipped => {
                // A skipped branch is rare: its own transaction, not the batch.
                let (turn, transaction) = self.begin_write().await?;
                (transaction, turn)
            }
            None => {
                // Concurrent marks share one transaction: one fsync for all.
                if self.marks.submit(mark.to_owned_mark()).await?? {
                    return Ok(());
                }
                return self.confirm_mark(&mark.lease, mark.position, "done").await;
            }
        };
        let mut transaction = transaction;
        let applied = Self::mark_done_on(self.clock.now(), &mut transaction, mark).await?;
        if !applied {
            // Rolls back the step's own writes too, if it was transactional.
            transaction.rollback().await?;
            drop(turn);
            let state = if mark.skipped { "skipped" } else { "done" };
            return self.confirm_mark(&mark.lease, mark.position, state).await;
        }
        transaction.commit().await?;
        drop(turn);
        Ok(())
    }

    async fn step_mark_failed(&self, mark: &MarkFailed<'_>) -> Result<(), StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        if !Self::mark_failed_on(self.clock.now(), &mut tx, mark).await? {
            tx.rollback().await?;
            drop(turn);
            let state = match mark.then {
                AfterFailure::Dead => "dead",
                AfterFailure::RetryIn(_) => "failed",
            };
            return self.confirm_mark(&mark.lease, mark.position, state).await;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn step_status(&self, event_seq: i64) -> Result<Vec<StepStatus>, StoreError> {
        twin::event_rows(&self.pool, sql::STEP_STATUS, event_seq, status_from_row).await
    }

    async fn wakeups(&self) -> Result<Wakeups, StoreError> {
        Ok(Wakeups::local(self.accepted.subscribe()))
    }

    async fn reconcile_lease_take(
        &self,
        source: &str,
        owner: &str,
        lease_for: Duration,
    ) -> Result<Option<ReconcileLease>, StoreError> {
        self.take_reconcile_lease(source, owner, lease_for).await
    }

    async fn reconcile_cursor_advance(
        &self,
        lease: &ReconcileLease,
        cursor: &str,
        cursor_at: Option<DateTime<Utc>>,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        self.advance_reconcile_cursor(lease, cursor, cursor_at, lease_for)
            .await
    }

    async fn reconcile_lease_extend(
        &self,
        lease: &ReconcileLease,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        self.extend_reconcile_lease(lease, lease_for).await
    }

    async fn reconcile_lease_release(
        &self,
        lease: &ReconcileLease,
        summary: Option<&str>,
    ) -> Result<(), StoreError> {
        self.release_reconcile_lease(lease, summary).await
    }

    async fn reconcile_cursors(&self) -> Result<Vec<ReconcileCursor>, StoreError> {
        self.list_reconcile_cursors().await
    }

    async fn reconcile_cursor_reset(&self, source: &str) -> Result<bool, StoreError> {
        self.reset_reconcile_cursor(source).await
    }
}
