//! Fencing: a worker whose lease was taken over, or expired, changes nothing
//! (guarantee 5).

use std::time::Duration;

use chrono::Utc;
use tickmark::{EventState, Handler, Handlers, StoreError};
use tickmark_driver::store::{AfterFailure, ClaimParams, ClaimedEvent, MarkDone, MarkFailed};
use tokio_util::sync::CancellationToken;

use super::{engine, order_paid, quick_worker};
use crate::test_steps::{Record, WaitForCancel};
use crate::{wait, TestDb};

fn handlers() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", Record::default())
            .named_step("second", Record::default()),
    )
}

async fn claim_one(db: &TestDb, worker: &str) -> ClaimedEvent {
    let mut claimed = db
        .store
        .event_claim_many(&ClaimParams::new(worker, 1, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "{worker} claims one event");
    claimed.remove(0)
}

fn done_mark(claimed: &ClaimedEvent) -> MarkDone<'static> {
    let now = Utc::now();
    MarkDone {
        lease: claimed.lease,
        position: 0,
        step: "first",
        attempt: claimed.attempt,
        started_at: now,
        finished_at: now,
        output_json: "{}",
        skipped: false,
    }
}

fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost { .. })),
        "{what}: expected LeaseLost, got {result:?}"
    );
}

/// Guarantee 5: after a takeover the old worker's marks, heartbeats, releases
/// and parks are all refused; the new worker's are accepted.
pub async fn a_taken_over_lease_can_neither_mark_nor_heartbeat(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_fence").await;
    let old = claim_one(&db, "old").await;
    db.probe.expire_lease(old.lease.event_seq).await;
    let new = claim_one(&db, "new").await;
    assert!(new.took_over);
    assert_ne!(
        old.lease.token, new.lease.token,
        "a claim changes the fencing token"
    );
    assert_eq!(new.attempt, 2);

    assert_lease_lost(
        db.store.step_mark_done(&done_mark(&old), None).await,
        "old mark done",
    );
    let now = Utc::now();
    let failed = MarkFailed {
        lease: old.lease,
        position: 0,
        step: "first",
        attempt: 1,
        started_at: now,
        finished_at: now,
        error: "zombie",
        then: AfterFailure::RetryIn(Duration::from_secs(1)),
    };
    assert_lease_lost(db.store.step_mark_failed(&failed).await, "old mark failed");
    assert_lease_lost(
        db.store
            .event_release(&old.lease, &tickmark_driver::store::Release::now(true))
            .await,
        "old release",
    );
    assert_lease_lost(db.store.event_park(&old.lease, "zombie").await, "old park");
    let renewed = db
        .store
        .event_heartbeat_many(&[old.lease, new.lease], Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        renewed,
        vec![new.lease.event_seq],
        "only the new lease is renewed"
    );

    db.store
        .step_mark_done(&done_mark(&new), None)
        .await
        .unwrap();
    let record = db
        .store
        .event_get(new.lease.event_seq)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.next_step, 1);
    assert_eq!(record.lease_owner.as_deref(), Some("new"));
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT lease_token FROM tickmark_steps WHERE event_seq = {}",
                new.lease.event_seq
            ))
            .await,
        new.lease.token
    );
}

/// Guarantee 5 for a retried mark: a mark whose commit answer was lost is
/// sent again. While the lease is still the event's, the retry is confirmed;
/// once another worker took the event over, it is `LeaseLost`, so the old
/// worker stops instead of running the next step (the simulator's seed
/// 100038, docs/simulation.md).
pub async fn a_retried_mark_is_confirmed_only_while_its_lease_holds(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_retried_mark").await;
    let old = claim_one(&db, "old").await;
    let mark = done_mark(&old);
    db.store.step_mark_done(&mark, None).await.unwrap();
    db.store
        .step_mark_done(&mark, None)
        .await
        .expect("the same mark again, lease held: confirmed");

    db.probe.expire_lease(old.lease.event_seq).await;
    let new = claim_one(&db, "new").await;
    assert!(new.took_over);
    assert_eq!(new.next_step, 1, "the first mark stands");
    assert_lease_lost(
        db.store.step_mark_done(&mark, None).await,
        "the same mark again after a takeover",
    );
}

/// Guarantee 5, without a rival: an expired lease is not revived by a late
/// heartbeat, and a late mark is refused.
pub async fn an_expired_lease_cannot_mark_even_before_a_takeover(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_late").await;
    let slow = claim_one(&db, "slow").await;
    db.probe.expire_lease(slow.lease.event_seq).await;
    let renewed = db
        .store
        .event_heartbeat_many(&[slow.lease], Duration::from_secs(30))
        .await
        .unwrap();
    assert!(renewed.is_empty());
    assert_lease_lost(
        db.store.step_mark_done(&done_mark(&slow), None).await,
        "late mark",
    );
    let record = db
        .store
        .event_get(slow.lease.event_seq)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.state, record.next_step), (EventState::Running, 0));
}

/// Guarantee 6 under fencing: when a transactional step's mark is refused,
/// the step's own writes roll back with it.
pub async fn a_refused_transactional_mark_rolls_back_the_steps_writes(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_rollback").await;
    let claimed = claim_one(&db, "doomed").await;
    db.probe.expire_lease(claimed.lease.event_seq).await;

    let mut tx = db.store.step_transaction_begin().await.unwrap();
    if let Some(conn) = tx.postgres() {
        sqlx::query("INSERT INTO test_ledger (event_id, amount) VALUES ('evt_rollback', 1)")
            .execute(conn)
            .await
            .unwrap();
    } else if let Some(conn) = tx.sqlite() {
        sqlx::query("INSERT INTO test_ledger (event_id, amount) VALUES ('evt_rollback', 1)")
            .execute(conn)
            .await
            .unwrap();
    }
    assert_lease_lost(
        db.store
            .step_mark_done(&done_mark(&claimed), Some(tx))
            .await,
        "transactional mark after expiry",
    );
    assert_eq!(db.probe.ledger_rows("evt_rollback").await, 0);
}

/// Guarantee 5, end to end: a worker whose lease is taken over while its step
/// runs learns it from the heartbeat, cancels the step, marks nothing and stops.
pub async fn a_worker_that_loses_its_lease_stops_its_step(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", WaitForCancel),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_zombie").await;
    let worker = engine
        .worker(quick_worker("zombie"))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait::until("the step starts", Duration::from_secs(20), || async {
        db.probe.runs("evt_zombie", "first").await == 1
    })
    .await;

    let seq = db
        .store
        .event_find("shop", "evt_zombie")
        .await
        .unwrap()
        .unwrap()
        .event
        .seq;
    db.probe.expire_lease(seq).await;
    let thief = claim_one(&db, "thief").await;
    assert!(thief.took_over);

    tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.leases_lost >= 1),
    )
    .await
    .expect("the zombie notices its lost lease")
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.in_flight == 0),
    )
    .await
    .expect("the zombie's step stops")
    .unwrap();
    shutdown.cancel();
    running.await.unwrap().unwrap();

    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Running);
    assert_eq!(record.lease_owner.as_deref(), Some("thief"));
    assert_eq!(record.lease_token, thief.lease.token);
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_steps WHERE event_seq = {seq}"
            ))
            .await,
        0,
        "the zombie marked nothing"
    );
}
