//! Running steps: order, keys, outputs, transactional effects, resuming
//! (guarantees 3, 4 and 6).

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tickmark::{EventState, Handler, Handlers, NewEvent, StepState};
use tickmark_driver::store::{ClaimParams, MarkDone};
use tokio_util::sync::CancellationToken;

use super::{engine, order_paid, quick_worker};
use crate::test_steps::{Credit, Record};
use crate::TestDb;

fn three_steps() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", Record::default())
            .named_step("second", Record::default())
            .named_step("third", Record::default()),
    )
}

fn claim_params(worker: &str) -> ClaimParams<'_> {
    ClaimParams::new(worker, 10, Duration::from_secs(30))
}

/// Steps run once each, in order; each has its key; later steps see earlier outputs.
pub async fn steps_run_in_order_with_keys_and_earlier_outputs(db: TestDb) {
    let engine = engine(&db, three_steps());
    let tickmark::Accepted::New { seq } = order_paid(&engine, "evt_order").await else {
        panic!("new")
    };
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();

    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Done);
    assert_eq!(record.next_step, 3);
    assert!(record.finished_at.is_some());

    let steps = db.store.step_status(seq).await.unwrap();
    let names: Vec<_> = steps.iter().map(|s| s.step.as_str()).collect();
    assert_eq!(names, ["first", "second", "third"]);
    for (position, step) in steps.iter().enumerate() {
        assert_eq!(step.state, StepState::Done);
        assert_eq!(step.attempts, 1);
        assert_eq!(step.position as usize, position);
        let expected_key = format!("shop:evt_order:{}", step.step);
        assert_eq!(step.idempotency_key, expected_key, "the view's key");
        let output = step.output.as_ref().expect("output stored");
        assert_eq!(output["key"], expected_key, "the key the step saw");
        assert!(step.started_at.unwrap() <= step.finished_at.unwrap());
        assert_eq!(db.probe.runs("evt_order", &step.step).await, 1);
    }
    assert_eq!(
        steps[2].output.as_ref().unwrap()["seen"],
        json!(["first", "second"])
    );
}

/// The step-status table is a view anyone can query with plain SQL.
pub async fn the_step_status_view_is_readable_with_plain_sql(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_sql").await;
    let count = |state: &'static str| {
        let probe = db.probe.clone();
        async move {
            probe
                .scalar(&format!(
                    "SELECT count(*) FROM tickmark_step_status WHERE event_id = 'evt_sql' AND state = '{state}'"
                ))
                .await
        }
    };
    assert_eq!(count("pending").await, 3);
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(count("done").await, 3);
    let key = db
        .probe
        .text("SELECT idempotency_key FROM tickmark_step_status WHERE event_id = 'evt_sql' AND position = 1")
        .await;
    assert_eq!(key.as_deref(), Some("shop:evt_sql:second"));
}

/// Guarantee 6: a transactional step's write commits with its mark, once.
pub async fn a_transactional_steps_effect_commits_with_its_mark(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("credit", Credit { amount: 250 })
            .named_step("second", Record::default()),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_credit").await;
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(db.probe.ledger_rows("evt_credit").await, 1);
    assert_eq!(
        db.probe
            .scalar("SELECT CAST(coalesce(sum(amount), 0) AS BIGINT) FROM test_ledger WHERE event_id = 'evt_credit'")
            .await,
        250
    );
    let record = db
        .store
        .event_find("shop", "evt_credit")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Done);
}

/// Guarantees 3 and 4: after a crash, the next claim resumes at the first
/// unfinished step; a step marked done is not run again, and its stored
/// output reaches the later steps.
pub async fn a_crash_after_a_mark_resumes_at_the_first_unfinished_step(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_resume").await;
    // A worker claims, finishes step 1 and marks it... then dies.
    let claimed = db
        .store
        .event_claim_many(&claim_params("doomed"))
        .await
        .unwrap();
    let claimed = claimed.into_iter().next().expect("claimed");
    let now = Utc::now();
    db.store
        .step_mark_done(
            &MarkDone {
                lease: claimed.lease,
                position: 0,
                step: "first",
                attempt: 1,
                started_at: now,
                finished_at: now,
                output_json: r#"{"from":"the dead worker"}"#,
                skipped: false,
            },
            None,
        )
        .await
        .unwrap();
    db.probe.expire_lease(claimed.lease.event_seq).await;

    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.takeovers, 1);
    assert_eq!(
        db.probe.runs("evt_resume", "first").await,
        0,
        "done step not re-run"
    );
    assert_eq!(db.probe.runs("evt_resume", "second").await, 1);
    assert_eq!(db.probe.runs("evt_resume", "third").await, 1);
    let steps = db.store.step_status(claimed.lease.event_seq).await.unwrap();
    assert_eq!(steps[0].output, Some(json!({"from": "the dead worker"})));
    assert_eq!(
        steps[2].output.as_ref().unwrap()["seen"],
        json!(["first", "second"])
    );
    let record = db
        .store
        .event_get(claimed.lease.event_seq)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.state, record.takeovers), (EventState::Done, 1));
}

