//! The PostgreSQL store: many worker processes on many machines share one
//! database. Claims use `FOR UPDATE SKIP LOCKED`; wake-ups use `LISTEN/NOTIFY`.
//! Times come from the database clock (`now()`), so machines' clocks may differ.

mod accept_lock;
mod admin;
mod admin_sql;
mod caller_transaction;
mod debounce;
mod failover;
mod hosts;
mod isolation;
mod migrate;
mod pooler;
mod privacy;
mod reconcile;
mod reconcile_sql;
mod sql;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::Row;

use hosts::{HostList, SessionAttrs};
pub use pooler::{PoolExecutor, Pooler};
use tickmark_driver::event::Event;
use tickmark_driver::store::group_commit::{copy_error, FlushFn, GroupCommit, Overlap};
use tickmark_driver::store::records::{OwnedEventInsert, OwnedMarkDone};
use tickmark_driver::store::transaction::Inner;
use tickmark_driver::store::twin;
use tickmark_driver::store::{
    app_connection, decode, AfterFailure, AppConnection, Backend, ClaimParams, ClaimedEvent,
    EventCounts, EventInsert, EventRecord, InsertOutcome, Lease, MarkDone, MarkFailed, PlanGroup,
    RateTake, RateTaken, ReconcileCursor, ReconcileLease, Release, SequenceCheck, StepStatus,
    StepTransaction, Store, StoreError, WaitSettled, WaitStep, Wakeups,
};
use tickmark_driver::trace_context::TraceContext;

/// Apply tickmark's schema on an application's pool (what `tickmark::migrate` does).
pub use migrate::run_on_pool as migrate_pool;

/// The newest schema migration this build applies (`migrations/postgres`). A
/// database that records a newer one was migrated by a newer tickmark, and
/// connecting to it fails with
/// [`MigrationError::NewerSchema`](tickmark_driver::store::migration::MigrationError::NewerSchema).
pub fn schema_version() -> i64 {
    tickmark_driver::store::migration::plan::newest(migrate::migrations())
}

/// Connection settings for [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Pool size per process.
    pub max_connections: u32,
    /// How long to wait for a pooled connection before reporting the database unavailable.
    pub acquire_timeout: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(2),
        }
    }
}

/// tickmark's tables in a PostgreSQL database (in the connection's `search_path` schema).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The pool, with how statements run on it (`pooler.rs`).
    db: PoolExecutor,
    /// Through a transaction pooler: where to `LISTEN`, if anywhere.
    listen: Listen,
    channel: String,
    marks: Arc<GroupCommit<OwnedMarkDone, Result<bool, StoreError>>>,
    inserts: Arc<GroupCommit<OwnedEventInsert, Result<InsertOutcome, StoreError>>>,
    /// With several hosts: keeps the pool on the primary (`failover.rs`).
    _follower: Option<failover::Follower>,
}

impl PostgresStore {
    /// Connect with default options and apply the schema.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connect and apply the schema.
    ///
    /// `url` may name several hosts, as libpq allows:
    /// `postgres://user@host1:5432,host2:5432/db?target_session_attrs=read-write`.
    /// The pool then uses the host that accepts writes, and moves to the new
    /// primary after a failover, without a restart (docs/failover.md).
    ///
    /// Through PgBouncer in transaction mode, add `pooler=transaction`, and
    /// for prompt wake-ups `listen_url=<a URL that bypasses the pooler,
    /// percent-encoded>` (docs/deploying.md, "PgBouncer, transaction mode").
    /// `pooler=session` is accepted and changes nothing.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let store = Self::open(url, options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Connect as [`connect_with`](Self::connect_with) does, but apply
    /// nothing: for a tool that only reads (`tickmark reconcile --status`,
    /// `--dry-run`), which must leave the schema as it finds it. Fails with
    /// a [`MigrationError`](tickmark_driver::store::migration::MigrationError) unless
    /// the database holds exactly this build's schema: none or an older one
    /// ([`Unmigrated`](tickmark_driver::store::migration::MigrationError::Unmigrated)),
    /// a newer tickmark's
    /// ([`NewerSchema`](tickmark_driver::store::migration::MigrationError::NewerSchema)).
    pub async fn connect_without_migrating(
        url: &str,
        options: PostgresOptions,
    ) -> Result<Self, StoreError> {
        let store = Self::open(url, options).await?;
        migrate::check_current(&store.db).await?;
        Ok(store)
    }

