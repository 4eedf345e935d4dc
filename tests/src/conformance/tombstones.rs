//! Dedup tombstones (`tickmark_driver::store::tombstone`): a pruned event leaves a
//! compact record of its keys for the dedup window, so a late redelivery is
//! still a duplicate and never runs again; after the window it is new.

use std::time::Duration;

use serde_json::json;
use tickmark::{Accepted, Engine, NewEvent};
use tickmark_driver::store::admin::PruneBatch;
use tickmark_driver::store::tombstone::{key_hash, KeyKind};

use super::admin::{age, run_until_idle, three_steps};
use super::{engine, order_paid};
use crate::{wait, TestDb};

const DAY: Duration = Duration::from_secs(86_400);

/// Prune everything finished more than a day old, keeping tombstones of
/// what was accepted within `dedup_window`; the events deleted.
async fn prune(db: &TestDb, dedup_window: Duration) -> u64 {
    db.store
        .event_prune(&PruneBatch {
            older_than: DAY,
            dedup_window,
            include_dead: false,
            batch: 100,
        })
        .await
        .unwrap()
}

async fn tombstones(db: &TestDb) -> i64 {
    db.probe
        .scalar("SELECT count(*) FROM tickmark_tombstones")
        .await
}

/// `id` again, as a provider's redelivery.
async fn redeliver(engine: &Engine, id: &str) -> Accepted {
    engine
        .accept(NewEvent::with_id("shop", id, "order.paid", json!({})))
        .await
        .unwrap()
}

/// An event pruned ten days after it was accepted, within a 30-day dedup
/// window: its payload and steps are gone, a redelivery is a duplicate and
/// runs nothing; once its tombstone has expired, a redelivery is new.
pub async fn a_redelivery_of_a_pruned_event_is_a_duplicate_within_the_dedup_window(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_late").await;
    run_until_idle(&db, three_steps()).await;
    assert_eq!(db.probe.runs("evt_late", "first").await, 1);
    age(&db, &["evt_late"], 10).await;

    assert_eq!(prune(&db, 30 * DAY).await, 1);
    assert!(
        db.store
            .event_find("shop", "evt_late")
            .await
            .unwrap()
            .is_none(),
        "the event's row, payload and plan are gone"
    );
    assert_eq!(
        db.probe.scalar("SELECT count(*) FROM tickmark_steps").await,
        0,
        "its step rows are gone"
    );
    assert_eq!(tombstones(&db).await, 1, "one tombstone: its dedup key");

    assert_eq!(redeliver(&engine, "evt_late").await, Accepted::Duplicate);
    run_until_idle(&db, three_steps()).await;
    assert_eq!(
        db.probe.runs("evt_late", "first").await,
        1,
        "a late redelivery never runs again"
    );
    assert!(db
        .store
        .event_find("shop", "evt_late")
        .await
        .unwrap()
        .is_none());

    // Tombstones younger than the window stay.
    assert_eq!(db.store.tombstone_prune(30 * DAY, 100).await.unwrap(), 0);
    assert_eq!(redeliver(&engine, "evt_late").await, Accepted::Duplicate);
    // After the window (ten days > five), the key is forgotten.
    assert_eq!(db.store.tombstone_prune(5 * DAY, 100).await.unwrap(), 1);
    assert_eq!(tombstones(&db).await, 0);
    assert!(redeliver(&engine, "evt_late").await.is_new());
    run_until_idle(&db, three_steps()).await;
    assert_eq!(db.probe.runs("evt_late", "first").await, 2);
}

