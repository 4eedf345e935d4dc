//! Twins: the store methods both backends run as the same statement shape,
//! written once, generic over [`sqlx::Database`] (as sqlx writes the code its
//! drivers share).
//!
//! A method is a twin when, in the two backends, it binds the same values in
//! the same order, runs one kind of fetch, and makes the same record of what
//! comes back: only the executor's type differs, and the SQL text by its
//! dialect (`payload::text` against `payload`, `$1` against `?1`). Each
//! function here takes that text from its backend's `sql.rs` (the SQL stays
//! per dialect, so each backend's statements read in one place), and the
//! backend's method calls it: `twin::event_get(&self.db, sql::EVENT_GET,
//! event_seq, record_from_row)`.
//!
//! What stays per dialect, and why:
//! - **Anything that reads the time.** PostgreSQL asks the database clock
//!   (`now()` in the SQL); SQLite binds the store's [`Clock`](super::Clock)
//!   as text, so its statements take one more parameter (the due times,
//!   counts of stuck events, key holders, `since` filters, reconcile leases).
//! - **Every write.** SQLite takes the process's write turn and the file's
//!   write lock (`BEGIN IMMEDIATE`) around it, and wakes its own workers;
//!   PostgreSQL runs one statement, fenced, and `NOTIFY`s. The transitions
//!   (claim, heartbeat, release, marks, park, progress, sequence check, rate
//!   take, waits, debounce, operator transitions, prunes) differ in their
//!   transactions, not only in their SQL.
//! - **Reading a row's times.** A PostgreSQL `timestamptz` decodes as a
//!   time; SQLite keeps fixed-width text, parsed by the SQLite store. So the
//!   row decoders (`record_from_row`, `status_from_row`, …) stay per
//!   dialect and are handed in as `decode`; the twins share the statement
//!   around them. (They differ in one more way: an event's payload that is
//!   not JSON is a decode error of sqlx's on PostgreSQL, and
//!   [`StoreError::Corrupt`] on SQLite.)

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::admin::{EventSnapshot, TransitionError};
use super::{decode, EventRecord, Lease, PlanGroup, ReconcileCursor, StoreError};

/// A backend's row decoder: one row into one record.
pub type Decode<DB, T> = fn(&<DB as Database>::Row) -> Result<T, StoreError>;

/// One event by its row number ([`Store::event_get`](super::Store::event_get)).
pub async fn event_get<'c, DB, E>(
    db: E,
    sql: &'static str,
    event_seq: i64,
    decode: Decode<DB, EventRecord>,
) -> Result<Option<EventRecord>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(event_seq)
        .fetch_optional(db)
        .await?
        .as_ref()
        .map(decode)
        .transpose()
}

/// One event by a pair of keys: (source, dedup key) for
/// [`Store::event_find`](super::Store::event_find), (source, replay key) for
/// [`Store::event_find_by_replay_key`](super::Store::event_find_by_replay_key).
pub async fn event_find<'c, DB, E>(
    db: E,
    sql: &'static str,
    source: &str,
    key: &str,
    decode: Decode<DB, EventRecord>,
) -> Result<Option<EventRecord>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(source)
        .bind(key)
        .fetch_optional(db)
        .await?
        .as_ref()
        .map(decode)
        .transpose()
}

/// Events by operator input ([`Admin::event_lookup`](super::admin::Admin::event_lookup)):
/// the row number `id` names, if it is one (and of `source`, when given),
/// else the events whose dedup key is `id`. `get_sql` is the backend's
/// [`event_get`] statement; `by_key_sql` takes the key and the source (NULL:
/// any).
pub async fn event_lookup<'c, DB, E>(
    db: E,
    get_sql: &'static str,
    by_key_sql: &'static str,
    id: &str,
    source: Option<&str>,
    decode: Decode<DB, EventRecord>,
) -> Result<Vec<EventRecord>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB> + Copy,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    if let Some(seq) = decode::row_number(id) {
        if let Some(record) = event_get(db, get_sql, seq, decode).await? {
            if source.is_none_or(|source| source == record.event.source) {
                return Ok(vec![record]);
            }
        }
    }
    sqlx::query(by_key_sql)
        .bind(id)
        .bind(source)
        .fetch_all(db)
        .await?
        .iter()
        .map(decode)
        .collect()
}