    /// Connect, the schema as it is.
    async fn open(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let list = HostList::parse(url)?;
        let pooler = list.pooler.unwrap_or_default();
        let listen_url = list.listen_url.clone();
        let mut pool_options = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout);
        if pooler.per_transaction() {
            if list.hosts.len() > 1 || list.attrs != SessionAttrs::Any {
                return Err(StoreError::Database(sqlx::Error::Configuration(
                    "pooler=transaction takes the pooler's one address, without \
                     target_session_attrs: following the primary is the pooler's job there"
                        .into(),
                )));
            }
        } else {
            if listen_url.is_some() {
                return Err(StoreError::Database(sqlx::Error::Configuration(
                    "listen_url is for pooler=transaction: without it the store listens on \
                     its own connections"
                        .into(),
                )));
            }
            // READ COMMITTED whatever the role's default (`isolation.rs`);
            // through a transaction pooler a session setting would not stick,
            // and every statement runs in a transaction that sets it.
            pool_options = pool_options.after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::Executor::execute(conn, isolation::SESSION_DEFAULT).await?;
                    Ok(())
                })
            });
        }
        let (pool, follower) = failover::connect(list, pool_options, pooler).await?;
        let db = PoolExecutor::new(pool.clone(), pooler);
        let listen = match (pooler.per_transaction(), listen_url) {
            (false, _) => Listen::Pool,
            (true, Some(url)) => Listen::Direct(url),
            (true, None) => Listen::Nowhere,
        };
        Self::on(pool, db, listen, follower).await
    }

    /// A store on the application's own pool: no pool of tickmark's, and
    /// **no migration** — call `tickmark::migrate(&pool)`
    /// first (beside the application's own `sqlx::migrate!`, in either
    /// order), or run `tickmark migrate` in a deploy step.
    ///
    /// Fails with a [`MigrationError`](tickmark_driver::store::migration::MigrationError)
    /// unless the database holds exactly this build's schema (in the pool's
    /// `current_schema()`): none or an older one
    /// ([`Unmigrated`](tickmark_driver::store::migration::MigrationError::Unmigrated)),
    /// a newer tickmark's
    /// ([`NewerSchema`](tickmark_driver::store::migration::MigrationError::NewerSchema)).
    ///
    /// What tickmark's own pool sets on each connection, the application's
    /// pool must have ([`StoreError::UnsuitablePool`] names the setting and
    /// the fix, checked on one connection): `default_transaction_isolation`
    /// = `read committed`, PostgreSQL's default (tickmark's transactions say
    /// READ COMMITTED themselves; its statements alone rely on the default:
    /// `isolation.rs`). A pool in front of PgBouncer in transaction mode is
    /// not supported here: use [`connect_with`](Self::connect_with) with
    /// `pooler=transaction`.
    ///
    /// Pool size: the workers' `LISTEN` keeps one connection of the pool
    /// for as long as they run (`Store::wakeups`), and each worker's claims,
    /// marks and heartbeats, and each accept, take one for a statement; size
    /// the pool for the application's own use plus one for the listener and
    /// a few for tickmark (docs/deploying.md, "On the application's pool").
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        let db = PoolExecutor::new(pool.clone(), Pooler::None);
        isolation::check_pool_default(&pool).await?;
        migrate::check_current(&db).await?;
        Self::on(pool, db, Listen::Pool, None).await
    }

    /// The store on `pool`, statements through `db`, wake-ups on `listen`.
    async fn on(
        pool: PgPool,
        db: PoolExecutor,
        listen: Listen,
        follower: Option<failover::Follower>,
    ) -> Result<Self, StoreError> {
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&db)
            .await?;
        // One channel per schema, so that schemas sharing a database (tests,
        // tenants) do not wake each other's workers.
        let channel = format!("tickmark:{schema}");
        Ok(Self {
            inserts: Arc::new(GroupCommit::start(
                INSERT_FLUSHERS,
                Overlap::SideBySide,
                MAX_INSERT_BATCH,
                INSERT_QUEUE,
                insert_many(db.clone(), channel.clone()),
            )),
            marks: Arc::new(GroupCommit::start(
                MARK_FLUSHERS,
                Overlap::OneAtATime {
                    stall_after: MARK_STALL,
                },
                MAX_MARK_BATCH,
                MARK_QUEUE,
                mark_many(db.clone()),
            )),
            pool,
            db,
            listen,
            channel,
            _follower: follower,
        })
    }

    /// The pool, for the application's own queries on the same database.
    /// Through a transaction pooler (`pooler=transaction`) use
    /// [`executor`](Self::executor) instead: sqlx's statements on the bare
    /// pool break there.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The pool as an executor that is also safe through a transaction
    /// pooler (each statement alone in a transaction, `begin` for more):
    /// for the application's own queries on the same database.
    pub fn executor(&self) -> &PoolExecutor {
        &self.db
    }

    /// Mark `lease`'s step done on `conn` (the caller commits).
    async fn mark_done_on<'c>(
        conn: impl sqlx::Executor<'c, Database = sqlx::Postgres>,
        mark: &MarkDone<'_>,
    ) -> Result<u64, StoreError> {
        let result = sqlx::query(sql::STEP_MARK_DONE)
            .bind(mark.lease.event_seq)
            .bind(mark.lease.token)
            .bind(mark.position)
            .bind(mark.step)
            .bind(mark.attempt)
            .bind(mark.started_at)
            .bind(mark.finished_at)
            .bind(mark.output_json)
            .bind(mark.skipped)
            .execute(conn)
            .await?;
        Ok(result.rows_affected())
    }

    /// Record a failed attempt of `lease`'s step on `conn` (the caller commits).
    async fn mark_failed_on<'c>(
        conn: impl sqlx::Executor<'c, Database = sqlx::Postgres>,
        mark: &MarkFailed<'_>,
    ) -> Result<u64, StoreError> {
        let (dead, retry_in) = match mark.then {
            AfterFailure::RetryIn(delay) => (false, delay),
            AfterFailure::Dead => (true, Duration::ZERO),
        };
        let result = sqlx::query(sql::STEP_MARK_FAILED)
            .bind(mark.lease.event_seq)
            .bind(mark.lease.token)
            .bind(mark.position)
            .bind(mark.step)
            .bind(mark.attempt)
            .bind(mark.started_at)
            .bind(mark.finished_at)
            .bind(mark.error)
            .bind(dead)
            .bind(seconds(retry_in))
            .execute(conn)
            .await?;
        Ok(result.rows_affected())
    }

    /// After a mark changed nothing: was it already applied under this token (a
    /// retried commit whose first answer was lost), or was the lease lost?
    async fn confirm_mark(
        &self,
        lease: &Lease,
        position: i32,
        state: &str,
    ) -> Result<(), StoreError> {
        twin::step_mark_confirm(&self.db, sql::STEP_MARK_CONFIRM, lease, position, state).await
    }
}

