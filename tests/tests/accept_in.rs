//! `Engine::accept_in`: an event recorded in the application's own
//! transaction commits with its business write, or not at all (issue 33).
//! On both backends: committed, the event exists and a worker runs it;
//! rolled back, nothing is recorded and the same event is new later; a
//! duplicate is a normal answer and the transaction stays usable; a
//! debounced handler is refused without harm. PostgreSQL: the workers'
//! wake-up is delivered at the commit, not before.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use tickmark::store::admin::PruneBatch;
use tickmark::store::postgres::PostgresStore;
use tickmark::store::sqlite::SqliteStore;
use tickmark::wait::WaitFor;
use tickmark::{
    Accepted, Backend, Engine, Handler, Handlers, NewEvent, StepState, Store, StoreError,
    WorkerConfig,
};
use tickmark_tests::conformance::admin::{age, run_until_idle, three_steps};
use tickmark_tests::conformance::{self, order_paid, quick_worker};
use tickmark_tests::db::{EmptySchema, TestDb};
use tickmark_tests::probe::Probe;
use tickmark_tests::test_steps::Record;

const CREATE_ORDERS: &str = "CREATE TABLE app_orders (id TEXT PRIMARY KEY)";

fn handlers() -> Handlers {
    Handlers::new()
        .on(
            "shop",
            "order.paid",
            Handler::new().named_step("record", Record::default()),
        )
        .on(
            "shop",
            "stock.changed",
            Handler::new()
                .named_step("record", Record::default())
                .debounce_per("/sku", Duration::from_secs(5), Duration::from_secs(30)),
        )
}

fn paid(id: &str) -> NewEvent {
    NewEvent::with_id("shop", id, "order.paid", json!({ "order": id }))
}

fn engine(store: Arc<dyn Store>, probe: &Probe) -> Engine {
    Engine::new(store, handlers())
        .expect("valid handlers")
        .with_resource(probe.clone())
}

async fn run_worker(engine: &Engine) -> u64 {
    engine
        .worker(WorkerConfig::default())
        .unwrap()
        .run_until_idle()
        .await
        .unwrap()
        .events_done
}

/// A PostgreSQL app: its pool on a fresh schema, tickmark migrated, a
/// store on the pool, the app's table.
async fn postgres_app() -> Option<(EmptySchema, PgPool, Engine, Probe)> {
    let schema = EmptySchema::new().await?;
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .connect(&schema.url)
        .await
        .unwrap();
    tickmark::migrate(&pool).await.unwrap();
    sqlx::query(CREATE_ORDERS).execute(&pool).await.unwrap();
    let store = PostgresStore::from_pool(pool.clone()).await.unwrap();
    let probe = Probe::connect(&schema.url).await;
    let engine = engine(Arc::new(store), &probe);
    Some((schema, pool, engine, probe))
}

async fn sqlite_app(dir: &Path) -> (SqlitePool, Engine, Probe) {
    let url = format!("sqlite://{}", dir.join("app.db").display());
    let options = SqliteConnectOptions::from_str(&url)
        .unwrap()
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePool::connect_with(options).await.unwrap();
    tickmark::migrate(&pool).await.unwrap();
    sqlx::query(CREATE_ORDERS).execute(&pool).await.unwrap();
    let store = SqliteStore::from_pool(pool.clone()).await.unwrap();
    let probe = Probe::connect(&url).await;
    let engine = engine(Arc::new(store), &probe);
    (pool, engine, probe)
}

async fn recorded(engine: &Engine, id: &str) -> bool {
    engine
        .store()
        .event_find("shop", id)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn postgres_the_event_commits_with_the_business_write_or_not_at_all() {
    let Some((_schema, pool, engine, probe)) = postgres_app().await else {
        return;
    };
    // Committed: the order and the event, and a worker runs it.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_1')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let accepted = engine.accept_in(&mut tx, paid("ord_1")).await.unwrap();
    assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");
    assert!(
        !recorded(&engine, "ord_1").await,
        "not visible before the commit"
    );
    tx.commit().await.unwrap();
    assert!(recorded(&engine, "ord_1").await);
    assert_eq!(run_worker(&engine).await, 1);
    assert_eq!(probe.runs("ord_1", "record").await, 1);

    // Rolled back: neither, and the same event is new later.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_2')")
        .execute(&mut *tx)
        .await
        .unwrap();
    engine.accept_in(&mut tx, paid("ord_2")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(
        !recorded(&engine, "ord_2").await,
        "a rollback leaves no event"
    );
    let mut tx = pool.begin().await.unwrap();
    let again = engine.accept_in(&mut tx, paid("ord_2")).await.unwrap();
    assert!(matches!(again, Accepted::New { .. }), "{again:?}");
    tx.commit().await.unwrap();

    // A duplicate is an answer; the transaction goes on and commits.
    let mut tx = pool.begin().await.unwrap();
    let duplicate = engine.accept_in(&mut tx, paid("ord_1")).await.unwrap();
    assert_eq!(duplicate, Accepted::Duplicate);
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_3')")
        .execute(&mut *tx)
        .await
        .expect("the transaction is still usable after a duplicate");
    tx.commit().await.unwrap();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM app_orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 2, "ord_1 and ord_3");
    assert_eq!(run_worker(&engine).await, 1, "ord_2 ran; ord_1 not again");
    assert_eq!(probe.runs("ord_1", "record").await, 1);
}

/// The wake-up (`NOTIFY`) is sent in the caller's transaction: listeners
/// hear it at the commit, never before.
#[tokio::test]
async fn postgres_workers_are_woken_when_the_callers_transaction_commits() {
    let Some((_schema, pool, engine, _probe)) = postgres_app().await else {
        return;
    };
    let mut wakeups = engine.store().wakeups().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    engine.accept_in(&mut tx, paid("ord_1")).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), wakeups.wait())
            .await
            .is_err(),
        "no wake-up before the commit"
    );
    tx.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), wakeups.wait())
        .await
        .expect("the commit wakes the workers");
}

