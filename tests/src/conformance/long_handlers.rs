//! Long handlers: per-step timeouts and retry policies, progress, snoozes,
//! delayed events, cancellation.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tickmark::operator::Operations;
use tickmark::{EventState, Handler, Handlers, NewEvent, RetryPolicy, StepOptions, StepState};
use tokio_util::sync::CancellationToken;

use super::{engine, order_paid, quick_worker};
use crate::test_steps::{Flaky, Record, ReportProgress, SnoozeOnce};
use crate::{wait, TestDb};

fn quick(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        jitter: 0.0,
        ..RetryPolicy::attempts(max_attempts)
            .delays(Duration::from_millis(20), Duration::from_millis(40))
    }
}

/// A step that runs past its timeout fails retryably, and its retries run out.
pub async fn a_step_that_times_out_is_a_retryable_failure(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step_with(
            "slow",
            Record {
                pause_ms: 10_000,
                ..Record::default()
            },
            StepOptions::timeout(Duration::from_millis(200)).retry(quick(2)),
        ),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_timeout").await;
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.steps_failed, stats.events_dead), (2, 1));
    let record = db
        .store
        .event_find("shop", "evt_timeout")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Dead);
    assert!(
        record
            .last_error
            .as_deref()
            .unwrap()
            .contains("timed out after 0.2 s"),
        "{:?}",
        record.last_error
    );
    assert_eq!(db.probe.runs("evt_timeout", "slow").await, 2);
}

/// A step's own retry policy replaces the handler's for that step only.
pub async fn a_steps_own_retry_policy_overrides_the_handlers(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step(
                "patient",
                Flaky {
                    fail_first: 3,
                    terminal: false,
                },
            )
            .named_step_with(
                "impatient",
                Flaky {
                    fail_first: 99,
                    terminal: false,
                },
                StepOptions::default().retry(quick(2)),
            )
            .retry(quick(5)),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_policy").await;
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let record = db
        .store
        .event_find("shop", "evt_policy")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Dead);
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    assert_eq!(
        (steps[0].state, steps[0].attempts),
        (StepState::Done, 4),
        "the handler's 5 attempts"
    );
    assert_eq!(
        (steps[1].state, steps[1].attempts),
        (StepState::Dead, 2),
        "its own 2 attempts"
    );
}

/// Progress reported by a running step shows in the step-status table, and
/// is cleared once the step is marked.
pub async fn progress_shows_in_the_step_status_table_while_the_step_runs(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step(
            "render",
            ReportProgress {
                fraction: 0.5,
                message: "page 3 of 6".into(),
                pause_ms: 1_500,
            },
        ),
    );
    let engine = engine(&db, handlers);
    let tickmark::Accepted::New { seq } = order_paid(&engine, "evt_progress").await else {
        panic!("new")
    };
    let worker = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings");
    let running = tokio::spawn(worker.run_until_idle());
    wait::until("progress is visible", Duration::from_secs(20), || async {
        let steps = db.store.step_status(seq).await.unwrap();
        steps[0].state == StepState::Running
            && steps[0].progress == Some(0.5)
            && steps[0].progress_message.as_deref() == Some("page 3 of 6")
    })
    .await;
    running.await.unwrap().unwrap();
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].progress), (StepState::Done, None));
}

/// A snooze runs the step again later without spending an attempt: with a
/// single attempt allowed, a snoozed step still finishes.
pub async fn a_snoozed_step_runs_again_later_without_spending_an_attempt(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("settle", SnoozeOnce { delay_ms: 1_000 })
            .retry(quick(1)),
    );
    let engine = engine(&db, handlers);
    let tickmark::Accepted::New { seq } = order_paid(&engine, "evt_snooze").await else {
        panic!("new")
    };
    let worker = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings");
    let running = tokio::spawn(worker.run_until_idle());
    wait::until("the step is snoozed", Duration::from_secs(20), || async {
        let steps = db.store.step_status(seq).await.unwrap();
        steps[0].state == StepState::Snoozed
    })
    .await;
    let steps = db.store.step_status(seq).await.unwrap();
    assert!(steps[0].retry_at.is_some_and(|at| at > Utc::now()));
    assert!(steps[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("waiting for the payment to settle"));
    running.await.unwrap().unwrap();
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 1));
    assert_eq!(db.probe.runs("evt_snooze", "settle").await, 2);
}

/// Accepted now, run not before its time.
pub async fn a_delayed_event_runs_once_its_time_has_come(db: TestDb) {
    let engine = engine(
        &db,
        Handlers::new().on(
            "shop",
            "order.paid",
            Handler::new().named_step("first", Record::default()),
        ),
    );
    let at = Utc::now() + chrono::Duration::milliseconds(1_200);
    engine
        .accept(NewEvent::with_id("shop", "evt_at", "order.paid", json!({})).not_before(at))
        .await
        .unwrap();
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let record = db
        .store
        .event_find("shop", "evt_at")
        .await
        .unwrap()
        .unwrap();
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Done);
    assert!(
        steps[0].started_at.unwrap() >= at,
        "ran at {:?}, due {at}",
        steps[0].started_at
    );
}

/// An operator's cancel reaches the running step through its cancellation
/// token within one heartbeat; the worker marks nothing.
pub async fn a_cancelled_event_stops_its_running_step_within_a_heartbeat(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("wait", crate::test_steps::WaitForCancel),
    );
    let engine = engine(&db, handlers);
    let tickmark::Accepted::New { seq } = order_paid(&engine, "evt_cancel").await else {
        panic!("new")
    };
    let worker = engine
        .worker(quick_worker("w").with_lease(Duration::from_millis(1_500)))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait::until("the step runs", Duration::from_secs(20), || async {
        db.probe.runs("evt_cancel", "wait").await == 1
    })
    .await;
    let actor = tickmark::operator::Actor {
        who: "test",
        reason: Some("customer asked"),
    };
    db.store.event_cancel(seq, actor).await.unwrap();
    let stopped = tokio::time::timeout(
        Duration::from_secs(5),
        stats.wait_for(|s| s.leases_lost >= 1 && s.in_flight == 0),
    )
    .await
    .is_ok();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert!(
        stopped,
        "the step was not cancelled within a heartbeat (0.5 s) and some slack"
    );
    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Cancelled);
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_steps WHERE event_id = {seq}"
            ))
            .await,
        0
    );
}
