//! The heartbeat has a deadline. A renewal stuck in the database (behind a
//! pooler's queue, a hung connection, or here a row lock held by another
//! session on real PostgreSQL) must not hold the heartbeat loop: the worker
//! still sees its lease run out and cancels the step, instead of running it
//! on while another worker may take the event over.

use std::time::Duration;

use sqlx::{Connection, Executor};
use tickmark::{Handler, Handlers};
use tickmark_tests::conformance::{engine, order_paid, quick_worker};
use tickmark_tests::test_steps::WaitForCancel;
use tickmark_tests::{wait, TestDb};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_stuck_behind_a_lock_still_lets_the_lease_run_out() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", WaitForCancel),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_stuck_heartbeat").await;
    // A lease of 2 s, renewed every 2/3 s.
    let worker = engine
        .worker(quick_worker("stuck"))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait::until("the step starts", Duration::from_secs(20), || async {
        db.probe.runs("evt_stuck_heartbeat", "first").await == 1
    })
    .await;

    // Another session locks the event's row: every renewal waits on it.
    let mut locker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute("SELECT 1 FROM tickmark_events WHERE dedup_key = 'evt_stuck_heartbeat' FOR UPDATE")
        .await
        .unwrap();

    // The lease (2 s) runs out while the renewal waits: the worker cancels
    // the step and counts the lease lost, well within 20 s.
    // (`is_ok` at once: a held `watch::Ref` would block the worker's signals.)
    let lost = tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.leases_lost >= 1),
    )
    .await
    .is_ok();
    assert!(
        lost,
        "the worker never gave up a lease whose renewal is stuck behind a row lock"
    );

    locker.execute("ROLLBACK").await.unwrap();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the worker stops")
        .unwrap()
        .unwrap();
}
