//! `Engine::accept_in`: an event recorded in the application's own
//! transaction commits with its business write, or not at all (issue 33).
//! On both backends: committed, the event exists and a worker runs it;
//! rolled back, nothing is recorded and the same event is new later; a
//! duplicate is a normal answer and the transaction stays usable; a
//! debounced handler is refused without harm. PostgreSQL: the workers'
//! wake-up is delivered at the commit, not before.
//!
//! And an open caller's transaction holds up no other delivery (issue 41):
//! a live copy of its event, delivered to the receiver over a socket
//! meanwhile, is answered 503 `accept_in_progress` at once instead of
//! holding an insert flusher until the caller's commit; before the fix,
//! two such copies (one per flusher) stalled every delivery.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use tickmark::store::postgres::PostgresStore;
use tickmark::store::sqlite::{SqliteOptions, SqliteStore};
use tickmark::wait::WaitFor;
use tickmark::{
    Accepted, Backend, Engine, Handler, Handlers, NewEvent, Receiver, StepState, Store, StoreError,
    WorkerConfig,
};
use tickmark_driver::store::admin::PruneBatch;
use tickmark_tests::conformance::admin::{age, run_until_idle, three_steps};
use tickmark_tests::conformance::{self, order_paid, quick_worker};
use tickmark_tests::db::{EmptySchema, TestDb};
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Reply};
use tickmark_tests::probe::Probe;
use tickmark_tests::test_steps::Record;

use crate::receiver_support::{assert_answer, now, record_everything, Kind};

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

/// The PostgreSQL store's insert flushers (`store/postgres/mod.rs`); the
/// test holds twice as many callers' transactions open.
const INSERT_FLUSHERS: usize = 2;

/// How long the callers keep their transactions open, at least.
const HOLD_OPEN: Duration = Duration::from_secs(10);

/// The event a Stripe delivery of `id` is recorded as.
fn stripe_event(id: &str) -> NewEvent {
    NewEvent::with_id("stripe", id, Kind::Stripe.event_kind(), json!({ "id": id }))
}

/// A receiver with the Stripe source on `engine`, over a loopback socket.
struct Served {
    server: LoopbackServer,
    client: HttpClient,
}

impl Served {
    async fn start(engine: &Engine) -> Served {
        let receiver = Receiver::new(engine.clone())
            .source("stripe", Kind::Stripe.provider())
            .expect("a valid source");
        Served {
            server: LoopbackServer::start(receiver.router()).await,
            client: HttpClient::new(),
        }
    }

    /// A signed Stripe delivery of `id`, as the provider sends it.
    fn deliver(&self, id: &str) -> impl std::future::Future<Output = Reply> + Send + 'static {
        let (client, addr) = (self.client.clone(), self.server.addr);
        let delivery = Kind::Stripe.delivery(Kind::Stripe.secret(), id, now());
        async move {
            client
                .send(addr, &delivery)
                .await
                .expect("the receiver answers")
        }
    }
}

