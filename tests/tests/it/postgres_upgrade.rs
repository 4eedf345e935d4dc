//! A rolling upgrade on PostgreSQL (docs/deploying.md, "Rolling deploys"):
//! workers of the previous release keep claiming while a new release
//! migrates the schema under them, as CHANGELOG.md promises.
//!
//! A worker keeps each statement prepared on each of its pool's connections
//! (sqlx's statement cache): after the first claim it only binds and
//! executes. PostgreSQL re-plans such a statement when a function it calls
//! is replaced, and refuses it for good if its result type changed
//! (`cached plan must not change result type`, SQLSTATE 0A000): every
//! later claim on that connection fails. The previous release's worker is
//! played here at the protocol level, by a connection with sqlx's cache as
//! its pool's are, sending that release's claim word for word.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, Row};
use tickmark::store::postgres::{PostgresOptions, PostgresStore};
use tickmark::{Engine, Handler, Handlers, NewEvent, Store};
use tickmark_driver::store::ClaimParams;
use tickmark_tests::conformance::quick_worker;
use tickmark_tests::db::EmptySchema;
use tickmark_tests::probe::Probe;
use tickmark_tests::test_steps::Record;
use tickmark_tests::TestDb;

/// The newest PostgreSQL migration of the previous release (before exact
/// blame, commit 93a7dfd).
const PREVIOUS_SCHEMA: i64 = 11;

/// The previous release's claim (`sql::EVENT_CLAIM_MANY` before commit
/// 93a7dfd), bound as that release binds it.
const PREVIOUS_CLAIM: &str = "SELECT * FROM tickmark_claim($1, $2::int, $3, $4, $5)";

/// A claim as the previous release's worker makes it on `conn`: the keys of
/// the events it leased, each row read as that release reads it.
async fn previous_release_claims(
    conn: &mut PgConnection,
    worker: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let none: &[String] = &[];
    let rows = sqlx::query(PREVIOUS_CLAIM)
        .bind(worker)
        .bind(10_i64)
        .bind(30.0_f64)
        .bind(none)
        .bind(none)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| {
            let _: (i64, String, String, String, String) = (
                row.try_get("id")?,
                row.try_get("source")?,
                row.try_get("kind")?,
                row.try_get("payload")?,
                row.try_get("plan")?,
            );
            let _: (i32, i32, i64, bool) = (
                row.try_get("next_step")?,
                row.try_get("attempt")?,
                row.try_get("lease_token")?,
                row.try_get("took_over")?,
            );
            let _: (Option<String>, Option<i64>) =
                (row.try_get("resource_key")?, row.try_get("resource_seq")?);
            let _: chrono::DateTime<chrono::Utc> = row.try_get("received_at")?;
            row.try_get("dedup_key")
        })
        .collect()
}

/// A migrator of the PostgreSQL migrations numbered up to `last` only.
async fn migrator_up_to(last: i64, into: &Path) -> Migrator {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("migrations/postgres");
    for entry in std::fs::read_dir(&source).expect("migrations/postgres") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let number: i64 = name[..4].parse().expect("a numbered migration");
        if number <= last {
            std::fs::copy(&path, into.join(&name)).expect("copy a migration");
        }
    }
    Migrator::new(into).await.expect("read the migrations")
}

/// Migrate `db`'s schema as the previous release would.
async fn migrate_as_the_previous_release(db: &EmptySchema) {
    let dir = tempfile::tempdir().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    migrator_up_to(PREVIOUS_SCHEMA, dir.path())
        .await
        .run(&pool)
        .await
        .unwrap();
    pool.close().await;
}

fn handlers() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", Record::default()),
    )
}

async fn accept(store: Arc<dyn Store>, id: &str) {
    Engine::new(store, handlers())
        .expect("valid handlers")
        .accept(NewEvent::with_id("shop", id, "order.paid", json!({})))
        .await
        .unwrap();
}