/// Where the store `LISTEN`s for accepted events.
#[derive(Debug, Clone)]
enum Listen {
    /// On a connection of the pool (a direct connection, or a session pooler).
    Pool,
    /// Through a transaction pooler: on a connection of its own to this URL,
    /// which bypasses the pooler.
    Direct(String),
    /// Through a transaction pooler without a `listen_url`: nowhere; the
    /// workers poll (`WorkerConfig::poll_every`).
    Nowhere,
}

/// Concurrent accepts share a commit (and one NOTIFY).
const INSERT_FLUSHERS: usize = 2;
/// Most events in one insert.
const MAX_INSERT_BATCH: usize = 256;
/// Most accepts waiting for an insert; beyond it an accept is refused at once
/// (`StoreError::Overloaded`, a 503 from the receiver).
const INSERT_QUEUE: usize = 2 * MAX_INSERT_BATCH;

/// Insert a batch of events in one statement, then undo those a tombstone
/// refuses, in one transaction; each answer is New or Duplicate, or
/// AcceptInProgress for an event whose key an open caller's transaction
/// holds (left out of the insert: `accept_lock.rs`).
fn insert_many(
    db: PoolExecutor,
    channel: String,
) -> FlushFn<OwnedEventInsert, Result<InsertOutcome, StoreError>> {
    Arc::new(move |events: Vec<OwnedEventInsert>| {
        let db = db.clone();
        let channel = channel.clone();
        Box::pin(async move {
            // Sorted by key: concurrent batches wait on the unique index in one order.
            let mut order: Vec<usize> = (0..events.len()).collect();
            order.sort_by(|&a, &b| {
                (&events[a].source, &events[a].dedup_key)
                    .cmp(&(&events[b].source, &events[b].dedup_key))
            });
            let sorted: Vec<&OwnedEventInsert> = order.iter().map(|&i| &events[i]).collect();
            let result = async {
                let mut tx = db.begin().await?;
                // Keys held by an open caller's transaction wait for no one
                // (`accept_lock.rs`): left out, answered AcceptInProgress.
                let free = accept_lock::try_shared(
                    &mut tx,
                    sorted.iter().map(|e| {
                        (
                            e.source.as_str(),
                            e.dedup_key.as_str(),
                            e.replay_key.as_deref(),
                        )
                    }),
                )
                .await?;
                let held: std::collections::HashSet<usize> = order
                    .iter()
                    .zip(&free)
                    .filter(|(_, free)| !**free)
                    .map(|(&i, _)| i)
                    .collect();
                let rows: Vec<&OwnedEventInsert> = sorted
                    .iter()
                    .zip(&free)
                    .filter(|(_, free)| **free)
                    .map(|(e, _)| *e)
                    .collect();
                if rows.is_empty() {
                    tx.commit().await?;
                    return Ok::<_, StoreError>((Vec::new(), held));
                }
                let mut inserted: Vec<(i64, String, String)> =
                    sqlx::query_as(sql::EVENT_INSERT_MANY)
                        .bind(rows.iter().map(|e| e.source.as_str()).collect::<Vec<_>>())
                        .bind(
                            rows.iter()
                                .map(|e| e.dedup_key.as_str())
                                .collect::<Vec<_>>(),
                        )
                        .bind(rows.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>())
                        .bind(
                            rows.iter()
                                .map(|e| e.payload_json.as_str())
                                .collect::<Vec<_>>(),
                        )
                        .bind(
                            rows.iter()
                                .map(|e| e.plan_json.as_str())
                                .collect::<Vec<_>>(),
                        )
                        .bind(rows.iter().map(|e| e.state.as_str()).collect::<Vec<_>>())
                        .bind(rows.iter().map(|e| e.step_count).collect::<Vec<_>>())
                        .bind(rows.iter().map(|e| e.not_before).collect::<Vec<_>>())
                        .bind(
                            rows.iter()
                                .map(|e| e.resource_key.as_deref())
                                .collect::<Vec<_>>(),
                        )
                        .bind(rows.iter().map(|e| e.resource_seq).collect::<Vec<_>>())
                        .bind(&channel)
                        .bind(
                            rows.iter()
                                .map(|e| e.replay_key.as_deref())
                                .collect::<Vec<_>>(),
                        )
                        .bind(
                            rows.iter()
                                .map(|e| e.limit_key.as_deref())
                                .collect::<Vec<_>>(),
                        )
                        .bind(rows.iter().map(|e| e.limit_n).collect::<Vec<_>>())
                        .bind(
                            rows.iter()
                                .map(|e| e.tenant_key.as_deref())
                                .collect::<Vec<_>>(),
                        )
                        .bind(rows.iter().map(|e| e.head_start_ms).collect::<Vec<_>>())
                        .bind(
                            rows.iter()
                                .map(|e| e.trace.as_ref().map(TraceContext::traceparent))
                                .collect::<Vec<_>>(),
                        )
                        .bind(
                            rows.iter()
                                .map(|e| e.trace.as_ref().and_then(TraceContext::tracestate))
                                .collect::<Vec<_>>(),
                        )
                        .bind(
                            rows.iter()
                                .map(|e| e.subjects.as_deref())
                                .collect::<Vec<_>>(),
                        )
                        .fetch_all(&mut *tx)
                        .await?;
                let refused = undo_tombstoned(&mut tx, inserted.iter().map(|(id, ..)| *id)).await?;
                inserted.retain(|(id, ..)| !refused.contains(id));
                tx.commit().await?;
                Ok((inserted, held))
            }
            .await;
            match result {
                Ok((inserted, held)) => {
                    // A key inserted by this batch is New for its first
                    // occurrence; a repeat within the batch is a Duplicate.
                    let mut new: std::collections::HashMap<(&str, &str), i64> = inserted
                        .iter()
                        .map(|(id, source, key)| ((source.as_str(), key.as_str()), *id))
                        .collect();
                    events
                        .iter()
                        .enumerate()
                        .map(|(i, e)| {
                            if held.contains(&i) {
                                return Err(StoreError::AcceptInProgress);
                            }
                            Ok(
                                match new.remove(&(e.source.as_str(), e.dedup_key.as_str())) {
                                    Some(seq) => InsertOutcome::New(seq),
                                    None => InsertOutcome::Duplicate,
                                },
                            )
                        })
                        .collect()
                }
                Err(error) => events.iter().map(|_| Err(copy_error(&error))).collect(),
            }
        })
    })
}

