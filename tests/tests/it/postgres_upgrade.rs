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
use tickmark_tests::db::EmptySchema;
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
             a_later_column INT)
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