/// The dedup decision needs READ COMMITTED; a caller's REPEATABLE READ
/// transaction is refused with what to do, and stays usable.
#[tokio::test]
async fn postgres_a_repeatable_read_transaction_is_refused_and_stays_usable() {
    let Some((_schema, pool, engine, _probe)) = postgres_app().await else {
        return;
    };
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let error = engine.accept_in(&mut tx, paid("ord_1")).await.unwrap_err();
    assert!(
        matches!(error, StoreError::NotInCallerTransaction(_)),
        "{error}"
    );
    assert!(error.to_string().contains("READ COMMITTED"), "{error}");
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_1')")
        .execute(&mut *tx)
        .await
        .expect("still usable");
    tx.commit().await.unwrap();
    assert!(!recorded(&engine, "ord_1").await);
}

#[tokio::test]
async fn postgres_a_debounced_event_is_refused_and_the_transaction_stays_usable() {
    let Some((_schema, pool, engine, _probe)) = postgres_app().await else {
        return;
    };
    let mut tx = pool.begin().await.unwrap();
    let stock = NewEvent::with_id("shop", "stk_1", "stock.changed", json!({ "sku": "A" }));
    let error = engine.accept_in(&mut tx, stock).await.unwrap_err();
    assert!(
        matches!(error, StoreError::NotInCallerTransaction(_)),
        "{error}"
    );
    assert!(error.to_string().contains("Engine::accept"), "{error}");
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_1')")
        .execute(&mut *tx)
        .await
        .expect("still usable");
    tx.commit().await.unwrap();
    assert!(!recorded(&engine, "stk_1").await);
}

#[tokio::test]
async fn sqlite_the_event_commits_with_the_business_write_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, engine, probe) = sqlite_app(dir.path()).await;

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_1')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let accepted = engine.accept_in(&mut tx, paid("ord_1")).await.unwrap();
    assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");
    tx.commit().await.unwrap();
    assert!(recorded(&engine, "ord_1").await);
    assert_eq!(run_worker(&engine).await, 1);
    assert_eq!(probe.runs("ord_1", "record").await, 1);

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_2')")
        .execute(&mut *tx)
        .await
        .unwrap();
    engine.accept_in(&mut tx, paid("ord_2")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(
        !recorded(&engine, "ord_2").await,
        "a rollback leaves no event"
    );
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let again = engine.accept_in(&mut tx, paid("ord_2")).await.unwrap();
    assert!(matches!(again, Accepted::New { .. }), "{again:?}");
    tx.commit().await.unwrap();

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let duplicate = engine.accept_in(&mut tx, paid("ord_1")).await.unwrap();
    assert_eq!(duplicate, Accepted::Duplicate);
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_3')")
        .execute(&mut *tx)
        .await
        .expect("the transaction is still usable after a duplicate");
    tx.commit().await.unwrap();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM app_orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 2, "ord_1 and ord_3");
    assert_eq!(run_worker(&engine).await, 1, "ord_2 ran; ord_1 not again");
    assert_eq!(probe.runs("ord_1", "record").await, 1);
}

#[tokio::test]
async fn sqlite_a_debounced_event_is_refused_and_the_transaction_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, engine, _probe) = sqlite_app(dir.path()).await;
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let stock = NewEvent::with_id("shop", "stk_1", "stock.changed", json!({ "sku": "A" }));
    let error = engine.accept_in(&mut tx, stock).await.unwrap_err();
    assert!(
        matches!(error, StoreError::NotInCallerTransaction(_)),
        "{error}"
    );
    sqlx::query("INSERT INTO app_orders (id) VALUES ('ord_1')")
        .execute(&mut *tx)
        .await
        .expect("still usable");
    tx.commit().await.unwrap();
    assert!(!recorded(&engine, "stk_1").await);
}

