//! The inbox: one insert is the dedup decision (guarantees 1 and 2).

use std::time::Duration;

use serde_json::json;
use tickmark::{Accepted, EventState, Handler, Handlers, NewEvent};
use tickmark_driver::store::ClaimParams;

use super::{engine, quick_worker};
use crate::test_steps::Record;
use crate::TestDb;

fn one_step() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", Record::default()),
    )
}

/// Guarantee 2: of 100 concurrent accepts of one id, exactly one is new.
pub async fn concurrent_duplicate_accepts_yield_one_new(db: TestDb) {
    let engine = engine(&db, one_step());
    let accepts = (0..100).map(|_| {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .accept(NewEvent::with_id(
                    "shop",
                    "evt_race",
                    "order.paid",
                    json!({}),
                ))
                .await
                .expect("accept")
        })
    });
    let mut new = 0;
    let mut duplicate = 0;
    for accept in accepts.collect::<Vec<_>>() {
        match accept.await.expect("task") {
            Accepted::New { .. } => new += 1,
            Accepted::Duplicate => duplicate += 1,
            Accepted::Ignored { .. } => panic!("a handler is registered"),
        }
    }
    assert_eq!((new, duplicate), (1, 99));
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE dedup_key = 'evt_race'")
            .await,
        1
    );
}

/// Guarantee 1: a redelivery after the steps ran is a duplicate and runs nothing.
pub async fn a_duplicate_delivery_never_reruns_a_step(db: TestDb) {
    let engine = engine(&db, one_step());
    let event = || NewEvent::with_id("shop", "evt_dup", "order.paid", json!({"n": 1}));
    assert!(engine.accept(event()).await.unwrap().is_new());
    engine
        .worker(quick_worker("w1"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(db.probe.runs("evt_dup", "first").await, 1);

    for _ in 0..3 {
        assert_eq!(engine.accept(event()).await.unwrap(), Accepted::Duplicate);
    }
    let stats = engine
        .worker(quick_worker("w2"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.claimed, 0, "nothing to claim after duplicates");
    assert_eq!(db.probe.runs("evt_dup", "first").await, 1);
}

/// With no provider id, the key is `sha256:` of the raw body.
pub async fn events_without_an_id_are_deduplicated_by_body_hash(db: TestDb) {
    let engine = engine(&db, one_step());
    let body = br#"{"amount":5}"#;
    let first = engine
        .accept(NewEvent::from_body(
            "shop",
            "order.paid",
            body,
            json!({"amount": 5}),
        ))
        .await
        .unwrap();
    let again = engine
        .accept(NewEvent::from_body(
            "shop",
            "order.paid",
            body,
            json!({"amount": 5}),
        ))
        .await
        .unwrap();
    let other = engine
        .accept(NewEvent::from_body(
            "shop",
            "order.paid",
            br#"{"amount":6}"#,
            json!({"amount": 6}),
        ))
        .await
        .unwrap();
    assert!(first.is_new());
    assert_eq!(again, Accepted::Duplicate);
    assert!(other.is_new());
    let key = tickmark::inbox::body_hash(body);
    let record = db
        .store
        .event_find("shop", &key)
        .await
        .unwrap()
        .expect("stored by hash");
    assert!(record.event.id.starts_with("sha256:"));
}

/// A kind with no handler is recorded (so redeliveries are duplicates) and never runs.
pub async fn an_event_without_handler_is_recorded_as_ignored(db: TestDb) {
    let engine = engine(&db, one_step());
    let event = || NewEvent::with_id("shop", "evt_other", "order.refunded", json!({}));
    let Accepted::Ignored { seq } = engine.accept(event()).await.unwrap() else {
        panic!("expected Ignored")
    };
    assert_eq!(engine.accept(event()).await.unwrap(), Accepted::Duplicate);
    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Ignored);
    assert_eq!(db.store.event_count_active().await.unwrap(), 0);
    assert!(db.store.step_status(seq).await.unwrap().is_empty());
}

/// `not_before` delays the first claim.
pub async fn a_delayed_event_is_not_claimed_before_its_time(db: TestDb) {
    let engine = engine(&db, one_step());
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    engine
        .accept(NewEvent::with_id("shop", "evt_later", "order.paid", json!({})).not_before(later))
        .await
        .unwrap();
    let claimed = db
        .store
        .event_claim_many(&ClaimParams::new("w", 10, Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(claimed.is_empty());
    assert_eq!(db.store.event_count_active().await.unwrap(), 1);
    let due = db
        .store
        .event_next_due()
        .await
        .unwrap()
        .expect("one active");
    assert!(
        due > Duration::from_secs(3500),
        "due in about an hour, got {due:?}"
    );
}
