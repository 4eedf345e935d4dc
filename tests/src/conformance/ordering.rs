//! Ordering: stale events are skipped, one resource runs one event at a
//! time, and concurrency limits hold (guarantee 7).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use tickmark::operator::Operations;
use tickmark::{Accepted, Engine, EventState, Handler, Handlers, NewEvent, StepState};
use tickmark_driver::store::{ClaimParams, SequenceCheck};

use super::{engine, quick_worker};
use crate::meeting::Meeting;
use crate::test_steps::Record;
use crate::TestDb;

async fn accept(engine: &Engine, id: &str, payload: serde_json::Value) -> i64 {
    match engine
        .accept(NewEvent::with_id("shop", id, "customer.updated", payload))
        .await
        .unwrap()
    {
        Accepted::New { seq } => seq,
        other => panic!("expected new, got {other:?}"),
    }
}

/// When the steps of one event ran: (started, finished).
async fn window(db: &TestDb, seq: i64) -> (DateTime<Utc>, DateTime<Utc>) {
    let steps = db.store.step_status(seq).await.unwrap();
    (
        steps[0].started_at.unwrap(),
        steps[steps.len() - 1].finished_at.unwrap(),
    )
}

/// Guarantee 7: an event whose sequence is not newer than the last one applied
/// for its resource is recorded as stale and never runs.
pub async fn stale_events_are_recorded_and_never_applied(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "customer.updated",
        Handler::new()
            .named_step("apply", Record::default())
            .skip_stale("/customer", "/version"),
    );
    let engine = engine(&db, handlers);
    let v2 = accept(
        &engine,
        "evt_v2",
        json!({"customer": "cus_1", "version": 2}),
    )
    .await;
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();

    let v1 = accept(
        &engine,
        "evt_v1",
        json!({"customer": "cus_1", "version": 1}),
    )
    .await;
    let v3 = accept(
        &engine,
        "evt_v3",
        json!({"customer": "cus_1", "version": 3}),
    )
    .await;
    let v3_again = accept(
        &engine,
        "evt_v3b",
        json!({"customer": "cus_1", "version": 3}),
    )
    .await;
    let other = accept(
        &engine,
        "evt_other",
        json!({"customer": "cus_2", "version": 1}),
    )
    .await;
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.events_stale, 2);

    for (seq, state) in [
        (v2, EventState::Done),
        (v1, EventState::Stale),
        (v3, EventState::Done),
        (v3_again, EventState::Stale),
        (other, EventState::Done),
    ] {
        let record = db.store.event_get(seq).await.unwrap().unwrap();
        assert_eq!(record.state, state, "event {}", record.event.id);
    }
    assert_eq!(
        db.probe.runs("evt_v1", "apply").await,
        0,
        "stale: never applied"
    );
    assert_eq!(db.probe.runs("evt_v3b", "apply").await, 0);
    assert_eq!(db.probe.runs("evt_v3", "apply").await, 1);
    let stale = db.store.event_get(v1).await.unwrap().unwrap();
    assert!(
        stale
            .last_error
            .as_deref()
            .unwrap()
            .contains("not newer than 2"),
        "{:?}",
        stale.last_error
    );
    let steps = db.store.step_status(v1).await.unwrap();
    assert_eq!(steps[0].state, StepState::Stale);
}

/// Guarantee 7 at the store, where staleness is decided: before an ordered
/// event's first step, its sequence is compared with the last one applied
/// for its resource. Newer applies (and becomes the last applied); older or
/// equal (from another event) is stale and the event is recorded `stale`;
/// the same event checked again (its worker crashed before step 1 was
/// marked) applies again; resources do not affect each other.
pub async fn the_sequence_check_decides_staleness_per_resource(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "customer.updated",
        Handler::new().named_step("apply", Record::default()),
    );
    let engine = engine(&db, handlers);
    let mut seqs = Vec::new();
    for n in 0..7 {
        seqs.push(accept(&engine, &format!("evt_seq_{n}"), json!({})).await);
    }
    let claimed = db
        .store
        .event_claim_many(&ClaimParams::new("checker", 10, Duration::from_secs(60)))
        .await
        .unwrap();
    let lease = |n: usize| {
        claimed
            .iter()
            .find(|c| c.lease.event_seq == seqs[n])
            .map(|c| c.lease)
            .expect("claimed")
    };
    let (cus_1, cus_2) = ("shop:cus_1", "shop:cus_2");
    let checks = [
        (0, cus_1, 5, SequenceCheck::Apply),
        (1, cus_1, 3, SequenceCheck::Stale { last_seq: 5 }),
        (2, cus_1, 5, SequenceCheck::Stale { last_seq: 5 }),
        (0, cus_1, 5, SequenceCheck::Apply),
        (3, cus_1, 6, SequenceCheck::Apply),
        (4, cus_2, 1, SequenceCheck::Apply),
        (5, cus_1, 5, SequenceCheck::Stale { last_seq: 6 }),
        (6, cus_2, i64::MIN, SequenceCheck::Stale { last_seq: 1 }),
    ];
    for (n, resource, sequence, expected) in checks {
        let checked = db
            .store
            .event_sequence_check(&lease(n), resource, sequence)
            .await
            .unwrap();
        assert_eq!(
            checked, expected,
            "event {n}, {resource} sequence {sequence}"
        );
    }
    for (n, state) in [
        (0, EventState::Running),
        (1, EventState::Stale),
        (2, EventState::Stale),
        (3, EventState::Running),
        (4, EventState::Running),
        (5, EventState::Stale),
        (6, EventState::Stale),
    ] {
        let record = db.store.event_get(seqs[n]).await.unwrap().unwrap();
        assert_eq!(record.state, state, "event {n}");
    }
    let stale = db.store.event_get(seqs[1]).await.unwrap().unwrap();
    assert!(
        stale
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("not newer than 5")),
        "{:?}",
        stale.last_error
    );
}