/// Callers' transactions that accepted `evt_x0`… stay open while live
/// copies of those events and unrelated ones are delivered, for at least
/// [`HOLD_OPEN`]: each unrelated delivery is answered 200 within 2 s (the
/// issue's bound; one takes milliseconds), each copy 503
/// `accept_in_progress` with `Retry-After`.
/// Then half the callers commit and half roll back: a copy's retry is a
/// duplicate of a committed event and records a rolled-back one, and each
/// event is recorded once and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_open_callers_transaction_holds_up_no_other_delivery() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let engine = conformance::engine(&db, record_everything());
    let served = Served::start(&engine).await;
    let held_open = 2 * INSERT_FLUSHERS;
    let ids: Vec<String> = (0..held_open).map(|i| format!("evt_x{i}")).collect();
    let app = PgPoolOptions::new()
        .max_connections(held_open as u32)
        .connect(&db.url)
        .await
        .unwrap();
    let (mut callers, mut pids) = (Vec::new(), Vec::new());
    let opened = std::time::Instant::now();
    for id in &ids {
        let mut tx = app.begin().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let accepted = engine.accept_in(&mut tx, stripe_event(id)).await.unwrap();
        assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");
        callers.push(tx);
        pids.push(pid.to_string());
    }

    // The live copies, while the callers' transactions are open.
    let copies: Vec<_> = ids
        .iter()
        .map(|id| tokio::spawn(served.deliver(id)))
        .collect();
    // Until every copy is answered, or (before the fix) both flushers wait
    // on the callers' transactions: a state, polled, not a sleep.
    let blocked = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE pg_blocking_pids(pid) && ARRAY[{}]::int[]",
        pids.join(",")
    );
    tokio::time::timeout(Duration::from_secs(60), async {
        while !copies.iter().all(|copy| copy.is_finished())
            && db.probe.scalar(&blocked).await < INSERT_FLUSHERS as i64
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the copies are answered, or wait");

    // Other deliveries, for as long as the callers hold their transactions
    // open (the issue holds them 60 s; what is asserted is the same).
    let mut unrelated = Vec::new();
    while opened.elapsed() < HOLD_OPEN || unrelated.is_empty() {
        let id = format!("evt_y{}", unrelated.len());
        let reply = tokio::time::timeout(Duration::from_secs(2), served.deliver(&id))
            .await
            .expect("a delivery is answered within 2 s while callers' transactions are open");
        assert_answer(&reply, 200, "new", None);
        unrelated.push(id);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for copy in copies {
        let reply = tokio::time::timeout(Duration::from_secs(30), copy)
            .await
            .expect("a copy of an event held by an open transaction is answered")
            .unwrap();
        assert_answer(&reply, 503, "error", Some("accept_in_progress"));
        assert!(reply.header("retry-after").is_some(), "{:?}", reply.headers);
    }

    // Half commit, half roll back; then the provider retries every copy.
    let committed = held_open / 2;
    for (i, tx) in callers.into_iter().enumerate() {
        if i < committed {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    for (i, id) in ids.iter().enumerate() {
        let retry = served.deliver(id).await;
        let word = if i < committed { "duplicate" } else { "new" };
        assert_answer(&retry, 200, word, None);
    }
    assert_eq!(
        run_worker(&engine).await,
        (held_open + unrelated.len()) as u64
    );
    for id in ids.iter().chain(&unrelated) {
        let rows = db
            .probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_events WHERE dedup_key = '{id}'"
            ))
            .await;
        assert_eq!(rows, 1, "{id} recorded once");
        assert_eq!(db.probe.runs(id, "first").await, 1, "{id} ran once");
    }
}

/// SQLite has one writer: a caller's transaction holds the write lock of
/// the whole file until it ends, so no delivery can be recorded meanwhile.
/// The receiver does not hang: a delivery waits `busy_timeout` for the
/// lock, then is answered 503 `store_unavailable` and the provider retries;
/// after the caller's commit the retries are recorded (the caller's event a
/// duplicate), each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_open_callers_transaction_is_answered_503_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let options = SqliteOptions {
        busy_timeout: Duration::from_secs(2),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::connect_with(&url, options).await.unwrap();
    let probe = Probe::connect(&url).await;
    let engine = Engine::new(Arc::new(store), record_everything())
        .expect("valid handlers")
        .with_resource(probe.clone());
    let served = Served::start(&engine).await;
    let app = SqlitePool::connect(&url).await.unwrap();

    let mut tx = app.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let accepted = engine
        .accept_in(&mut tx, stripe_event("evt_x"))
        .await
        .unwrap();
    assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");
    for id in ["evt_y", "evt_x"] {
        let reply = tokio::time::timeout(Duration::from_secs(30), served.deliver(id))
            .await
            .expect("the receiver answers while the caller holds the write lock");
        assert_answer(&reply, 503, "error", Some("store_unavailable"));
        assert!(reply.header("retry-after").is_some(), "{:?}", reply.headers);
    }
    tx.commit().await.unwrap();
    assert_answer(&served.deliver("evt_y").await, 200, "new", None);
    assert_answer(&served.deliver("evt_x").await, 200, "duplicate", None);
    assert_eq!(run_worker(&engine).await, 2);
    for id in ["evt_x", "evt_y"] {
        assert_eq!(probe.runs(id, "first").await, 1, "{id} ran once");
    }
}

/// An event that waits may match is accepted in a transaction of its own,
/// not by the flushers; it too is told at once that a caller's open
/// transaction holds its key, instead of waiting (and holding a pooled
/// connection) until that transaction ends. Rolled back, the retry records
/// it.
#[tokio::test]
async fn postgres_a_matchable_events_copy_does_not_wait_for_the_callers_transaction() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let handlers = Handlers::new()
        .on(
            "shop",
            "order.created",
            Handler::new().wait(
                "paid",
                WaitFor::event("shop", "payment.done")
                    .matching("/id")
                    .timeout(Duration::from_secs(3600)),
            ),
        )
        .on(
            "shop",
            "payment.done",
            Handler::new().named_step("record", Record::default()),
        );
    let engine = conformance::engine(&db, handlers);
    let payment = || NewEvent::with_id("shop", "p-1", "payment.done", json!({ "id": 1 }));
    let app = PgPoolOptions::new().connect(&db.url).await.unwrap();
    let mut tx = app.begin().await.unwrap();
    let accepted = engine.accept_in(&mut tx, payment()).await.unwrap();
    assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");

    let copy = tokio::time::timeout(Duration::from_secs(10), engine.accept(payment()))
        .await
        .expect("the copy does not wait for the caller's transaction");
    assert!(
        matches!(copy, Err(StoreError::AcceptInProgress)),
        "{copy:?}"
    );
    tx.rollback().await.unwrap();
    let retry = engine.accept(payment()).await.unwrap();
    assert!(matches!(retry, Accepted::New { .. }), "{retry:?}");
    assert_eq!(run_worker(&engine).await, 1);
    assert_eq!(db.probe.runs("p-1", "record").await, 1);
}