/// Delete, in `tx`, the events of `inserted` whose keys have tombstones
/// (accepted before, then pruned); their ids. An accept answers each of
/// them Duplicate.
async fn undo_tombstoned(
    tx: &mut sqlx::PgConnection,
    inserted: impl Iterator<Item = i64>,
) -> Result<Vec<i64>, StoreError> {
    let inserted: Vec<i64> = inserted.collect();
    if inserted.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar(sql::TOMBSTONED_UNDO)
        .bind(&inserted)
        .fetch_all(tx)
        .await?)
}

/// Concurrent marks share a commit, one batch at a time: the marks that
/// arrive while a batch is being written wait for it and go together in the
/// next one. Flushers writing side by side wrote smaller batches, and on two
/// cores the extra statements cost more than the wait they saved (1 no-op
/// step at concurrency 16: ~7,000 events/s one at a time, ~5,100 with two
/// side by side, ~4,200 with three; at 256 level; docs/performance.md).
/// Three flushers still, so a batch stuck on a row lock (an operator's
/// transaction, say) holds up the others for [`MARK_STALL`] and no longer.
const MARK_FLUSHERS: usize = 3;
/// How long a mark batch in flight may hold up the next one.
const MARK_STALL: Duration = Duration::from_millis(20);
/// Most marks in one statement.
const MAX_MARK_BATCH: usize = 512;
/// Most marks waiting for a statement; beyond it a mark waits for room.
const MARK_QUEUE: usize = 4 * MAX_MARK_BATCH;

