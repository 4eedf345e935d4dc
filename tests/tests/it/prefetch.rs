//! Events claimed ahead (prefetched) are never held hostage: once they have
//! waited a heartbeat interval behind slow work they are given back for
//! other workers to run, and at shutdown they are given back within the
//! grace period even when the store does not answer (here: their rows
//! locked by another session on real PostgreSQL).
//!
//! Both tests first make the worker's pace quick (20 quick events), so that
//! it claims ahead, then give it one slow event with 8 quick ones behind it
//! on a single slot: the slow one runs, the 8 wait in its queue.

use std::time::Duration;

use sqlx::{Connection, Executor};
use tickmark::{Backend, Engine, Handler, Handlers, NewEvent, WorkerConfig, WorkerStats};
use tickmark_tests::conformance::engine;
use tickmark_tests::test_steps::Record;
use tickmark_tests::{wait, TestDb};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Quick `order.paid` events, and `order.slow` ones that run for ten minutes
/// on their first attempt (or until cancelled).
fn quick_and_slow() -> Handlers {
    Handlers::new()
        .on(
            "shop",
            "order.paid",
            Handler::new().named_step("first", Record::default()),
        )
        .on(
            "shop",
            "order.slow",
            Handler::new().named_step(
                "first",
                Record {
                    first_attempt_pause_ms: 600_000,
                    ..Record::default()
                },
            ),
        )
}

async fn accept(engine: &Engine, id: &str, kind: &str) {
    engine
        .accept(NewEvent::with_id("shop", id, kind, serde_json::json!({})))
        .await
        .expect("accept");
}

/// One slot, claiming up to 8 ahead.
fn one_slot(name: &str, lease: Duration) -> WorkerConfig {
    WorkerConfig::default()
        .with_name(name)
        .with_lease(lease)
        .with_poll_every(Duration::from_millis(200))
        .with_grace(Duration::from_secs(1))
        .with_concurrency(1)
        .with_prefetch(8)
}

/// Until `stats` says `what`, at most 30 s. (The `watch::Ref` is dropped at
/// once: held, it would block the worker's signals.)
async fn until(
    stats: &mut watch::Receiver<WorkerStats>,
    what: &str,
    f: impl Fn(&WorkerStats) -> bool,
) {
    let reached = tokio::time::timeout(Duration::from_secs(30), stats.wait_for(|s| f(s)))
        .await
        .is_ok();
    assert!(reached, "the worker never got there: {what}");
}

/// Warm the worker's pace with 20 quick events, then queue one slow event
/// and 8 quick ones behind it; return once the slow one runs and the worker
/// has claimed all nine.
async fn slow_event_with_eight_behind(
    db: &TestDb,
    engine: &Engine,
    stats: &mut watch::Receiver<WorkerStats>,
) {
    for i in 0..20 {
        accept(engine, &format!("evt_warm_{i}"), "order.paid").await;
    }
    until(stats, "20 quick events done", |s| s.events_done >= 20).await;
    accept(engine, "evt_slow", "order.slow").await;
    wait::until("the slow event runs", Duration::from_secs(30), || async {
        db.probe.runs("evt_slow", "first").await == 1
    })
    .await;
    for i in 0..8 {
        accept(engine, &format!("evt_behind_{i}"), "order.paid").await;
    }
    until(stats, "the 8 quick events claimed behind it", |s| {
        s.claimed >= 29
    })
    .await;
}

async fn events_behind_slow_work_are_given_back_to_other_workers(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let engine = engine(&db, quick_and_slow());
    // A lease of 2 s: renewed, and so held, every 2/3 s while it waits.
    let worker = engine
        .worker(one_slot("busy", Duration::from_secs(2)))
        .unwrap();
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let busy = tokio::spawn(worker.run(shutdown.clone()));
    slow_event_with_eight_behind(&db, &engine, &mut stats).await;

    // Another worker: it can run the 8 only once the busy worker gives them
    // back (its slow event runs on).
    let other = engine
        .worker(one_slot("other", Duration::from_secs(2)))
        .unwrap();
    let other = tokio::spawn(other.run(shutdown.clone()));
    wait::until(
        "another worker runs the events the busy one held",
        Duration::from_secs(30),
        || async {
            let mut all = true;
            for i in 0..8 {
                all &= db.probe.runs(&format!("evt_behind_{i}"), "first").await == 1;
            }
            all
        },
    )
    .await;
    assert_eq!(
        db.probe.runs("evt_slow", "first").await,
        1,
        "the slow event still runs, once"
    );
    shutdown.cancel();
    busy.await.unwrap().unwrap();
    other.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_events_behind_slow_work_are_given_back_to_other_workers() {
    events_behind_slow_work_are_given_back_to_other_workers(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_events_behind_slow_work_are_given_back_to_other_workers() {
    events_behind_slow_work_are_given_back_to_other_workers(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shutdown_gives_prefetched_events_back_within_its_grace() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let engine = engine(&db, quick_and_slow());
    // A lease of a minute: the 8 wait behind the slow event without being
    // handed back (that takes a heartbeat interval, 20 s) before the stop.
    let worker = engine
        .worker(one_slot("stopping", Duration::from_secs(60)))
        .unwrap();
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    slow_event_with_eight_behind(&db, &engine, &mut stats).await;

    // Another session locks the 8 rows: giving them back waits on it.
    let mut locker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute("SELECT 1 FROM tickmark_events WHERE dedup_key LIKE 'evt_behind_%' FOR UPDATE")
        .await
        .unwrap();

    shutdown.cancel();
    // Grace 1 s for the releases, 1 s for the slow step, then it is cancelled.
    let stopped = tokio::time::timeout(Duration::from_secs(20), running).await;
    assert!(
        stopped.is_ok(),
        "the worker's shutdown waited on a store that does not answer"
    );
    stopped.unwrap().unwrap().unwrap();
    locker.execute("ROLLBACK").await.unwrap();
}
