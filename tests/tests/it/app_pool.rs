//! tickmark on an application's own pool, beside the application's own sqlx
//! migrations (issue 33): tickmark's history is in `tickmark_migrations`, so
//! neither migrator trips on the other's rows, in either order; a database
//! migrated by an earlier tickmark (its rows in `_sqlx_migrations`) has them
//! moved over; `from_pool` does not migrate, and refuses a schema or a pool
//! it cannot run on with an error that says what to do.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use serde_json::json;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use sqlx::Connection;
use tickmark::store::postgres::PostgresStore;
use tickmark::store::sqlite::SqliteStore;
use tickmark::{Accepted, Engine, Handler, Handlers, NewEvent, Store, StoreError, WorkerConfig};
use tickmark_driver::store::migration::MigrationError;
use tickmark_tests::db::EmptySchema;
use tickmark_tests::probe::Probe;
use tickmark_tests::test_steps::Record;

/// The fake application's own migrations for `backend` (`postgres`, `sqlite`).
async fn app_migrator(backend: &str) -> Migrator {
    Migrator::new(fixtures().join("app_migrations").join(backend))
        .await
        .expect("the app's migrations")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// tickmark's own migrations, as an earlier tickmark applied them: with
/// sqlx's migrator, into `_sqlx_migrations`.
async fn earlier_tickmark_migrator(backend: &str) -> Migrator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("migrations")
        .join(backend);
    Migrator::new(dir).await.expect("tickmark's migrations")
}

fn handlers() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("record", Record::default()),
    )
}

/// Accept one event through an engine on `store`, run it with a worker,
/// and check the step ran.
async fn accept_and_run(store: Arc<dyn Store>, url: &str) {
    let probe = Probe::connect(url).await;
    let engine = Engine::new(store, handlers())
        .expect("valid handlers")
        .with_resource(probe.clone());
    let accepted = engine
        .accept(NewEvent::with_id("shop", "evt_1", "order.paid", json!({})))
        .await
        .unwrap();
    assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");
    let stats = engine
        .worker(WorkerConfig::default())
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.events_done, 1, "{stats:?}");
    assert_eq!(probe.runs("evt_1", "record").await, 1);
}

async fn pg_pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("the app's pool")
}

async fn pg_count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The newest migration version in tickmark's history table.
async fn pg_tickmark_newest(pool: &PgPool) -> i64 {
    pg_count(pool, "SELECT max(version) FROM tickmark_migrations").await
}

#[tokio::test]
async fn postgres_the_apps_migrations_first_then_tickmarks_then_the_apps_again() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pool = pg_pool(&schema.url).await;
    let app = app_migrator("postgres").await;
    app.run(&pool)
        .await
        .expect("the app migrates a fresh schema");

    tickmark::migrate(&pool)
        .await
        .expect("tickmark migrates beside the app");
    let store = PostgresStore::from_pool(pool.clone())
        .await
        .expect("from_pool");
    accept_and_run(Arc::new(store), &schema.url).await;

    app.run(&pool)
        .await
        .expect("the app's migrator runs again, clean");
    tickmark::migrate(&pool)
        .await
        .expect("and tickmark's, idempotent");
    assert_eq!(
        pg_count(&pool, "SELECT count(*) FROM _sqlx_migrations").await,
        2,
        "only the app's rows in sqlx's table"
    );
    assert_eq!(
        pg_tickmark_newest(&pool).await,
        tickmark_postgres::schema_version()
    );
}

#[tokio::test]
async fn postgres_tickmarks_migrations_first_then_the_apps() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pool = pg_pool(&schema.url).await;
    tickmark::migrate(&pool)
        .await
        .expect("tickmark migrates a fresh schema");
    let app = app_migrator("postgres").await;
    app.run(&pool)
        .await
        .expect("then the app's migrator, clean");
    let store = PostgresStore::from_pool(pool.clone())
        .await
        .expect("from_pool");
    accept_and_run(Arc::new(store), &schema.url).await;
    app.run(&pool).await.expect("the app's migrator again");
    tickmark::migrate(&pool).await.expect("tickmark's again");
}