/// Write a batch of marks in one statement; each answer says whether that
/// mark was applied (false: its lease was not held — the caller checks why).
fn mark_many(db: PoolExecutor) -> FlushFn<OwnedMarkDone, Result<bool, StoreError>> {
    Arc::new(move |mut marks: Vec<OwnedMarkDone>| {
        let db = db.clone();
        Box::pin(async move {
            // One lock order for every batch: by event.
            let mut order: Vec<usize> = (0..marks.len()).collect();
            order.sort_by_key(|&i| marks[i].lease.event_seq);
            let sorted: Vec<&OwnedMarkDone> = order.iter().map(|&i| &marks[i]).collect();
            let result: Result<Vec<i64>, sqlx::Error> =
                sqlx::query_scalar(sql::STEP_MARK_DONE_MANY)
                    .bind(sorted.iter().map(|m| m.lease.event_seq).collect::<Vec<_>>())
                    .bind(sorted.iter().map(|m| m.lease.token).collect::<Vec<_>>())
                    .bind(sorted.iter().map(|m| m.position).collect::<Vec<_>>())
                    .bind(sorted.iter().map(|m| m.step.as_str()).collect::<Vec<_>>())
                    .bind(sorted.iter().map(|m| m.attempt).collect::<Vec<_>>())
                    .bind(sorted.iter().map(|m| m.started_at).collect::<Vec<_>>())
                    .bind(sorted.iter().map(|m| m.finished_at).collect::<Vec<_>>())
                    .bind(
                        sorted
                            .iter()
                            .map(|m| m.output_json.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .fetch_all(&db)
                    .await;
            match result {
                Ok(applied) => marks
                    .drain(..)
                    .map(|m| Ok(applied.contains(&m.lease.event_seq)))
                    .collect(),
                Err(error) => {
                    let error = StoreError::from(error);
                    marks.iter().map(|_| Err(copy_error(&error))).collect()
                }
            }
        })
    })
}

fn event_from_row(row: &PgRow) -> Result<Event, sqlx::Error> {
    let payload: String = row.try_get("payload")?;
    Ok(Event {
        seq: row.try_get("id")?,
        source: row.try_get("source")?,
        id: row.try_get("dedup_key")?,
        kind: row.try_get("kind")?,
        payload: serde_json::from_str(&payload).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        received_at: row.try_get("received_at")?,
    })
}

fn record_from_row(row: &PgRow) -> Result<EventRecord, StoreError> {
    let state: String = row.try_get("state")?;
    Ok(EventRecord {
        event: event_from_row(row)?,
        state: decode::state(&state, "event state")?,
        step_count: row.try_get("step_count")?,
        next_step: row.try_get("next_step")?,
        attempt: row.try_get("attempt")?,
        due_at: row.try_get("due_at")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_token: row.try_get("lease_token")?,
        takeovers: row.try_get("takeovers")?,
        interrupted: row.try_get("interrupted")?,
        last_error: row.try_get("last_error")?,
        finished_at: row.try_get("finished_at")?,
        trace: trace_from_row(row)?,
        erased_at: row.try_get("erased_at")?,
    })
}

/// The trace context stored with the event (migration 0020), if any.
fn trace_from_row(row: &PgRow) -> Result<Option<TraceContext>, sqlx::Error> {
    Ok(TraceContext::from_columns(
        row.try_get("traceparent")?,
        row.try_get("tracestate")?,
    ))
}

fn status_from_row(row: &PgRow) -> Result<StepStatus, StoreError> {
    let state: String = row.try_get("state")?;
    let output: Option<String> = row.try_get("output")?;
    Ok(StepStatus {
        position: row.try_get("position")?,
        step: row.try_get("step")?,
        idempotency_key: row.try_get("idempotency_key")?,
        state: decode::state(&state, "step state")?,
        attempts: row.try_get("attempts")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        retry_at: row.try_get("retry_at")?,
        lease_until: row.try_get("lease_until")?,
        worker: row.try_get("worker")?,
        last_error: row.try_get("last_error")?,
        output: decode::json_opt(output, "step output")?,
        progress: row.try_get("progress")?,
        progress_message: row.try_get("progress_message")?,
    })
}

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

impl tickmark_driver::store::unstable::StoreImplementation for PostgresStore {}

#[async_trait::async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // In one transaction under a lock of its own (`migrate.rs`).
        migrate::run(&self.db).await
    }

    async fn event_insert(&self, event: &EventInsert<'_>) -> Result<InsertOutcome, StoreError> {
        match &event.debounce {
            Some(debounce) => self.insert_debounced(event, debounce).await,
            None if !event.match_keys.is_empty() => self.insert_matchable(event).await,
            None => self.inserts.try_submit(event.to_owned_insert()).await?,
        }
    }

    async fn event_insert_in(
        &self,
        conn: AppConnection<'_>,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        match conn.inner {
            app_connection::Inner::Postgres(conn) => self.insert_in(conn, event).await,
            #[allow(unreachable_patterns)] // without the sqlite feature
            _ => Err(StoreError::NotInCallerTransaction(
                "a SQLite connection was handed to the PostgreSQL store: pass a transaction \
                 on the PostgreSQL database the store uses"
                    .into(),
            )),
        }
    }

    async fn event_claim_many(
        &self,
        params: &ClaimParams<'_>,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let rows = sqlx::query(sql::EVENT_CLAIM_MANY)
            .bind(params.worker)
            .bind(i64::from(params.batch_limit()))
            .bind(seconds(params.lease_for))
            .bind(params.skip_sources)
            .bind(params.skip_kinds)
            .bind(params.alone)
            .bind(params.pending)
            .fetch_all(&self.db)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ClaimedEvent {
                    event: event_from_row(row)?,
                    plan_json: row.try_get("plan")?,
                    next_step: row.try_get("next_step")?,
                    attempt: row.try_get("attempt")?,
                    interrupted: row.try_get("interrupted")?,
                    lease: Lease {
                        event_seq: row.try_get("id")?,
                        token: row.try_get("lease_token")?,
                    },
                    took_over: row.try_get("took_over")?,
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
        // The mark batches' lock order, by event: a heartbeat that locked
        // the same rows in the lease book's order deadlocked with them (seen
        // by the fleet benchmark: 47 `deadlock detected` in 8 runs, a second
        // lost to the deadlock timeout each).
        let mut sorted: Vec<&Lease> = leases.iter().collect();
        sorted.sort_by_key(|lease| lease.event_seq);
        let seqs: Vec<i64> = sorted.iter().map(|l| l.event_seq).collect();
        let tokens: Vec<i64> = sorted.iter().map(|l| l.token).collect();
        Ok(sqlx::query_scalar(sql::EVENT_HEARTBEAT_MANY)
            .bind(&seqs)
            .bind(&tokens)
            .bind(seconds(lease_for))
            .fetch_all(&self.db)
            .await?)
    }

    async fn event_release(&self, lease: &Lease, release: &Release<'_>) -> Result<(), StoreError> {
        let result = sqlx::query(sql::EVENT_RELEASE)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(&self.channel)
            .bind(release.refund_attempt)
            .bind(seconds(release.delay))
            .bind(release.snoozed)
            .bind(release.note)
            .bind(release.throttled_by)
            .execute(&self.db)
            .await?;
        decode::lease_kept(result.rows_affected(), lease)
    }

    async fn rate_take(&self, take: &RateTake<'_>) -> Result<RateTaken, StoreError> {
        let (refill_us, burst) = (take.refill_micros(), take.burst_tokens());
        let taken: Option<i64> = sqlx::query_scalar(sql::RATE_TAKE)
            .bind(take.bucket)
            .bind(refill_us)
            .bind(burst)
            .fetch_optional(&self.db)
            .await?;
        if taken.is_some() {
            return Ok(RateTaken::Granted);
        }
        let wake_in_us: Option<i64> = sqlx::query_scalar(sql::RATE_WAIT)
            .bind(take.bucket)
            .bind(refill_us)
            .bind(burst)
            .fetch_optional(&self.db)
            .await?;
        Ok(decode::rate_waiting(wake_in_us.unwrap_or(0)))
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
        let result = sqlx::query(sql::EVENT_PROGRESS)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(fraction)
            .bind(message)
            .execute(&self.db)
            .await?;
        decode::lease_kept(result.rows_affected(), lease)
    }

    async fn event_sequence_check(
        &self,
        lease: &Lease,
        resource_key: &str,
        resource_seq: i64,
    ) -> Result<SequenceCheck, StoreError> {
        let (applied, last_seq): (i64, Option<i64>) = sqlx::query_as(sql::RESOURCE_APPLY)
            .bind(lease.event_seq)
            .bind(resource_key)
            .bind(resource_seq)
            .bind(lease.token)
            .fetch_one(&self.db)
            .await?;
        if applied > 0 {
            return Ok(SequenceCheck::Apply);
        }
        let last_seq = last_seq.unwrap_or(resource_seq);
        let reason = decode::stale_reason(resource_key, resource_seq, last_seq);
        let result = sqlx::query(sql::EVENT_MARK_STALE)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(reason)
            .execute(&self.db)
            .await?;
        decode::lease_kept(result.rows_affected(), lease)?;
        Ok(SequenceCheck::Stale { last_seq })
    }

    async fn event_park(&self, lease: &Lease, reason: &str) -> Result<(), StoreError> {
        let result = sqlx::query(sql::EVENT_PARK)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(reason)
            .execute(&self.db)
            .await?;
        decode::lease_kept(result.rows_affected(), lease)
    }

    async fn event_next_due(&self) -> Result<Option<Duration>, StoreError> {
        let seconds: Option<f64> = sqlx::query_scalar(sql::EVENT_NEXT_DUE)
            .fetch_optional(&self.db)
            .await?;
        Ok(seconds.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }

    async fn event_suspect_waits(&self) -> Result<Option<Duration>, StoreError> {
        let seconds: Option<f64> = sqlx::query_scalar(sql::EVENT_SUSPECT_WAITS)
            .fetch_optional(&self.db)
            .await?;
        Ok(seconds.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }

    async fn event_count_active(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(sql::EVENT_COUNT_ACTIVE)
            .fetch_one(&self.db)
            .await?)
    }

    async fn event_counts(&self) -> Result<EventCounts, StoreError> {
        let rows: Vec<(String, Option<String>, Option<String>, i64)> =
            sqlx::query_as(sql::EVENT_COUNT_BY_STATE)
                .fetch_all(&self.db)
                .await?;
        let age: Option<f64> = sqlx::query_scalar(sql::EVENT_OLDEST_PENDING_AGE)
            .fetch_one(&self.db)
            .await?;
        Ok(EventCounts {
            by_state: decode::counts_by_state(&rows)?,
            superseded: decode::superseded_by_handler(&rows),
            oldest_pending_age: age.map(|s| Duration::from_secs_f64(s.max(0.0))),
            stuck: sqlx::query_scalar(sql::EVENT_COUNT_STUCK)
                .fetch_one(&self.db)
                .await?,
            waiting: sqlx::query_scalar(sql::EVENT_COUNT_WAITING)
                .fetch_one(&self.db)
                .await?,
        })
    }

    async fn plans_unfinished(&self) -> Result<Vec<PlanGroup>, StoreError> {
        twin::plans_unfinished(&self.db, sql::PLANS_UNFINISHED).await
    }

    async fn event_get(&self, event_seq: i64) -> Result<Option<EventRecord>, StoreError> {
        twin::event_get(&self.db, sql::EVENT_GET, event_seq, record_from_row).await
    }

    async fn event_find(
        &self,
        source: &str,
        dedup_key: &str,
    ) -> Result<Option<EventRecord>, StoreError> {
        twin::event_find(
            &self.db,
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
            &self.db,
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
        twin::step_outputs(&self.db, sql::STEP_OUTPUTS, event_seq).await
    }

    async fn step_transaction_begin(&self) -> Result<StepTransaction, StoreError> {
        Ok(StepTransaction::postgres_from(self.db.begin().await?))
    }

    async fn step_mark_done(
        &self,
        mark: &MarkDone<'_>,
        transaction: Option<StepTransaction>,
    ) -> Result<(), StoreError> {
        let changed = match transaction.map(StepTransaction::into_inner) {
            Some(Inner::Postgres(mut transaction)) => {
                let changed = Self::mark_done_on(&mut *transaction, mark).await?;
                if changed == 0 {
                    // Dropping the transaction rolls the step's writes back.
                    return Err(StoreError::LeaseLost {
                        event_seq: mark.lease.event_seq,
                    });
                }
                transaction.commit().await?;
                changed
            }
            // The other backend's transaction (a driver built with both).
            #[allow(unreachable_patterns)]
            Some(_) => {
                return Err(StoreError::Corrupt(
                    "a SQLite transaction was handed to the PostgreSQL store".into(),
                ))
            }
            // A skipped branch is rare: its own statement, not the batch.
            None if mark.skipped => Self::mark_done_on(&self.db, mark).await?,
            None => u64::from(self.marks.submit(mark.to_owned_mark()).await??),
        };
        if changed == 0 {
            let state = if mark.skipped { "skipped" } else { "done" };
            return self.confirm_mark(&mark.lease, mark.position, state).await;
        }
        Ok(())
    }

    async fn step_mark_failed(&self, mark: &MarkFailed<'_>) -> Result<(), StoreError> {
        if Self::mark_failed_on(&self.db, mark).await? == 0 {
            let state = match mark.then {
                AfterFailure::Dead => "dead",
                AfterFailure::RetryIn(_) => "failed",
            };
            return self.confirm_mark(&mark.lease, mark.position, state).await;
        }
        Ok(())
    }

    async fn step_status(&self, event_seq: i64) -> Result<Vec<StepStatus>, StoreError> {
        twin::event_rows(&self.db, sql::STEP_STATUS, event_seq, status_from_row).await
    }

    async fn wakeups(&self) -> Result<Wakeups, StoreError> {
        let mut listener = match &self.listen {
            Listen::Pool => PgListener::connect_with(&self.pool).await?,
            Listen::Direct(url) => PgListener::connect(url).await?,
            Listen::Nowhere => return Ok(Wakeups::none()),
        };
        listener.listen(&self.channel).await?;
        Ok(Wakeups::postgres(listener))
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