/// A worker of the previous release, which claimed before the upgrade on
/// a connection it keeps, claims on that connection after a new release
/// has migrated the schema, and leases the events accepted since.
#[tokio::test]
async fn a_previous_release_worker_keeps_claiming_across_the_upgrade() {
    // A schema at the previous release's version: an empty test database,
    // migrated as that release would.
    let Some(db) = EmptySchema::new().await else {
        return;
    };
    migrate_as_the_previous_release(&db).await;

    let mut old = PgConnection::connect(&db.url).await.unwrap();
    assert_eq!(
        previous_release_claims(&mut old, "old-worker")
            .await
            .expect("the previous release claims on its own schema"),
        Vec::<String>::new()
    );

    // The new release starts: it migrates, and accepts.
    let new: Arc<dyn Store> = Arc::new(PostgresStore::connect(&db.url).await.unwrap());
    accept(new.clone(), "evt_after_upgrade").await;

    let claimed = previous_release_claims(&mut old, "old-worker")
        .await
        .expect("the previous release's worker keeps claiming on its connection");
    assert_eq!(claimed, ["evt_after_upgrade"]);
    let record = new
        .event_find("shop", "evt_after_upgrade")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_owner.as_deref(), Some("old-worker"));
    assert_eq!((record.attempt, record.interrupted), (1, 0));
    let _ = old.close().await;
}

/// This release names the columns it claims, so a later migration that
/// adds one to `tickmark_claim`'s result leaves its prepared claim valid:
/// a worker of this release keeps claiming through the next upgrade too.
/// The later migration is played by a function that returns one column
/// more than this release's.
#[tokio::test]
async fn a_claim_prepared_before_its_function_gains_a_column_still_claims() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // One connection: the claim after the change reuses the prepared one.
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect_with(
            &db.url,
            PostgresOptions {
                max_connections: 1,
                ..PostgresOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let params = ClaimParams::new("worker", 10, Duration::from_secs(30));
    assert!(store.event_claim_many(&params).await.unwrap().is_empty());

    for statement in [
        "ALTER FUNCTION tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)
             RENAME TO tickmark_claim_before",
        "CREATE FUNCTION tickmark_claim(
             worker TEXT, batch INT, lease_secs FLOAT8, skip_sources TEXT[], skip_kinds TEXT[],
             alone BOOLEAN, pending BOOLEAN)
         RETURNS TABLE (
             id BIGINT, source TEXT, dedup_key TEXT, kind TEXT, payload TEXT,
             received_at TIMESTAMPTZ, plan TEXT, next_step INT, attempt INT, lease_token BIGINT,
             took_over BOOLEAN, resource_key TEXT, resource_seq BIGINT, interrupted INT,
             traceparent TEXT, tracestate TEXT, a_later_column INT)
         LANGUAGE sql VOLATILE
         AS $$ SELECT c.*, 0 FROM tickmark_claim_before($1, $2, $3, $4, $5, $6, $7) AS c $$",
    ] {
        db.probe.execute(statement).await;
    }
    accept(store.clone(), "evt_after_change").await;

    let claimed = store
        .event_claim_many(&params)
        .await
        .expect("the prepared claim survives a column added to the function's result");
    let keys: Vec<&str> = claimed.iter().map(|c| c.event.id.as_str()).collect();
    assert_eq!(keys, ["evt_after_change"]);
}

/// Every unfinished event has its claim queue row, due when the event row
/// says, and no other event has one (migration 0017).
async fn assert_queue_in_step(conn: &mut PgConnection) {
    let out_of_step: Vec<(Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT e.id, q.event_seq
         FROM (SELECT id, due_at FROM tickmark_events WHERE state IN ('pending', 'running')) AS e
         FULL JOIN tickmark_queue AS q ON q.event_seq = e.id
         WHERE e.id IS NULL OR q.event_seq IS NULL OR q.due_at <> e.due_at",
    )
    .fetch_all(conn)
    .await
    .unwrap();
    assert_eq!(out_of_step, [], "(event, queue row) pairs out of step");
}

