//! Retries, dead letters and parking.

use std::time::Duration;

use chrono::Utc;
use tickmark::{EventState, Handler, Handlers, RetryPolicy, StepState};
use tickmark_driver::store::{ClaimParams, EventInsert};
use tokio_util::sync::CancellationToken;

use super::{engine, order_paid, quick_worker};
use crate::test_steps::{Flaky, PanicOnce, Record};
use crate::TestDb;

fn flaky(step: Flaky, retry: RetryPolicy) -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("flaky", step).retry(retry),
    )
}

fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        jitter: 0.0,
        ..RetryPolicy::attempts(max_attempts)
            .delays(Duration::from_millis(20), Duration::from_millis(50))
    }
}

/// The retry time is a stored column computed from the stored attempt count:
/// a new process sees the same schedule and does not run early.
pub async fn a_failed_step_is_retried_on_a_stored_schedule_that_survives_a_restart(db: TestDb) {
    let policy = RetryPolicy {
        jitter: 0.0,
        ..RetryPolicy::attempts(3).delays(Duration::from_secs(3), Duration::from_secs(60))
    };
    let engine = engine(
        &db,
        flaky(
            Flaky {
                fail_first: 1,
                terminal: false,
            },
            policy,
        ),
    );
    order_paid(&engine, "evt_retry").await;
    let worker = engine
        .worker(quick_worker("before-restart"))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let failed_at = Utc::now();
    stats.wait_for(|s| s.steps_failed == 1).await.unwrap();
    shutdown.cancel();
    running.await.unwrap().unwrap();

    let before = db
        .store
        .event_find("shop", "evt_retry")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((before.state, before.attempt), (EventState::Pending, 1));
    let wait = before.due_at - failed_at;
    assert!(
        wait > chrono::Duration::milliseconds(1500) && wait <= chrono::Duration::seconds(4),
        "retry about 3 s after the failure, got {wait}"
    );
    let steps = db.store.step_status(before.event.seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Retrying);
    assert_eq!(steps[0].retry_at, Some(before.due_at));
    assert!(steps[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("planned failure 1 of 1"));

    // A restart: a new connection, a new engine. The schedule is still there.
    let store = tickmark::connect(&db.url).await.unwrap();
    let early = store
        .event_claim_many(&ClaimParams::new(
            "after-restart",
            10,
            Duration::from_secs(5),
        ))
        .await
        .unwrap();
    assert!(early.is_empty(), "not due before its stored retry time");
    let after = store
        .event_find("shop", "evt_retry")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.due_at, before.due_at, "restart kept the schedule");

    let restarted = tickmark::Engine::new(store, Handlers::new())
        .unwrap()
        .with_resource(db.probe.clone());
    restarted
        .worker(quick_worker("after-restart"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let done = db.store.event_get(before.event.seq).await.unwrap().unwrap();
    assert_eq!(done.state, EventState::Done);
    assert!(Utc::now() >= before.due_at);
    let steps = db.store.step_status(before.event.seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 2));
    assert_eq!(db.probe.runs("evt_retry", "flaky").await, 2);
}

/// After the last attempt the event is dead, with its error, and stops.
pub async fn the_event_is_dead_lettered_after_the_last_attempt(db: TestDb) {
    let engine = engine(
        &db,
        flaky(
            Flaky {
                fail_first: 99,
                terminal: false,
            },
            quick_retries(3),
        ),
    );
    order_paid(&engine, "evt_dead").await;
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.steps_failed, stats.events_dead), (3, 1));
    let record = db
        .store
        .event_find("shop", "evt_dead")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Dead);
    assert!(
        record
            .last_error
            .as_deref()
            .unwrap()
            .contains("attempt 3 of 3"),
        "{:?}",
        record.last_error
    );
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Dead, 3));
    assert_eq!(db.probe.runs("evt_dead", "flaky").await, 3);
    assert_eq!(db.store.event_count_active().await.unwrap(), 0);
}

/// A terminal failure skips the remaining attempts.
pub async fn a_terminal_failure_dead_letters_at_once(db: TestDb) {
    let engine = engine(
        &db,
        flaky(
            Flaky {
                fail_first: 99,
                terminal: true,
            },
            quick_retries(5),
        ),
    );
    order_paid(&engine, "evt_terminal").await;
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let record = db
        .store
        .event_find("shop", "evt_terminal")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Dead);
    assert!(record
        .last_error
        .as_deref()
        .unwrap()
        .contains("terminal failure"));
    assert_eq!(db.probe.runs("evt_terminal", "flaky").await, 1);
}

/// A step whose worker dies during every attempt never records a failure;
/// the attempts counted by claims still run out, and the event is dead.
pub async fn a_step_that_kills_its_worker_every_time_is_dead_lettered(db: TestDb) {
    let engine = engine(
        &db,
        flaky(
            Flaky {
                fail_first: 0,
                terminal: false,
            },
            quick_retries(2),
        ),
    );
    order_paid(&engine, "evt_poison").await;
    for worker in ["crashed-1", "crashed-2"] {
        let claimed = db
            .store
            .event_claim_many(&ClaimParams::new(worker, 1, Duration::from_secs(30)))
            .await
            .unwrap();
        db.probe.expire_lease(claimed[0].lease.event_seq).await;
    }
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let record = db
        .store
        .event_find("shop", "evt_poison")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Dead);
    assert!(record
        .last_error
        .as_deref()
        .unwrap()
        .contains("ran out of attempts"));
    assert_eq!(
        db.probe.runs("evt_poison", "flaky").await,
        0,
        "not run a third time"
    );
}

/// A panic in a step is caught: a retryable failure, and the worker lives on.
pub async fn a_panicking_step_is_a_retryable_failure(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("boom", PanicOnce)
            .retry(quick_retries(3)),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_panic").await;
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.steps_failed, stats.events_done), (1, 1));
    assert_eq!(db.probe.runs("evt_panic", "boom").await, 2);
}

/// A stored step type this build does not know parks the event with a clear
/// error: never dropped, never dead-lettered.
pub async fn an_unknown_step_type_parks_the_event(db: TestDb) {
    let engine = engine(
        &db,
        Handlers::new().on("shop", "x", Handler::new().step(Record::default())),
    );
    let plan = r#"{"version":1,"retry":{"max_attempts":3,"initial_delay":10,"max_delay":10,"multiplier":2.0,"jitter":0.0},
        "steps":[{"name":"charge","step":{"type":"test_gone_v1","config":{}}}]}"#;
    db.store
        .event_insert(&EventInsert {
            source: "shop",
            dedup_key: "evt_parked",
            kind: "order.paid",
            payload_json: "{}",
            plan_json: plan,
            step_count: 1,
            state: EventState::Pending,
            not_before: None,
            resource_key: None,
            resource_seq: None,
            replay_key: None,
            limit_key: None,
            limit_n: None,
            tenant_key: None,
            head_start_ms: 0,
            trace: None,
            subjects: None,
            debounce: None,
            match_keys: &[],
        })
        .await
        .unwrap();
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.events_parked, 1);
    let record = db
        .store
        .event_find("shop", "evt_parked")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Parked);
    let error = record.last_error.unwrap();
    assert!(
        error.contains("test_gone_v1") && error.contains("charge"),
        "{error}"
    );
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Parked);
    assert_eq!(steps[0].attempts, 0, "nothing ran");
}
