//! What a store on the application's pool (`SqliteStore::from_pool`) needs
//! of the pool's connections: the pragmas tickmark's own pool sets on each
//! (`SqliteStore::connect_with`), which tickmark cannot set on a pool it
//! did not open.

use sqlx::SqlitePool;

use tickmark_driver::store::StoreError;

/// Refuse a pool whose connection lacks one of the pragmas tickmark needs,
/// naming it and the fix (checked on one connection).
pub(super) async fn check(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(unsuitable(
            "journal_mode",
            journal_mode,
            "wal",
            "open the pool with `SqliteConnectOptions::journal_mode(SqliteJournalMode::Wal)`: \
             workers read while the receiver writes",
        ));
    }
    // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await?;
    if synchronous < 2 {
        return Err(unsuitable(
            "synchronous",
            synchronous_name(synchronous).to_owned(),
            "full",
            "open the pool with `SqliteConnectOptions::synchronous(SqliteSynchronous::Full)`: \
             with less, a power loss may lose an event the receiver answered 200 for",
        ));
    }
    let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&mut *conn)
        .await?;
    if foreign_keys != 1 {
        return Err(unsuitable(
            "foreign_keys",
            "off".to_owned(),
            "on",
            "open the pool with `SqliteConnectOptions::foreign_keys(true)` (sqlx's default): \
             pruning an event removes its steps through them",
        ));
    }
    let busy_timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await?;
    if busy_timeout <= 0 {
        return Err(unsuitable(
            "busy_timeout",
            "0".to_owned(),
            "a wait, e.g. 5000 (ms)",
            "open the pool with `SqliteConnectOptions::busy_timeout(..)` (sqlx's default is 5 s): \
             without it a write that meets another's lock fails at once",
        ));
    }
    Ok(())
}

fn synchronous_name(level: i64) -> &'static str {
    match level {
        0 => "off",
        1 => "normal",
        _ => "unknown",
    }
}

fn unsuitable(
    setting: &'static str,
    found: String,
    needed: &'static str,
    fix: &'static str,
) -> StoreError {
    StoreError::UnsuitablePool {
        setting,
        found,
        needed,
        fix,
    }
}