/// The previous release's statements know nothing of the claim queue: its
/// accept inserts an event row alone, its marks and hand-backs update the
/// event row alone. The queue follows them (the triggers of migration
/// 0017), so what that release accepts is claimed, what it finishes is not
/// claimed again, and what it schedules later waits until then.
#[tokio::test]
async fn the_claim_queue_follows_the_previous_releases_writes() {
    let Some(db) = EmptySchema::new().await else {
        return;
    };
    migrate_as_the_previous_release(&db).await;

    let new: Arc<dyn Store> = Arc::new(PostgresStore::connect(&db.url).await.unwrap());
    for id in ["evt_finished_by_old", "evt_retried_by_old", "evt_left"] {
        accept(new.clone(), id).await;
    }
    let mut old = PgConnection::connect(&db.url).await.unwrap();
    assert_queue_in_step(&mut old).await;

    // Written as the previous release writes, column by column of its own.
    for statement in [
        "INSERT INTO tickmark_events (source, dedup_key, kind, payload, plan, state, step_count, due_at)
         SELECT source, 'evt_accepted_by_old', kind, payload, plan, 'pending', step_count, now()
         FROM tickmark_events WHERE dedup_key = 'evt_left'",
        "UPDATE tickmark_events SET state = 'done', next_step = step_count, finished_at = now()
         WHERE dedup_key = 'evt_finished_by_old'",
        "UPDATE tickmark_events SET due_at = now() + interval '1 hour'
         WHERE dedup_key = 'evt_retried_by_old'",
    ] {
        sqlx::query(statement).execute(&mut old).await.unwrap();
        assert_queue_in_step(&mut old).await;
    }

    let params = ClaimParams::new("new-worker", 10, Duration::from_secs(30));
    let claimed = new.event_claim_many(&params).await.unwrap();
    let mut keys: Vec<&str> = claimed.iter().map(|c| c.event.id.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["evt_accepted_by_old", "evt_left"]);
    assert_queue_in_step(&mut old).await;

    // An operator's retry by hand brings a finished event back.
    sqlx::query(
        "UPDATE tickmark_events SET state = 'pending', next_step = 0, due_at = now()
         WHERE dedup_key = 'evt_finished_by_old'",
    )
    .execute(&mut old)
    .await
    .unwrap();
    assert_queue_in_step(&mut old).await;
    let claimed = new.event_claim_many(&params).await.unwrap();
    let keys: Vec<&str> = claimed.iter().map(|c| c.event.id.as_str()).collect();
    assert_eq!(keys, ["evt_finished_by_old"]);

    // By hand again: the later one due now, the leases above expired. This
    // release takes them over and runs all four to the end, its own claims
    // and marks keeping the queue in step themselves.
    for statement in [
        "UPDATE tickmark_events SET due_at = now() WHERE dedup_key = 'evt_retried_by_old'",
        "UPDATE tickmark_events SET due_at = now() - interval '1 minute' WHERE state = 'running'",
    ] {
        sqlx::query(statement).execute(&mut old).await.unwrap();
        assert_queue_in_step(&mut old).await;
    }
    Engine::new(new.clone(), handlers())
        .expect("valid handlers")
        .with_resource(Probe::connect(&db.url).await)
        .worker(quick_worker("new-worker"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let states: Vec<(String, String)> =
        sqlx::query_as("SELECT dedup_key, state FROM tickmark_events ORDER BY dedup_key")
            .fetch_all(&mut old)
            .await
            .unwrap();
    let done: Vec<&str> = states
        .iter()
        .filter(|(_, state)| state == "done")
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(done.len(), 4, "{states:?}");
    assert_queue_in_step(&mut old).await;
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM tickmark_queue")
        .fetch_one(&mut old)
        .await
        .unwrap();
    assert_eq!(queued, 0);
    let _ = old.close().await;
}
