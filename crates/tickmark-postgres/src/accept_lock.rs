//! Keys being accepted in an application's open transaction, told apart
//! without waiting for it (issue 41).
//!
//! `Engine::accept_in` inserts the event in the caller's transaction, and
//! the row stays uncommitted for as long as the caller keeps it open. An
//! `INSERT … ON CONFLICT DO NOTHING` of the same key elsewhere cannot decide
//! "new" or "duplicate" before that transaction ends, and PostgreSQL makes
//! it wait for the end. A live copy of the event in a batch of the insert
//! flushers held that flusher, and every accept queued behind it, for as
//! long as the caller's transaction stayed open: two such copies (one per
//! flusher) stalled every delivery.
//!
//! So an accept in the caller's transaction first takes a
//! transaction-scoped advisory lock on each of its unique keys, exclusive
//! ([`CALLER_LOCK`]), held until the caller commits or rolls back. Every
//! other accept tries the same locks, shared and without waiting
//! ([`TRY_SHARED`]), before its insert (the insert flushers' batches, and
//! the accepts of matchable and debounced events, which run in transactions
//! of their own): a key whose lock is held by an open
//! caller's transaction is left out of the batch and answered
//! [`StoreError::AcceptInProgress`] (transient: the accept retries it
//! briefly in process, then the receiver answers 503 and the provider
//! retries later), while the rest of the batch is written. Shared locks do
//! not exclude each other, so the flushers' concurrent copies of one key
//! still meet on the unique index (one new, the others duplicates) as
//! before.
//!
//! Nothing is lost or recorded twice: the key is only deferred. When the
//! caller commits, the provider's retry finds the row and is a duplicate;
//! when it rolls back, the lock goes with it and the retry records the
//! event. If a flusher takes its shared lock first, the caller's accept
//! waits for that batch's commit (milliseconds) and then finds the row.
//!
//! Why not a `lock_timeout` on the batch instead: a timeout fails the
//! whole batch after waiting for it, so every item of the batch waits, and
//! a batch cannot tell which key was held without splitting and trying
//! again. The lock says which key it is before anything waits.
//!
//! Advisory locks are database-wide: the key hashes the events table's oid
//! with the source and the key, so schemas sharing a database (tenants,
//! tests) do not meet; a hash collision would only defer an unrelated key
//! while such a transaction is open. An older tickmark in the fleet (a
//! rolling deploy) does not try the locks, and its flushers can still wait.

use sqlx::PgConnection;

use tickmark_driver::store::{EventInsert, StoreError};

/// The lock of one unique key, as a `bigint` for the advisory-lock
/// functions: `$source` and `$key` are SQL expressions for the event's
/// source and for the key with its kind (`dedup:…` or `replay:…`).
macro_rules! accept_key {
    ($source:literal, $key:literal) => {
        concat!(
            "hashtextextended(concat_ws(chr(31), 'tickmark.accept', ",
            "'tickmark_events'::regclass::oid, ",
            $source,
            ", ",
            $key,
            "), 0)"
        )
    };
}

/// The caller's accept: its keys (`$2`) of source `$1`, exclusive, in one
/// order, waiting for a batch that holds one of them shared.
const CALLER_LOCK: &str = concat!(
    "SELECT pg_advisory_xact_lock(",
    accept_key!("$1", "k"),
    ") FROM (SELECT DISTINCT k FROM unnest($2::text[]) AS k ORDER BY k) AS keys"
);

/// Every other accept: for each event (`$1` sources, `$2` dedup keys, `$3`
/// replay keys, NULL for none), in order, whether its keys' locks were
/// free (now held shared until this transaction ends). Never waits.
const TRY_SHARED: &str = concat!(
    "SELECT pg_try_advisory_xact_lock_shared(",
    accept_key!("r.source", "'dedup:' || r.dedup_key"),
    ") AND (r.replay_key IS NULL OR pg_try_advisory_xact_lock_shared(",
    accept_key!("r.source", "'replay:' || r.replay_key"),
    ")) FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY \
     AS r (source, dedup_key, replay_key, ord) ORDER BY r.ord"
);

/// One event's unique keys, as the locks name them.
fn keys(dedup_key: &str, replay_key: Option<&str>) -> Vec<String> {
    std::iter::once(format!("dedup:{dedup_key}"))
        .chain(replay_key.map(|key| format!("replay:{key}")))
        .collect()
}

/// In the caller's transaction, before its insert: hold the event's keys
/// until the caller's transaction ends.
pub(super) async fn hold(
    conn: &mut PgConnection,
    source: &str,
    dedup_key: &str,
    replay_key: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query(CALLER_LOCK)
        .bind(source)
        .bind(keys(dedup_key, replay_key))
        .execute(conn)
        .await?;
    Ok(())
}

/// In an accept's own transaction, before its insert: for each event
/// (source, dedup key, replay key), whether no open caller's transaction
/// holds its keys. Never waits.
pub(super) async fn try_shared<'e>(
    conn: &mut PgConnection,
    events: impl Iterator<Item = (&'e str, &'e str, Option<&'e str>)>,
) -> Result<Vec<bool>, StoreError> {
    let (mut sources, mut dedup_keys, mut replay_keys) = (Vec::new(), Vec::new(), Vec::new());
    for (source, dedup_key, replay_key) in events {
        sources.push(source);
        dedup_keys.push(dedup_key);
        replay_keys.push(replay_key);
    }
    let free: Vec<Option<bool>> = sqlx::query_scalar(TRY_SHARED)
        .bind(sources)
        .bind(dedup_keys)
        .bind(replay_keys)
        .fetch_all(conn)
        .await?;
    Ok(free.into_iter().map(|free| free == Some(true)).collect())
}

/// In an accept's own transaction of one event, before its insert: refuse
/// it ([`StoreError::AcceptInProgress`]) if an open caller's transaction
/// holds its keys, else hold them shared until this transaction ends.
pub(super) async fn refuse_if_held(
    conn: &mut PgConnection,
    event: &EventInsert<'_>,
) -> Result<(), StoreError> {
    let keys = (event.source, event.dedup_key, event.replay_key);
    if try_shared(conn, std::iter::once(keys)).await? != [true] {
        return Err(StoreError::AcceptInProgress);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_locks_its_dedup_key_and_its_replay_key() {
        assert_eq!(keys("evt_1", None), ["dedup:evt_1"]);
        assert_eq!(keys("evt_1", Some("r")), ["dedup:evt_1", "replay:r"]);
    }
}
