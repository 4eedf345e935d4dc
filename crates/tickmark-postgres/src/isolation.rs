//! The isolation level tickmark's statements rely on: READ COMMITTED, set
//! by tickmark itself rather than taken from the role or the database.
//!
//! Several decisions need a statement to see what another transaction
//! committed after this transaction began:
//!
//! - the accept's tombstone check (`sql::TOMBSTONED_UNDO`) runs after its
//!   insert, in the insert's transaction, and must see the tombstone of a
//!   prune the insert waited for (store/tombstone.rs);
//! - the claim (`tickmark_claim`, migration 0008) counts a limited key's
//!   running events after taking the key's lock, and must see the leases of
//!   the claim that held the lock before it;
//! - durable waits and debounce read after taking an advisory lock
//!   (`wait.rs`, `debounce.rs`).
//!
//! Under REPEATABLE READ or SERIALIZABLE every statement of a transaction
//! reads the snapshot of its first one, so each of these would decide on
//! stale data: a redelivery of a pruned event accepted as new, a key over
//! its limit. A role or a database can make either the default
//! (`ALTER ROLE … SET default_transaction_isolation`), so tickmark says
//! READ COMMITTED itself, twice:
//!
//! - every transaction it opens begins with [`BEGIN`] ([`begin`]), which
//!   holds whatever the session's default is, and through a transaction
//!   pooler too (a session setting would not follow the transaction to the
//!   server connection it lands on);
//! - every connection of the pool sets the session's default
//!   ([`SESSION_DEFAULT`], run on connect), which covers the statements
//!   that run alone. A single statement takes one snapshot at its start
//!   under any level, but under REPEATABLE READ a row changed by a
//!   transaction that committed after that snapshot fails the statement
//!   (40001) instead of being re-read, and a PL/pgSQL function such as the
//!   claim runs all its statements on the first one's snapshot. Through a
//!   transaction pooler no session setting sticks, and every statement
//!   runs in a transaction of the store's instead (`pooler.rs`).

use sqlx::postgres::PgPool;
use sqlx::{Postgres, Transaction};

/// How every transaction of the store begins.
pub(super) const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Run on every new connection of the store's pool: the default for the
/// statements that are not in a transaction of tickmark's.
pub(super) const SESSION_DEFAULT: &str =
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// A transaction on `pool` at READ COMMITTED, whatever the session's default.
pub(super) async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    pool.begin_with(BEGIN).await
}

/// On the application's pool (`PostgresStore::from_pool`), where tickmark
/// cannot run [`SESSION_DEFAULT`] on connect: refuse a pool whose sessions
/// default to another level (checked on one of its connections).
pub(super) async fn check_pool_default(
    pool: &PgPool,
) -> Result<(), tickmark_driver::store::StoreError> {
    let level: String =
        sqlx::query_scalar("SELECT current_setting('default_transaction_isolation')")
            .fetch_one(pool)
            .await?;
    if level == "read committed" {
        return Ok(());
    }
    Err(tickmark_driver::store::StoreError::UnsuitablePool {
        setting: "default_transaction_isolation",
        found: level,
        needed: "read committed",
        fix: "run `SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED` \
              in the pool's `after_connect` (or remove the role's or database's \
              `default_transaction_isolation`), or give tickmark a pool of its own \
              (`PostgresStore::connect`)",
    })
}