/// A debounced accept runs in a transaction of its own under its debounce
/// key's lock; a copy of a key held by a caller's open transaction (the
/// same id under a kind whose handler debounces) is told at once too,
/// rather than waiting there and holding up the debounce key's other
/// accepts. (Multi-threaded: the duplicate's connection goes back to the
/// pool with a rollback pending, which the pool sends on a task of the
/// runtime while the schema's cleanup blocks the test's thread.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_debounced_copy_does_not_wait_for_the_callers_transaction() {
    let Some((_schema, pool, engine, _probe)) = postgres_app().await else {
        return;
    };
    let mut tx = pool.begin().await.unwrap();
    let accepted = engine.accept_in(&mut tx, paid("evt_1")).await.unwrap();
    assert!(matches!(accepted, Accepted::New { .. }), "{accepted:?}");
    let stock = || NewEvent::with_id("shop", "evt_1", "stock.changed", json!({ "sku": "A" }));
    let copy = tokio::time::timeout(Duration::from_secs(10), engine.accept(stock()))
        .await
        .expect("the copy does not wait for the caller's transaction");
    assert!(
        matches!(copy, Err(StoreError::AcceptInProgress)),
        "{copy:?}"
    );
    // Another event of the same debounce key is not held up.
    let other = NewEvent::with_id("shop", "evt_2", "stock.changed", json!({ "sku": "A" }));
    let other = tokio::time::timeout(Duration::from_secs(10), engine.accept(other))
        .await
        .expect("the debounce key's other accepts do not wait");
    assert!(matches!(other, Ok(Accepted::New { .. })), "{other:?}");
    tx.commit().await.unwrap();
    assert_eq!(engine.accept(stock()).await.unwrap(), Accepted::Duplicate);
}
