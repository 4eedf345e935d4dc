//! Exact blame for a crash (docs/guarantees.md): a run lost with a lease
//! taken in a batch is refunded, not charged; the lease gets one second
//! chance in a batch, and is then a suspect, which only a claim alone takes
//! over; a crash while it was held alone is charged.

use std::time::Duration;

use tickmark::{Handler, Handlers, StepState};
use tickmark_driver::store::ClaimParams;

use super::{engine, order_paid, quick_worker};
use crate::test_steps::Record;
use crate::TestDb;

pub(super) fn one_step() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", Record::default()),
    )
}

pub(super) fn batch(worker: &str) -> ClaimParams<'_> {
    ClaimParams {
        alone: false,
        ..ClaimParams::new(worker, 10, Duration::from_secs(30))
    }
}

pub(super) fn suspects_alone(worker: &str) -> ClaimParams<'_> {
    ClaimParams {
        alone: true,
        pending: false,
        ..ClaimParams::new(worker, 1, Duration::from_secs(30))
    }
}

/// The attempts charged to an event (`attempt - interrupted`).
pub(super) async fn charged(db: &TestDb, seq: i64) -> i64 {
    db.probe
        .scalar(&format!(
            "SELECT CAST(attempt - interrupted AS BIGINT) FROM tickmark_events WHERE id = {seq}"
        ))
        .await
}

/// A batch lease that expires gets one second chance in a batch,
/// uncharged; lost again it is a suspect, which a batch claim leaves and a
/// claim alone takes, one at a time, still uncharged; a lease held alone
/// that expires is charged. Every claim counts a run in `attempt`.
pub async fn a_lease_lost_beside_others_is_refunded_and_one_held_alone_is_charged(db: TestDb) {
    let engine = engine(&db, one_step());
    for id in ["evt_a", "evt_b", "evt_c"] {
        order_paid(&engine, id).await;
    }
    let claimed = db.store.event_claim_many(&batch("doomed")).await.unwrap();
    assert_eq!(claimed.len(), 3);
    assert!(claimed
        .iter()
        .all(|c| (c.attempt, c.charged_attempt(), c.took_over) == (1, 1, false)));
    assert_eq!(db.store.event_suspect_waits().await.unwrap(), None);
    for event in &claimed {
        db.probe.expire_lease(event.lease.event_seq).await;
    }
    assert_eq!(
        db.store.event_suspect_waits().await.unwrap(),
        None,
        "lost once in a batch: not a suspect yet"
    );

    // The second chance: a batch claim takes them over, uncharged.
    let second = db.store.event_claim_many(&batch("second")).await.unwrap();
    assert_eq!(second.len(), 3, "a batch claim takes a first loss over");
    for event in &second {
        assert!(event.took_over);
        assert_eq!(
            (event.attempt, event.interrupted, event.charged_attempt()),
            (2, 1, 1),
            "a second run, the lost one refunded"
        );
        db.probe.expire_lease(event.lease.event_seq).await;
    }
    assert!(db.store.event_suspect_waits().await.unwrap().is_some());
    let again = db.store.event_claim_many(&batch("other")).await.unwrap();
    assert!(
        again.is_empty(),
        "a batch claim takes no suspect: {again:?}"
    );

    let mut seqs = Vec::new();
    for _ in 0..3 {
        let mut one = db
            .store
            .event_claim_many(&suspects_alone("rescuer"))
            .await
            .unwrap();
        assert_eq!(one.len(), 1, "a claim alone takes one suspect");
        let one = one.remove(0);
        assert!(one.took_over);
        assert_eq!(
            (one.attempt, one.charged_attempt()),
            (3, 1),
            "the runs lost beside others are refunded"
        );
        seqs.push(one.lease.event_seq);
    }
    seqs.sort_unstable();
    let mut expected: Vec<i64> = claimed.iter().map(|c| c.lease.event_seq).collect();
    expected.sort_unstable();
    assert_eq!(seqs, expected);
    assert_eq!(db.store.event_suspect_waits().await.unwrap(), None);
    assert!(db
        .store
        .event_claim_many(&suspects_alone("rescuer"))
        .await
        .unwrap()
        .is_empty());

    // The rescuer, holding one of them alone, dies too: that crash is its own.
    db.probe.expire_lease(seqs[0]).await;
    assert!(
        db.store
            .event_claim_many(&batch("other"))
            .await
            .unwrap()
            .is_empty(),
        "a lease held alone is a suspect at once"
    );
    let retaken = db
        .store
        .event_claim_many(&suspects_alone("second rescuer"))
        .await
        .unwrap();
    assert_eq!(retaken.len(), 1);
    assert_eq!(retaken[0].lease.event_seq, seqs[0]);
    assert_eq!(
        (retaken[0].attempt, retaken[0].charged_attempt()),
        (4, 2),
        "a crash while held alone is charged"
    );
    assert_eq!(charged(&db, seqs[0]).await, 2);
    let record = db.store.event_get(seqs[0]).await.unwrap().unwrap();
    assert_eq!((record.takeovers, record.attempt), (3, 4));
}

/// A worker finishes the suspects of a twice-dead batch, taking each over
/// alone: the step-status table shows their three runs, and none of them
/// was charged more than the one attempt that succeeded.
pub async fn a_worker_runs_the_suspects_of_a_dead_batch_without_charging_them(db: TestDb) {
    let engine = engine(&db, one_step());
    for id in ["evt_a", "evt_b", "evt_c", "evt_d"] {
        order_paid(&engine, id).await;
    }
    let claimed = db.store.event_claim_many(&batch("doomed")).await.unwrap();
    assert_eq!(claimed.len(), 4);
    for event in &claimed {
        db.probe.expire_lease(event.lease.event_seq).await;
    }
    let second = db
        .store
        .event_claim_many(&batch("doomed too"))
        .await
        .unwrap();
    assert_eq!(second.len(), 4);
    for event in &second {
        db.probe.expire_lease(event.lease.event_seq).await;
    }
    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.takeovers, stats.events_done), (4, 4));
    for event in &claimed {
        let seq = event.lease.event_seq;
        let steps = db.store.step_status(seq).await.unwrap();
        assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 3));
        assert_eq!(charged(&db, seq).await, 1, "never charged a crash");
    }
}