/// A connection of the other backend is refused, not misused.
#[tokio::test]
async fn a_connection_of_the_other_backend_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_pool, engine, _probe) = sqlite_app(dir.path()).await;
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let pg = PgPoolOptions::new().connect(&schema.url).await.unwrap();
    let mut tx = pg.begin().await.unwrap();
    let error = engine.accept_in(&mut tx, paid("ord_1")).await.unwrap_err();
    assert!(
        matches!(error, StoreError::NotInCallerTransaction(_)),
        "{error}"
    );
}

/// `event` accepted in a transaction of the application's on `db` (a pool
/// of its own on the test database's URL), committed.
async fn accept_in_committed(db: &TestDb, engine: &Engine, event: NewEvent) -> Accepted {
    if db.url.starts_with("sqlite:") {
        let pool = SqlitePool::connect(&db.url).await.unwrap();
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let accepted = engine.accept_in(&mut tx, event).await.unwrap();
        tx.commit().await.unwrap();
        pool.close().await;
        accepted
    } else {
        let pool = PgPoolOptions::new().connect(&db.url).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let accepted = engine.accept_in(&mut tx, event).await.unwrap();
        tx.commit().await.unwrap();
        pool.close().await;
        accepted
    }
}

/// What an accept covers, an accept in the caller's transaction covers:
/// a redelivery of a pruned event (its tombstone) and a replay of another
/// event's signature (its replay key) are duplicates, and a matching event
/// wakes a waiting one, which then settles as matched.
async fn accept_in_decides_as_accept_does(db: TestDb) {
    const DAY: Duration = Duration::from_secs(86_400);
    let handlers = three_steps().on(
        "shop",
        "order.created",
        Handler::new()
            .named_step("reserve", Record::default())
            .wait(
                "paid",
                WaitFor::event("shop", "payment.done")
                    .matching("/id")
                    .timeout(Duration::from_secs(3600)),
            )
            .named_step("fulfill", Record::default()),
    );
    let engine = conformance::engine(&db, handlers);

    // Tombstones.
    order_paid(&engine, "evt_late").await;
    run_until_idle(&db, three_steps()).await;
    age(&db, &["evt_late"], 10).await;
    let pruned = db
        .store
        .event_prune(&PruneBatch {
            older_than: DAY,
            dedup_window: 30 * DAY,
            include_dead: false,
            batch: 100,
        })
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    let late = NewEvent::with_id("shop", "evt_late", "order.paid", json!({}));
    assert_eq!(
        accept_in_committed(&db, &engine, late).await,
        Accepted::Duplicate,
        "the tombstone refuses a redelivery of a pruned event"
    );
    assert!(!recorded(&engine, "evt_late").await);

    // Replay keys.
    let first = NewEvent {
        replay_key: Some("sig_1".into()),
        ..NewEvent::with_id("shop", "evt_a", "order.paid", json!({}))
    };
    assert!(matches!(
        engine.accept(first).await.unwrap(),
        Accepted::New { .. }
    ));
    let replayed = NewEvent {
        replay_key: Some("sig_1".into()),
        ..NewEvent::with_id("shop", "evt_b", "order.paid", json!({}))
    };
    assert_eq!(
        accept_in_committed(&db, &engine, replayed).await,
        Accepted::Duplicate
    );

    // Match keys: the waiting order is woken by the payment accepted in
    // the caller's transaction.
    let created = NewEvent::with_id("shop", "o-1", "order.created", json!({ "id": 1 }));
    let Accepted::New { seq: order } = engine.accept(created).await.unwrap() else {
        panic!("a new order");
    };
    engine
        .worker(quick_worker("w1"))
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(
        db.store.step_status(order).await.unwrap()[1].state,
        StepState::Waiting
    );
    let payment = NewEvent::with_id("shop", "p-1", "payment.done", json!({ "id": 1 }));
    let accepted = accept_in_committed(&db, &engine, payment).await;
    assert!(matches!(accepted, Accepted::Ignored { .. }), "{accepted:?}");
    let woken = db.store.event_get(order).await.unwrap().unwrap();
    assert!(
        woken.due_at <= chrono::Utc::now(),
        "the accept woke the order"
    );
    engine
        .worker(quick_worker("w2"))
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    let output = db.store.step_status(order).await.unwrap()[1]
        .output
        .clone()
        .unwrap();
    assert_eq!(output["matched"]["event_id"], "p-1");
    assert_eq!(db.probe.runs("o-1", "fulfill").await, 1);
}

#[tokio::test]
async fn postgres_accept_in_decides_as_accept_does() {
    if let Some(db) = TestDb::new(Backend::Postgres).await {
        accept_in_decides_as_accept_does(db).await;
    }
}

#[tokio::test]
async fn sqlite_accept_in_decides_as_accept_does() {
    if let Some(db) = TestDb::new(Backend::Sqlite).await {
        accept_in_decides_as_accept_does(db).await;
    }
}