/// A database that an earlier tickmark migrated (its rows in
/// `_sqlx_migrations`, beside the app's, which the app could only keep
/// with `set_ignore_missing`): migrating moves tickmark's rows to
/// `tickmark_migrations`, keeps the app's, and the app's migrator then runs
/// without `ignore_missing`.
#[tokio::test]
async fn postgres_an_earlier_tickmarks_history_is_adopted_and_the_apps_rows_kept() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pool = pg_pool(&schema.url).await;
    earlier_tickmark_migrator("postgres")
        .await
        .run(&pool)
        .await
        .expect("the earlier tickmark migrates");
    let mut tolerant = app_migrator("postgres").await;
    tolerant.set_ignore_missing(true);
    tolerant
        .run(&pool)
        .await
        .expect("the app, ignoring tickmark's rows");
    let tickmark_rows = tickmark_postgres::schema_version();
    let shared = "SELECT count(*) FROM _sqlx_migrations";
    assert_eq!(
        pg_count(&pool, shared).await,
        tickmark_rows_count("postgres") + 2
    );
    let strict = app_migrator("postgres").await;
    // On a connection of its own, closed after: sqlx's migrator returns
    // this error without releasing its session lock, which is one for the
    // whole database (every test's schema), and would hold up the other
    // tests' migrators until the connection closed.
    let mut alone = PgConnection::connect(&schema.url).await.unwrap();
    assert!(
        strict.run(&mut alone).await.is_err(),
        "before: the app's strict migrator trips on tickmark's rows"
    );
    alone.close().await.unwrap();

    // The store refuses until migrated: the history is still the old one.
    let refused = PostgresStore::from_pool(pool.clone()).await.unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::Migration(MigrationError::Unmigrated { recorded: None, .. })
        ),
        "{refused}"
    );

    tickmark::migrate(&pool).await.expect("adopts and migrates");
    assert_eq!(pg_count(&pool, shared).await, 2, "the app's rows stay");
    assert_eq!(
        pg_count(
            &pool,
            "SELECT count(*) FROM _sqlx_migrations WHERE version IN (20240101000001, 20240101000002)"
        )
        .await,
        2
    );
    assert_eq!(
        pg_count(&pool, "SELECT count(*) FROM tickmark_migrations").await,
        tickmark_rows_count("postgres")
    );
    assert_eq!(pg_tickmark_newest(&pool).await, tickmark_rows);
    strict
        .run(&pool)
        .await
        .expect("the app's strict migrator runs clean now");
    let store = PostgresStore::from_pool(pool.clone())
        .await
        .expect("from_pool");
    accept_and_run(Arc::new(store), &schema.url).await;
}

/// How many migrations tickmark has on `backend` (files in migrations/).
fn tickmark_rows_count(backend: &str) -> i64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("migrations")
        .join(backend);
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sql")
        })
        .count() as i64
}

#[tokio::test]
async fn postgres_from_pool_refuses_an_unmigrated_schema_and_says_to_migrate() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pool = pg_pool(&schema.url).await;
    let error = PostgresStore::from_pool(pool.clone()).await.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Migration(MigrationError::Unmigrated { recorded: None, .. })
        ),
        "{error}"
    );
    let said = error.to_string();
    for needle in ["tickmark::migrate(&pool)", "tickmark migrate"] {
        assert!(said.contains(needle), "{needle}: {said}");
    }
    assert_eq!(
        pg_count(
            &pool,
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
        )
        .await,
        0,
        "from_pool created nothing"
    );
}

#[tokio::test]
async fn postgres_a_newer_or_edited_schema_is_refused_with_what_to_do() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pool = pg_pool(&schema.url).await;
    tickmark::migrate(&pool).await.unwrap();
    let known = tickmark_postgres::schema_version();

    sqlx::query("UPDATE tickmark_migrations SET checksum = '\\x00'::bytea WHERE version = 1")
        .execute(&pool)
        .await
        .unwrap();
    for error in [
        tickmark::migrate(&pool).await.unwrap_err(),
        PostgresStore::from_pool(pool.clone()).await.unwrap_err(),
    ] {
        assert!(
            matches!(
                error,
                StoreError::Migration(MigrationError::ChecksumMismatch { version: 1, .. })
            ),
            "{error}"
        );
        assert!(error.to_string().contains("was edited"), "{error}");
    }

    // A newer tickmark's schema, in another fresh schema.
    let Some(schema2) = EmptySchema::new().await else {
        return;
    };
    let pool2 = pg_pool(&schema2.url).await;
    tickmark::migrate(&pool2).await.unwrap();
    let newer = known + 1;
    sqlx::query(&format!(
        "INSERT INTO tickmark_migrations (version, description, success, checksum, execution_time) \
         VALUES ({newer}, 'from a newer tickmark', TRUE, '\\x00'::bytea, 0)"
    ))
    .execute(&pool2)
    .await
    .unwrap();
    for error in [
        tickmark::migrate(&pool2).await.unwrap_err(),
        PostgresStore::from_pool(pool2.clone()).await.unwrap_err(),
    ] {
        assert!(
            matches!(
                error,
                StoreError::Migration(MigrationError::NewerSchema { recorded, known: k, .. })
                    if recorded == newer && k == known
            ),
            "{error}"
        );
        let said = error.to_string();
        assert!(said.contains("Upgrade this binary"), "{said}");
        assert!(said.contains(&format!("migration {newer}")), "{said}");
        assert!(said.contains(&format!("newest is {known}")), "{said}");
    }
}

/// tickmark's own pool sets READ COMMITTED on each connection; a foreign
/// pool whose sessions default to another level is refused, naming it.
#[tokio::test]
async fn postgres_from_pool_refuses_a_pool_whose_sessions_are_not_read_committed() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    tickmark::migrate(&pg_pool(&schema.url).await)
        .await
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(
                    conn,
                    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                )
                .await?;
                Ok(())
            })
        })
        .connect(&schema.url)
        .await
        .unwrap();
    let error = PostgresStore::from_pool(pool).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::UnsuitablePool { setting: "default_transaction_isolation", found, .. } if found == "repeatable read"),
        "{error}"
    );
    assert!(error.to_string().contains("after_connect"), "{error}");
}