/// A delivery sent again under a new id is caught by its replay key while
/// its event exists; after the event is pruned, by the replay key's
/// tombstone.
pub async fn a_pruned_events_replay_key_still_catches_a_replay(db: TestDb) {
    let engine = engine(&db, three_steps());
    let first = engine
        .accept(
            NewEvent::with_id("shop", "evt_signed", "order.paid", json!({}))
                .with_replay_key("sig:abc"),
        )
        .await
        .unwrap();
    assert!(first.is_new());
    run_until_idle(&db, three_steps()).await;
    age(&db, &["evt_signed"], 10).await;
    assert_eq!(prune(&db, 30 * DAY).await, 1);
    assert_eq!(tombstones(&db).await, 2, "its dedup key and its replay key");

    let replayed = engine
        .accept(
            NewEvent::with_id("shop", "evt_other_id", "order.paid", json!({}))
                .with_replay_key("sig:abc"),
        )
        .await
        .unwrap();
    assert_eq!(replayed, Accepted::Duplicate);
    // A dedup key spelled like the replay key is another key.
    assert!(redeliver(&engine, "sig:abc").await.is_new());
}

/// An event already older than the dedup window when it is pruned leaves no
/// tombstone: its window is over.
pub async fn an_event_older_than_the_dedup_window_leaves_no_tombstone(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_ancient").await;
    order_paid(&engine, "evt_recent").await;
    run_until_idle(&db, three_steps()).await;
    age(&db, &["evt_ancient"], 40).await;
    age(&db, &["evt_recent"], 10).await;

    assert_eq!(prune(&db, 30 * DAY).await, 2);
    assert_eq!(tombstones(&db).await, 1);
    assert!(redeliver(&engine, "evt_ancient").await.is_new());
    assert_eq!(redeliver(&engine, "evt_recent").await, Accepted::Duplicate);
}

/// Every accept path consults the tombstones: the batched insert, and the
/// single inserts of debounced and matchable events are checked through the
/// same function; a batch mixing a pruned key and a new one answers each.
pub async fn a_batch_mixing_pruned_and_new_keys_answers_each(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_old_a").await;
    run_until_idle(&db, three_steps()).await;
    age(&db, &["evt_old_a"], 10).await;
    assert_eq!(prune(&db, 30 * DAY).await, 1);

    let accepts = ["evt_old_a", "evt_new_b", "evt_old_a", "evt_new_c"].map(|id| {
        let engine = engine.clone();
        tokio::spawn(async move { redeliver(&engine, id).await })
    });
    let mut answers = Vec::new();
    for accept in accepts {
        answers.push(accept.await.unwrap());
    }
    assert_eq!(answers[0], Accepted::Duplicate);
    assert!(answers[1].is_new());
    assert_eq!(answers[2], Accepted::Duplicate);
    assert!(answers[3].is_new());
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        2
    );
}

/// PostgreSQL: the key hash the database computes (`tickmark_key_hash`, used
/// by prune and by the accept's check) is the one Rust computes.
pub async fn the_databases_key_hash_is_the_rust_one(db: TestDb) {
    for (kind, key) in [
        (KeyKind::Dedup, "evt_1NG8Du2eZvKYlo2C"),
        (KeyKind::Dedup, "sha256:9f86d081884c7d659a2feaa0c55ad015"),
        (KeyKind::Replay, "sig:ümlaut ✓"),
        (KeyKind::Dedup, ""),
    ] {
        let sql = format!(
            "SELECT encode(tickmark_key_hash('{}', '{}'), 'hex')",
            kind.as_str(),
            key
        );
        assert_eq!(
            db.probe.text(&sql).await.as_deref(),
            Some(hex::encode(key_hash(kind, key)).as_str()),
            "{kind:?} {key:?}"
        );
    }
}

