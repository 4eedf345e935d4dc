//! SQLite migration 0006 rebuilds `tickmark_events` (a new state needs a new
//! CHECK) and, around it, the steps and audit tables that point at it with
//! ON DELETE CASCADE. A database at schema 5 with events, step marks and an
//! audit trail must come out of the upgrade with every row, its foreign
//! keys still enforced, and row numbers that are never reused.

use std::path::Path;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tickmark::store::sqlite::SqliteStore;
use tickmark::{EventState, Store};

/// A migrator of the SQLite migrations numbered up to `last` only.
async fn migrator_up_to(last: i64, into: &Path) -> Migrator {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("migrations/sqlite");
    for entry in std::fs::read_dir(&source).expect("migrations/sqlite") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let number: i64 = name[..4].parse().expect("a numbered migration");
        if number <= last {
            std::fs::copy(&path, into.join(&name)).expect("copy a migration");
        }
    }
    Migrator::new(into).await.expect("read the migrations")
}

#[tokio::test]
async fn an_upgrade_from_schema_5_keeps_events_steps_and_audit_rows() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    let file = dir.path().join("tickmark.db");
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    migrator_up_to(5, &old).await.run(&pool).await.unwrap();
    for sql in [
        "INSERT INTO tickmark_events (source, dedup_key, kind, payload, plan, state, step_count, \
         due_at, received_at) VALUES \
         ('shop', 'evt_done', 'k', '{}', '{\"version\":1,\"retry\":{},\"steps\":[{\"name\":\"a\",\"step\":{}}]}', 'done', 1, '2026-11-30T06:00:00.000Z', '2026-11-30T06:00:00.000Z'), \
         ('shop', 'evt_gone', 'k', '{}', '{}', 'done', 1, '2026-11-30T06:00:00.000Z', '2026-11-30T06:00:00.000Z'), \
         ('shop', 'evt_pending', 'k', '{}', '{}', 'pending', 1, '2026-11-30T06:00:00.000Z', '2026-11-30T06:00:00.000Z')",
        "INSERT INTO tickmark_steps (event_seq, position, name, state, attempts, lease_token, \
         finished_at) VALUES (1, 0, 'a', 'done', 1, 1, '2026-11-30T06:00:00.000Z')",
        "INSERT INTO tickmark_audit (event_seq, at, actor, action) VALUES (1, '2026-11-30T06:00:00.000Z', 'ops', 'retry')",
        // The highest row number so far is pruned: it must not come back.
        "DELETE FROM tickmark_events WHERE dedup_key = 'evt_pending'",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    pool.close().await;

    let url = format!("sqlite://{}", file.display());
    let store = SqliteStore::connect(&url)
        .await
        .expect("upgrade to the newest schema");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&file)
                .foreign_keys(true),
        )
        .await
        .unwrap();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT count(*) FROM tickmark_events").await, 2);
    assert_eq!(
        count("SELECT count(*) FROM tickmark_steps").await,
        1,
        "step marks kept"
    );
    assert_eq!(
        count("SELECT count(*) FROM tickmark_audit").await,
        1,
        "audit kept"
    );
    assert_eq!(
        count("SELECT count(*) FROM pragma_foreign_key_check").await,
        0,
        "every row still points at its event"
    );
    let done = store.event_find("shop", "evt_done").await.unwrap().unwrap();
    assert_eq!(done.state, EventState::Done);

    // Row numbers go on from the old high-water mark (3), not from the
    // highest row left (2).
    sqlx::query(
        "INSERT INTO tickmark_events (source, dedup_key, kind, payload, plan, state, step_count, \
         due_at, received_at) VALUES ('shop', 'evt_new', 'k', '{}', '{}', 'superseded', 1, '2026-11-30T06:00:00.000Z', '2026-11-30T06:00:00.000Z')",
    )
    .execute(&pool)
    .await
    .expect("the new state is allowed");
    assert_eq!(count("SELECT max(id) FROM tickmark_events").await, 4);

    // The cascade still holds: deleting an event deletes its marks and audit.
    sqlx::query("DELETE FROM tickmark_events WHERE dedup_key = 'evt_done'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(count("SELECT count(*) FROM tickmark_steps").await, 0);
    assert_eq!(count("SELECT count(*) FROM tickmark_audit").await, 0);
}
