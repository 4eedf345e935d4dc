//! An accept in the application's transaction (`Engine::accept_in`): one
//! insert on the caller's connection, not batched, in a savepoint of the
//! caller's transaction, so that a failure of tickmark's statements rolls
//! back to it and leaves the caller's transaction usable. The same steps
//! as a batched accept's event (`insert_one`: tombstone check, insert, match
//! keys), committed or rolled back with the caller's transaction.
//!
//! Wake-ups: tickmark cannot see the caller's commit, and a wake-up sent
//! before it would find nothing to claim; this process's idle workers find
//! the event at their next poll (`WorkerConfig::poll_every`, 2 s by
//! default), which bounds the delay. The caller's transaction should begin
//! with `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`), as every
//! write of tickmark's does: a deferred one that reads first may fail to
//! take the write lock later (`SQLITE_BUSY`).

use sqlx::{Connection, SqliteConnection};

use super::{insert_one, SqliteStore};
use tickmark_driver::store::{EventInsert, InsertOutcome, StoreError};

impl SqliteStore {
    /// Insert `event` on the caller's `conn` (see the module's comment).
    pub(super) async fn insert_in(
        &self,
        conn: &mut SqliteConnection,
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
        let mut savepoint = if conn.is_in_transaction() {
            conn.begin().await?
        } else {
            conn.begin_with("BEGIN IMMEDIATE").await?
        };
        let outcome =
            insert_one(&mut savepoint, &event.to_owned_insert(), self.clock.now()).await?;
        savepoint.commit().await?;
        Ok(outcome)
    }
}