/// PostgreSQL: an accept racing the prune of its own key. The prune's
/// transaction (here held open by hand: the tombstone written, the event
/// deleted, as `EVENT_PRUNE` does in one statement) commits while the
/// accept's insert waits on the unique index; the insert then succeeds, and
/// only the check that follows it, in the same transaction, can see the
/// tombstone. The accept must answer Duplicate and leave no event.
pub async fn an_accept_racing_the_prune_of_its_key_is_a_duplicate(db: TestDb) {
    use sqlx::Connection;

    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_racing").await;
    run_until_idle(&db, three_steps()).await;

    let mut pruner = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = pruner.begin().await.unwrap();
    let kept = sqlx::query(
        "INSERT INTO tickmark_tombstones (source, key_hash, accepted_at)
         SELECT source, tickmark_key_hash('dedup', dedup_key), received_at
         FROM tickmark_events WHERE dedup_key = 'evt_racing'",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(kept.rows_affected(), 1);
    sqlx::query("DELETE FROM tickmark_steps WHERE event_seq IN (SELECT id FROM tickmark_events WHERE dedup_key = 'evt_racing')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let deleted = sqlx::query("DELETE FROM tickmark_events WHERE dedup_key = 'evt_racing'")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(deleted.rows_affected(), 1);

    let accepting = {
        let engine = engine.clone();
        tokio::spawn(async move { redeliver(&engine, "evt_racing").await })
    };
    wait::until(
        "the accept's insert waits for the prune's transaction (or has finished)",
        Duration::from_secs(30),
        || async {
            accepting.is_finished()
                || db
                    .probe
                    .scalar(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted",
                    )
                    .await
                    > 0
        },
    )
    .await;
    tx.commit().await.unwrap();

    assert_eq!(accepting.await.unwrap(), Accepted::Duplicate);
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE dedup_key = 'evt_racing'")
            .await,
        0,
        "the racing insert was undone"
    );
    run_until_idle(&db, three_steps()).await;
    assert_eq!(db.probe.runs("evt_racing", "first").await, 1);
}

/// Lookups by the tombstones' primary key so far, as the server's
/// statistics report them (index builds do not count, unlike sequential
/// scans: the migration's two show up there).
async fn tombstone_key_lookups(db: &TestDb) -> i64 {
    db.probe
        .scalar(
            "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_indexes
             WHERE indexrelid = 'tickmark_tombstones_pkey'::regclass",
        )
        .await
}

/// PostgreSQL: the accept's tombstone check reads each new event's
/// tombstone by key, whatever the table's statistics say. Just after a big
/// prune, autovacuum has not analyzed the tombstones yet; a check the
/// planner was free to turn into a join hashed them all by source and
/// compared every accepted event with every tombstone (29 s for a batch of
/// 256 against 50,000), without one lookup by key. Here 66 accepts must
/// look their keys up by the primary key, at least once each.
pub async fn the_accepts_check_reads_unanalyzed_tombstones_by_key(db: TestDb) {
    use std::sync::Arc;
    use tickmark::store::postgres::{PostgresOptions, PostgresStore};

    db.probe
        .execute(
            "INSERT INTO tickmark_tombstones (source, key_hash, accepted_at)
             SELECT 'shop', tickmark_key_hash('dedup', 'evt_pruned_' || n), now()
             FROM generate_series(1, 20000) AS n",
        )
        .await;
    // A store of its own, on one connection, closed before the statistics
    // are read: a backend reports its scans when it exits (before, only now
    // and then), all of them at once.
    let options = PostgresOptions {
        max_connections: 1,
        ..PostgresOptions::default()
    };
    let store = Arc::new(PostgresStore::connect_with(&db.url, options).await.unwrap());
    let before = tombstone_key_lookups(&db).await;
    let engine = Engine::new(store.clone(), three_steps()).expect("valid handlers");
    let ids: Vec<String> = (1..=64)
        .map(|n| format!("evt_new_{n}"))
        .chain(["evt_pruned_7".to_owned(), "evt_pruned_19999".to_owned()])
        .collect();
    let accepts: Vec<_> = ids
        .iter()
        .map(|id| {
            let (engine, id) = (engine.clone(), id.clone());
            tokio::spawn(async move { redeliver(&engine, &id).await })
        })
        .collect();
    let mut answers = Vec::new();
    for accept in accepts {
        answers.push(accept.await.unwrap());
    }
    assert!(answers[..64].iter().all(Accepted::is_new), "{answers:?}");
    assert_eq!(answers[64..], [Accepted::Duplicate, Accepted::Duplicate]);
    drop(engine);
    store.pool().close().await;

    wait::until(
        "the accepts' check to look each of 66 keys up by the tombstones' primary key \
         (it read the table another way)",
        Duration::from_secs(30),
        || async { tombstone_key_lookups(&db).await >= before + 66 },
    )
    .await;
}