/// The distinct plans of unfinished events
/// ([`Store::plans_unfinished`](super::Store::plans_unfinished)).
pub async fn plans_unfinished<'c, DB, E>(
    db: E,
    sql: &'static str,
) -> Result<Vec<PlanGroup>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'r> (String, i64, i64): FromRow<'r, DB::Row>,
{
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(sql).fetch_all(db).await?;
    Ok(rows
        .into_iter()
        .map(|(plan_json, events, example_seq)| PlanGroup {
            plan_json,
            events,
            example_seq,
        })
        .collect())
}

/// The stored plan of one event, as JSON
/// ([`Admin::event_plan`](super::admin::Admin::event_plan)).
pub async fn event_plan<'c, DB, E>(
    db: E,
    sql: &'static str,
    event_seq: i64,
) -> Result<Option<serde_json::Value>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let plan: Option<String> = sqlx::query_scalar(sql)
        .bind(event_seq)
        .fetch_optional(db)
        .await?;
    plan.map(|plan| decode::json(&plan, "stored plan"))
        .transpose()
}

/// The outputs of an event's done and skipped steps, by position
/// ([`Store::step_outputs`](super::Store::step_outputs)).
pub async fn step_outputs<'c, DB, E>(
    db: E,
    sql: &'static str,
    event_seq: i64,
) -> Result<Vec<(i32, serde_json::Value)>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (i32, Option<String>): FromRow<'r, DB::Row>,
{
    let rows: Vec<(i32, Option<String>)> =
        sqlx::query_as(sql).bind(event_seq).fetch_all(db).await?;
    decode::outputs(rows)
}

/// After a mark changed nothing: was it applied already under this token
/// (a retried commit whose first answer was lost), or was the lease lost?
/// `sql` selects a row when step `position` of `lease`'s event is in
/// `state` under the lease's token, and that token is still the event's.
pub async fn step_mark_confirm<'c, DB, E>(
    db: E,
    sql: &'static str,
    lease: &Lease,
    position: i32,
    state: &str,
) -> Result<(), StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    let applied = sqlx::query(sql)
        .bind(lease.event_seq)
        .bind(position)
        .bind(lease.token)
        .bind(state)
        .fetch_optional(db)
        .await?;
    decode::confirmed(applied.is_some(), lease)
}

/// Rows of one event, each decoded: its steps' status
/// ([`Store::step_status`](super::Store::step_status), a
/// [`StepStatus`](super::StepStatus) each) or its audit trail
/// ([`Admin::audit_list`](super::admin::Admin::audit_list), an
/// [`AuditEntry`](super::admin::AuditEntry) each).
pub async fn event_rows<'c, DB, E, T>(
    db: E,
    sql: &'static str,
    event_seq: i64,
    decode: Decode<DB, T>,
) -> Result<Vec<T>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(event_seq)
        .fetch_all(db)
        .await?
        .iter()
        .map(decode)
        .collect()
}

/// Every source's reconcile row
/// ([`Store::reconcile_cursors`](super::Store::reconcile_cursors)).
pub async fn reconcile_cursors<'c, DB, E>(
    db: E,
    sql: &'static str,
    decode: Decode<DB, ReconcileCursor>,
) -> Result<Vec<ReconcileCursor>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    sqlx::query(sql)
        .fetch_all(db)
        .await?
        .iter()
        .map(decode)
        .collect()
}

/// The sources that have events or tombstones
/// ([`Admin::sources`](super::admin::Admin::sources)).
pub async fn sources<'c, DB, E>(db: E, sql: &'static str) -> Result<Vec<String>, StoreError>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    Ok(sqlx::query_scalar(sql).fetch_all(db).await?)
}

/// The row a transition's `UPDATE` returned, decoded; none means it changed
/// nothing, which is an error ([`TransitionError::Unchanged`]), never ignored.
pub fn changed<R>(
    row: Option<R>,
    found: &EventSnapshot,
    decode: fn(&R) -> Result<EventRecord, StoreError>,
) -> Result<EventRecord, TransitionError> {
    match row {
        Some(row) => Ok(decode(&row)?),
        None => Err(TransitionError::Unchanged {
            event_seq: found.seq,
            was: found.state,
        }),
    }
}
