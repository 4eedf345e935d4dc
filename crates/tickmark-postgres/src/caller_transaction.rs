//! An accept in the application's transaction (`Engine::accept_in`): one
//! insert on the caller's connection, not batched, in a savepoint of the
//! caller's transaction, so that a failure of tickmark's statements rolls
//! back to it and leaves the caller's transaction usable.
//!
//! The insert is the one a matchable event's accept runs (`wait.rs`,
//! [`PostgresStore::insert_one_on`]): the same `ON CONFLICT DO NOTHING`
//! decision as the batched insert, the tombstone check after it, the match
//! keys, and the `NOTIFY`, which PostgreSQL delivers when the caller's
//! transaction commits (and never, if it rolls back). A debounced event is
//! refused: its accept decides the burst under a lock and reschedules the
//! key's other events, which must not wait for the caller's commit.
//!
//! Before its insert, the accept holds its keys' advisory locks until the
//! caller's transaction ends (`accept_lock.rs`): a live copy of the event
//! delivered meanwhile is answered "retry later" at once, instead of
//! waiting for the caller's commit in an insert flusher and stalling every
//! other delivery queued behind it (issue 41).

use sqlx::{Connection, PgConnection, Postgres, Transaction};

use super::{accept_lock, isolation, PostgresStore};
use tickmark_driver::store::{EventInsert, InsertOutcome, StoreError};

/// The caller's transaction's level: the tombstone check (`isolation.rs`)
/// needs each statement to see what committed before it.
const TRANSACTION_ISOLATION: &str = "SELECT current_setting('transaction_isolation')";

impl PostgresStore {
    /// Insert `event` on the caller's `conn` (see the module's comment).
    pub(super) async fn insert_in(
        &self,
        conn: &mut PgConnection,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        if event.debounce.is_some() {
            return Err(StoreError::NotInCallerTransaction(format!(
                "the handler of ({}, {}) debounces, and a debounced accept reschedules the \
                 key's other events in a transaction of its own; accept it with \
                 `Engine::accept` after the caller's transaction commits",
                event.source, event.kind
            )));
        }
        let mut savepoint = within(conn).await?;
        let level: String = sqlx::query_scalar(TRANSACTION_ISOLATION)
            .fetch_one(&mut *savepoint)
            .await?;
        if level != "read committed" {
            return Err(StoreError::NotInCallerTransaction(format!(
                "the caller's transaction runs at `{level}`, and tickmark's dedup decision \
                 needs `read committed` (PostgreSQL's default): begin it with \
                 `pool.begin_with(\"BEGIN ISOLATION LEVEL READ COMMITTED\")`"
            )));
        }
        // Held until the caller's transaction ends, so that a live copy of
        // the event is told so at once instead of waiting for it
        // (`accept_lock.rs`).
        accept_lock::hold(
            &mut savepoint,
            event.source,
            event.dedup_key,
            event.replay_key,
        )
        .await?;
        let outcome = self.insert_one_on(&mut savepoint, event).await?;
        savepoint.commit().await?;
        Ok(outcome)
    }
}

/// A savepoint in the caller's transaction; on a connection outside one, a
/// READ COMMITTED transaction of its own, committed at once.
async fn within(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    if conn.is_in_transaction() {
        conn.begin().await
    } else {
        conn.begin_with(isolation::BEGIN).await
    }
}