/// A pool with the pragmas tickmark's own pool sets.
async fn sqlite_pool(path: &Path) -> SqlitePool {
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full);
    SqlitePool::connect_with(options).await.unwrap()
}

async fn sqlite_count(pool: &SqlitePool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn sqlite_the_apps_migrations_and_tickmarks_in_either_order() {
    for tickmark_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        let url = format!("sqlite://{}", path.display());
        let pool = sqlite_pool(&path).await;
        let app = app_migrator("sqlite").await;
        if tickmark_first {
            tickmark::migrate(&pool)
                .await
                .expect("tickmark migrates a new file");
            app.run(&pool)
                .await
                .expect("then the app's migrator, clean");
        } else {
            app.run(&pool).await.expect("the app migrates a new file");
            tickmark::migrate(&pool)
                .await
                .expect("then tickmark's, beside it");
        }
        let store = SqliteStore::from_pool(pool.clone())
            .await
            .expect("from_pool");
        accept_and_run(Arc::new(store), &url).await;
        app.run(&pool).await.expect("the app's migrator again");
        tickmark::migrate(&pool).await.expect("tickmark's again");
        assert_eq!(
            sqlite_count(&pool, "SELECT count(*) FROM _sqlx_migrations").await,
            2
        );
        assert_eq!(
            sqlite_count(&pool, "SELECT max(version) FROM tickmark_migrations").await,
            tickmark_sqlite::schema_version()
        );
    }
}

#[tokio::test]
async fn sqlite_an_earlier_tickmarks_history_is_adopted_and_the_apps_rows_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let url = format!("sqlite://{}", path.display());
    let pool = sqlite_pool(&path).await;
    earlier_tickmark_migrator("sqlite")
        .await
        .run(&pool)
        .await
        .unwrap();
    let mut tolerant = app_migrator("sqlite").await;
    tolerant.set_ignore_missing(true);
    tolerant.run(&pool).await.unwrap();
    let strict = app_migrator("sqlite").await;
    assert!(
        strict.run(&pool).await.is_err(),
        "before: the app's migrator trips"
    );

    tickmark::migrate(&pool).await.expect("adopts and migrates");
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM _sqlx_migrations").await,
        2
    );
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM tickmark_migrations").await,
        tickmark_rows_count("sqlite")
    );
    strict
        .run(&pool)
        .await
        .expect("the app's migrator runs clean now");
    let store = SqliteStore::from_pool(pool.clone())
        .await
        .expect("from_pool");
    accept_and_run(Arc::new(store), &url).await;
}

#[tokio::test]
async fn sqlite_from_pool_refuses_an_unmigrated_file_and_a_pool_without_wal() {
    let dir = tempfile::tempdir().unwrap();
    let pool = sqlite_pool(&dir.path().join("app.db")).await;
    let error = SqliteStore::from_pool(pool.clone()).await.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Migration(MigrationError::Unmigrated { recorded: None, .. })
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("tickmark::migrate(&pool)"),
        "{error}"
    );

    let other = dir.path().join("rollback-journal.db");
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", other.display()))
        .unwrap()
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Delete);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    tickmark::migrate(&pool).await.unwrap();
    let error = SqliteStore::from_pool(pool).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::UnsuitablePool { setting: "journal_mode", found, .. } if found == "delete"),
        "{error}"
    );
    assert!(
        error.to_string().contains("SqliteJournalMode::Wal"),
        "{error}"
    );

    let normal = dir.path().join("normal.db");
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", normal.display()))
        .unwrap()
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    tickmark::migrate(&pool).await.unwrap();
    let error = SqliteStore::from_pool(pool).await.unwrap_err();
    assert!(
        matches!(
            &error,
            StoreError::UnsuitablePool {
                setting: "synchronous",
                ..
            }
        ),
        "{error}"
    );
}

/// Processes starting together on a new SQLite file take turns on its
/// write lock: each migrates or finds the schema applied, none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stores_opening_a_new_file_at_once_all_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("new.db").display());
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let url = url.clone();
        starts.spawn(async move { SqliteStore::connect(&url).await.map(|_| ()) });
    }
    while let Some(started) = starts.join_next().await {
        started.unwrap().expect("every store starts");
    }
    let pool = SqlitePool::connect(&url).await.unwrap();
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM tickmark_migrations").await,
        tickmark_rows_count("sqlite"),
        "each migration recorded once"
    );
}

/// Migrations on one PostgreSQL schema take turns (the transaction's
/// advisory lock): all succeed, each migration is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_started_at_once_take_turns() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pool = pg_pool(&schema.url).await;
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let pool = pool.clone();
        runs.spawn(async move { tickmark::migrate(&pool).await });
    }
    while let Some(run) = runs.join_next().await {
        run.unwrap().expect("every migrate succeeds");
    }
    assert_eq!(
        pg_count(&pool, "SELECT count(*) FROM tickmark_migrations").await,
        tickmark_rows_count("postgres")
    );
}
