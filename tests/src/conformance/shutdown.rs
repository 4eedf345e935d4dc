//! Graceful shutdown: stop claiming, let running steps finish within the grace
//! period, give the leases back so another worker resumes at once.

use std::time::Duration;

use serde_json::json;
use tickmark::{EventState, Handler, Handlers, NewEvent};
use tokio_util::sync::CancellationToken;

use super::{engine, quick_worker};
use crate::test_steps::Record;
use crate::{wait, TestDb};

fn two_steps(first: Record) -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", first)
            .named_step("second", Record::default()),
    )
}

async fn start_then_shut_down(db: &TestDb, event_id: &str, grace: Duration, first: Record) {
    let engine = engine(db, two_steps(first));
    engine
        .accept(NewEvent::with_id("shop", event_id, "order.paid", json!({})))
        .await
        .unwrap();
    let worker = engine
        .worker(quick_worker("leaving").with_grace(grace))
        .expect("valid worker settings");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait::until("the first step starts", Duration::from_secs(20), || async {
        db.probe.runs(event_id, "first").await == 1
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("shutdown ends")
        .unwrap()
        .unwrap();
}

/// Within the grace period the running step finishes and is marked; the next
/// step does not start; the event is released, its lease and attempt given back.
pub async fn shutdown_lets_a_running_step_finish_then_releases_the_event(db: TestDb) {
    start_then_shut_down(
        &db,
        "evt_graceful",
        Duration::from_secs(20),
        Record {
            pause_ms: 500,
            ..Record::default()
        },
    )
    .await;
    let record = db
        .store
        .event_find("shop", "evt_graceful")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state,
        EventState::Pending,
        "released, not left leased"
    );
    assert_eq!((record.next_step, record.attempt), (1, 0));
    assert_eq!(db.probe.runs("evt_graceful", "second").await, 0);
    assert!(db.store.event_next_due().await.unwrap().unwrap() < Duration::from_secs(1));

    let engine = engine(&db, Handlers::new());
    engine
        .worker(quick_worker("next"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(db.probe.runs("evt_graceful", "first").await, 1);
    assert_eq!(db.probe.runs("evt_graceful", "second").await, 1);
}

/// Past the grace period the step is cancelled and the event released at once
/// (its attempt counts: the step had started).
pub async fn shutdown_past_the_grace_period_cancels_and_releases(db: TestDb) {
    start_then_shut_down(
        &db,
        "evt_cut",
        Duration::from_millis(200),
        Record {
            first_attempt_pause_ms: 600_000,
            ..Record::default()
        },
    )
    .await;
    let record = db
        .store
        .event_find("shop", "evt_cut")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Pending);
    assert_eq!((record.next_step, record.attempt), (0, 1));

    let engine = engine(&db, Handlers::new());
    engine
        .worker(quick_worker("next"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let record = db
        .store
        .event_find("shop", "evt_cut")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Done);
    assert_eq!(db.probe.runs("evt_cut", "first").await, 2);
}