/// Events of one resource run one at a time, in acceptance order; other
/// resources run alongside. "Alongside" is proven by a rendezvous, not by
/// timings: the first events of the two resources each wait inside their
/// first step until the other has arrived, so both pass only if they were
/// running at the same time (with a wrongly global serialisation, the first
/// would wait for the second in vain).
pub async fn one_resource_runs_one_event_at_a_time_in_acceptance_order(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "customer.updated",
        Handler::new()
            .named_step(
                "first",
                Record {
                    pause_ms: 80,
                    meet: true,
                    ..Record::default()
                },
            )
            .named_step("second", Record::default())
            .one_at_a_time_per("/customer"),
    );
    let meeting = Meeting::of(&["evt_cus_a_0", "evt_cus_b_0"], Duration::from_secs(30));
    let engine = engine(&db, handlers).with_resource(meeting.clone());
    let mut events = Vec::new();
    for n in 0..4 {
        for customer in ["cus_a", "cus_b"] {
            let seq = accept(
                &engine,
                &format!("evt_{customer}_{n}"),
                json!({"customer": customer}),
            )
            .await;
            events.push((customer, seq));
        }
    }
    engine
        .worker(quick_worker("w").with_concurrency(8))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert!(
        meeting.everyone_met(),
        "two resources ran side by side: the first event of each was inside its step at once"
    );

    for customer in ["cus_a", "cus_b"] {
        let mut previous_end: Option<DateTime<Utc>> = None;
        for (_, seq) in events.iter().filter(|(c, _)| *c == customer) {
            let (start, end) = window(&db, *seq).await;
            if let Some(previous_end) = previous_end {
                assert!(
                    start >= previous_end,
                    "{customer}: event {seq} started before the previous one finished"
                );
            }
            previous_end = Some(end);
        }
    }
    let (a_start, a_end) = window(&db, events[0].1).await;
    let (b_start, b_end) = window(&db, events[1].1).await;
    assert!(
        a_start < b_end && b_start < a_end,
        "two resources ran side by side"
    );
}

/// A source limit caps how many of its events one worker runs at once.
pub async fn a_source_limit_caps_concurrent_events(db: TestDb) {
    let handlers = Handlers::new().on(
        tickmark::ANY,
        tickmark::ANY,
        Handler::new().named_step(
            "work",
            Record {
                pause_ms: 60,
                ..Record::default()
            },
        ),
    );
    let engine = engine(&db, handlers);
    let mut limited = Vec::new();
    for n in 0..4 {
        let accepted = engine
            .accept(NewEvent::with_id(
                "slow_partner",
                format!("evt_l{n}"),
                "x",
                json!({}),
            ))
            .await
            .unwrap();
        let Accepted::New { seq } = accepted else {
            panic!("new")
        };
        limited.push(seq);
        engine
            .accept(NewEvent::with_id(
                "shop",
                format!("evt_f{n}"),
                "x",
                json!({}),
            ))
            .await
            .unwrap();
    }
    let config = quick_worker("w")
        .with_concurrency(8)
        .with_source_limit("slow_partner", 1)
        .with_poll_every(Duration::from_millis(50));
    let stats = engine
        .worker(config)
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.events_done, 8);
    let mut windows = Vec::new();
    for seq in &limited {
        windows.push(window(&db, *seq).await);
    }
    windows.sort();
    for pair in windows.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "two events of the limited source overlapped: {pair:?}"
        );
    }
}

/// An operator's retry of a stale event applies it anyway (the sequence
/// check is what the operator overrides).
pub async fn an_operator_retry_applies_a_stale_event(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "customer.updated",
        Handler::new()
            .named_step("apply", Record::default())
            .skip_stale("/customer", "/version"),
    );
    let engine = engine(&db, handlers);
    accept(
        &engine,
        "evt_new",
        json!({"customer": "cus_9", "version": 5}),
    )
    .await;
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let old = accept(
        &engine,
        "evt_old",
        json!({"customer": "cus_9", "version": 4}),
    )
    .await;
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(
        db.store.event_get(old).await.unwrap().unwrap().state,
        EventState::Stale
    );

    let actor = tickmark::operator::Actor {
        who: "ops",
        reason: Some("replay by hand"),
    };
    let retry = tickmark::operator::RetryRequest {
        event_seq: old,
        from_step: None,
        force: false,
        actor,
    };
    db.store.event_retry(&retry).await.unwrap();
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(
        db.store.event_get(old).await.unwrap().unwrap().state,
        EventState::Done
    );
    assert_eq!(db.probe.runs("evt_old", "apply").await, 1);
}