/// A step whose worker died is shown as interrupted (derived, not written),
/// then runs again with the same key and a counted attempt.
pub async fn an_interrupted_step_is_shown_then_rerun_with_the_same_key(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_int").await;
    let claimed = db
        .store
        .event_claim_many(&claim_params("doomed"))
        .await
        .unwrap();
    let seq = claimed[0].lease.event_seq;
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Running);
    assert_eq!(steps[0].worker.as_deref(), Some("doomed"));
    assert_eq!(steps[1].state, StepState::Pending);

    db.probe.expire_lease(seq).await;
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Interrupted);
    assert_eq!(steps[0].attempts, 1);

    engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Done);
    assert_eq!(steps[0].attempts, 2, "the interrupted attempt counts");
    assert_eq!(
        steps[0].output.as_ref().unwrap()["key"],
        "shop:evt_int:first"
    );
}

/// Idle workers sleep until woken (LISTEN/NOTIFY, or the in-process signal),
/// not until their next poll.
pub async fn an_accepted_event_wakes_an_idle_worker_without_polling(db: TestDb) {
    let engine = engine(&db, three_steps());
    let worker = engine
        .worker(quick_worker("sleeper").with_poll_every(Duration::from_secs(120)))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    stats.wait_for(|s| s.idle_waits >= 1).await.unwrap();

    order_paid(&engine, "evt_wake").await;
    // (Keep no `watch::Ref` alive across an await: it would block the worker.)
    let woke = tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.events_done == 1),
    )
    .await
    .is_ok();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert!(woke, "the event waited for the 120 s poll: no wake-up");
}

/// One claim leases many events, each with its own fencing token.
pub async fn a_claim_leases_many_events_at_once(db: TestDb) {
    let engine = engine(&db, three_steps());
    for n in 0..5 {
        engine
            .accept(NewEvent::with_id(
                "shop",
                format!("evt_batch_{n}"),
                "order.paid",
                json!({}),
            ))
            .await
            .unwrap();
    }
    let claimed = db
        .store
        .event_claim_many(&claim_params("batcher"))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 5);
    let mut order: Vec<i64> = claimed.iter().map(|c| c.lease.event_seq).collect();
    order.sort_unstable();
    order.dedup();
    assert_eq!(order.len(), 5);
    assert!(claimed.iter().all(|c| c.attempt == 1 && !c.took_over));
    let again = db
        .store
        .event_claim_many(&claim_params("other"))
        .await
        .unwrap();
    assert!(again.is_empty(), "leased events are not claimable");
}

/// A step that runs far longer than the lease keeps it: the heartbeat extends
/// it, nobody takes the event over, and the step runs once.
///
/// The margin is wide on purpose. A lease is lost, correctly, when its
/// heartbeat comes later than the lease allows, so "no takeover" holds only
/// while the heartbeat (every third of the lease) is at most two thirds of a
/// lease late. With a 3 s lease that is 2 s of slack for a starved task or a
/// slow statement on a loaded two-core machine (a 900 ms lease left 600 ms);
/// the step still runs 2.5 leases, so without renewals its lease would have
/// run out twice over.
pub async fn a_step_longer_than_its_lease_keeps_it_by_heartbeat(db: TestDb) {
    let lease = Duration::from_secs(3);
    let pause = lease * 5 / 2;
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step(
            "first",
            Record {
                pause_ms: u64::try_from(pause.as_millis()).expect("a short pause"),
                ..Record::default()
            },
        ),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_long").await;
    let config = quick_worker("patient").with_lease(lease);
    let stats = engine
        .worker(config)
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.takeovers, stats.leases_lost), (0, 0));
    assert_eq!(db.probe.runs("evt_long", "first").await, 1);
    let record = db
        .store
        .event_find("shop", "evt_long")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.state, record.takeovers), (EventState::Done, 0));
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    let ran = steps[0].finished_at.unwrap() - steps[0].started_at.unwrap();
    assert!(
        ran.to_std().unwrap_or_default() > lease * 2,
        "the step outlived its lease more than twice ({ran})"
    );
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 1));
}
