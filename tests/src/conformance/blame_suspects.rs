//! Suspects (docs/guarantees.md, guarantee 14): an event lost twice in a
//! batch, or once while held alone, stays a suspect until a mark of its
//! step, however often it is given back before the step runs; a suspect is
//! reported waiting only when a claim alone could take it; and an engine
//! under a steady backlog still runs it alone, soon.

use std::time::Duration;

use chrono::Utc;
use futures_util::future::join_all;
use serde_json::json;
use tickmark::operator::{Actor, Operations, RetryRequest};
use tickmark::{Accepted, Engine, EventState, Handler, Handlers, NewEvent, StepState};
use tickmark_driver::store::{ClaimedEvent, MarkDone, Release};
use tokio_util::sync::CancellationToken;

use super::blame::{batch, charged, suspects_alone};
use super::{engine, quick_worker};
use crate::test_steps::Record;
use crate::TestDb;

async fn accept(engine: &Engine, id: &str, kind: &str, payload: serde_json::Value) -> i64 {
    match engine
        .accept(NewEvent::with_id("shop", id, kind, payload))
        .await
        .unwrap()
    {
        Accepted::New { seq } => seq,
        other => panic!("expected new, got {other:?}"),
    }
}

/// Lose `seq`'s lease twice in a batch (two simulated kills): a suspect.
async fn make_suspect(db: &TestDb, seq: i64) {
    for round in ["first", "second"] {
        let claimed = db.store.event_claim_many(&batch("doomed")).await.unwrap();
        assert!(
            claimed.iter().any(|c| c.lease.event_seq == seq),
            "the {round} batch claim takes event {seq}: {claimed:?}"
        );
        for event in &claimed {
            db.probe.expire_lease(event.lease.event_seq).await;
        }
    }
}

async fn claim_alone(db: &TestDb) -> Vec<ClaimedEvent> {
    db.store
        .event_claim_many(&suspects_alone("rescuer"))
        .await
        .unwrap()
}

async fn mark_done(db: &TestDb, claimed: &ClaimedEvent, step: &str) {
    let now = Utc::now();
    db.store
        .step_mark_done(
            &MarkDone {
                lease: claimed.lease,
                position: claimed.next_step,
                step,
                attempt: claimed.attempt,
                started_at: now,
                finished_at: now,
                output_json: "{}",
                skipped: false,
            },
            None,
        )
        .await
        .unwrap();
}

/// Issue 32, item 3: a suspect taken alone and given back before its step
/// ran (a shutdown, a snooze, a throttle, a transaction that could not be
/// opened) is still a suspect: a batch claim leaves it, only a claim alone
/// takes it, and a crash while it is held alone is charged. A mark of its
/// step ends it.
pub async fn a_suspect_given_back_before_its_step_ran_stays_a_suspect(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", Record::default())
            .named_step("second", Record::default()),
    );
    let engine = engine(&db, handlers);
    let seq = accept(&engine, "evt_suspect", "order.paid", json!({})).await;
    make_suspect(&db, seq).await;

    let throttled = Release {
        throttled_by: Some("api:a"),
        ..Release::snoozed(Duration::ZERO, "throttled by rate limit `api`")
    };
    let releases = [
        (
            "a shutdown before the step (or a transaction not opened)",
            Release::now(true),
        ),
        ("a snooze", Release::snoozed(Duration::ZERO, "snoozed")),
        ("a throttle", throttled),
    ];
    for (why, release) in &releases {
        let mut alone = claim_alone(&db).await;
        assert_eq!(alone.len(), 1, "a claim alone takes the suspect");
        let alone = alone.remove(0);
        assert_eq!(alone.lease.event_seq, seq);
        assert_eq!(
            (alone.attempt, alone.charged_attempt()),
            (3, 1),
            "nothing charged yet: its two runs were lost beside others"
        );
        db.store.event_release(&alone.lease, release).await.unwrap();

        let taken = db.store.event_claim_many(&batch("busy")).await.unwrap();
        assert!(
            taken.is_empty(),
            "a batch claim took a suspect given back by {why}: {taken:?}"
        );
        assert!(
            db.store.event_suspect_waits().await.unwrap().is_some(),
            "given back by {why}, it still waits for a claim alone"
        );
    }

    // Held alone and lost: that crash is its own, and charged.
    let held = claim_alone(&db).await;
    assert_eq!(held.len(), 1);
    db.probe.expire_lease(seq).await;
    let mut retaken = claim_alone(&db).await;
    assert_eq!(retaken.len(), 1, "lost while held alone: a suspect");
    let retaken = retaken.remove(0);
    assert_eq!(
        (retaken.attempt, retaken.charged_attempt()),
        (4, 2),
        "the crash while held alone is charged"
    );

    // The mark of its step ends it: given back at the next step, a batch
    // claim may take it.
    mark_done(&db, &retaken, "first").await;
    db.store
        .event_release(&retaken.lease, &Release::now(true))
        .await
        .unwrap();
    assert_eq!(db.store.event_suspect_waits().await.unwrap(), None);
    let taken = db.store.event_claim_many(&batch("busy")).await.unwrap();
    assert_eq!(
        taken.len(),
        1,
        "no longer a suspect once its step was marked"
    );
    assert_eq!((taken[0].next_step, taken[0].charged_attempt()), (1, 1));
}

/// Issue 32, item 4: a suspect that no claim alone could take (its key at
/// its limit, an earlier event of its resource unfinished) is not reported
/// waiting, so busy workers do not stop claiming for it; once it could be
/// taken, it is reported, and a claim alone takes it.
pub async fn a_suspect_no_claim_could_take_is_not_reported_waiting(db: TestDb) {
    let handlers = Handlers::new()
        .on(
            "shop",
            "product.updated",
            Handler::new()
                .named_step("push", Record::default())
                .concurrency_per("/shop", 1),
        )
        .on(
            "shop",
            "customer.updated",
            Handler::new()
                .named_step("apply", Record::default())
                .one_at_a_time_per("/customer"),
        );
    let engine = engine(&db, handlers);

    // A key at its limit: the suspect's key is held by another event.
    let suspect = accept(&engine, "evt_s", "product.updated", json!({"shop": "a"})).await;
    let other = accept(&engine, "evt_x", "product.updated", json!({"shop": "a"})).await;
    make_suspect(&db, suspect).await;
    let holder = db.store.event_claim_many(&batch("busy")).await.unwrap();
    assert_eq!(
        holder.iter().map(|c| c.lease.event_seq).collect::<Vec<_>>(),
        [other],
        "a batch claim takes the key's other event, not the suspect"
    );
    assert_eq!(
        db.store.event_suspect_waits().await.unwrap(),
        None,
        "its key is at its limit: no claim alone could take the suspect"
    );
    assert!(claim_alone(&db).await.is_empty());
    mark_done(&db, &holder[0], "push").await;
    assert!(
        db.store.event_suspect_waits().await.unwrap().is_some(),
        "its key has room again"
    );
    let taken = claim_alone(&db).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].lease.event_seq, suspect);
    mark_done(&db, &taken[0], "push").await;

    // An earlier event of its resource unfinished: an operator re-runs one
    // that was done while the later one was a suspect.
    let earlier = accept(
        &engine,
        "evt_c1",
        "customer.updated",
        json!({"customer": "c"}),
    )
    .await;
    let later = accept(
        &engine,
        "evt_c2",
        "customer.updated",
        json!({"customer": "c"}),
    )
    .await;
    let first = db.store.event_claim_many(&batch("busy")).await.unwrap();
    assert_eq!(
        first.iter().map(|c| c.lease.event_seq).collect::<Vec<_>>(),
        [earlier]
    );
    mark_done(&db, &first[0], "apply").await;
    make_suspect(&db, later).await;
    db.store
        .event_retry(&RetryRequest {
            event_seq: earlier,
            from_step: Some("apply"),
            force: false,
            actor: Actor {
                who: "ops",
                reason: Some("re-run by hand"),
            },
        })
        .await
        .unwrap();
    assert_eq!(
        db.store.event_suspect_waits().await.unwrap(),
        None,
        "an earlier event of its resource is unfinished: no claim alone could take the suspect"
    );
    assert!(claim_alone(&db).await.is_empty());
    let rerun = db.store.event_claim_many(&batch("busy")).await.unwrap();
    assert_eq!(
        rerun.iter().map(|c| c.lease.event_seq).collect::<Vec<_>>(),
        [earlier]
    );
    mark_done(&db, &rerun[0], "apply").await;
    assert!(db.store.event_suspect_waits().await.unwrap().is_some());
    let taken = claim_alone(&db).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].lease.event_seq, later);
}

/// How long an engine under a steady backlog may take to run a suspect:
/// a heartbeat interval to learn of it (1/3 of `quick_worker`'s 2 s lease),
/// what its workers hold to finish (a step each and at most a heartbeat
/// interval's worth claimed ahead), then the suspect itself: about 1.5 s.
/// The rest is room for a loaded machine; without a bound, the suspect
/// waits as long as the backlog lasts.
const SUSPECT_WITHIN: Duration = Duration::from_secs(15);

/// Each backlog event's step: quick (a worker claims ahead), but slow
/// enough that the backlog outlasts [`SUSPECT_WITHIN`]: two workers of
/// four slots run some 80 a second.
const BACKLOG_STEP_MS: u64 = 100;
const BACKLOG: usize = 2_500;

/// Issue 32, item 4: two workers of one engine under a steady backlog (it
/// never runs dry, so the two are never empty at the same moment by
/// themselves) take a suspect alone within a bounded time, and charge it
/// nothing for its two losses in a batch.
pub async fn an_engine_under_a_steady_backlog_runs_its_suspect_alone_soon(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step(
            "first",
            Record {
                pause_ms: BACKLOG_STEP_MS,
                ..Record::default()
            },
        ),
    );
    let engine = engine(&db, handlers);
    let seq = accept(&engine, "evt_suspect", "order.paid", json!({})).await;
    make_suspect(&db, seq).await;
    let ids: Vec<String> = (0..BACKLOG).map(|n| format!("evt_{n:05}")).collect();
    for chunk in ids.chunks(100) {
        join_all(
            chunk
                .iter()
                .map(|id| accept(&engine, id, "order.paid", json!({}))),
        )
        .await;
    }

    let shutdown = CancellationToken::new();
    let workers: Vec<_> = ["w1", "w2"]
        .into_iter()
        .map(|name| {
            let worker = engine
                .worker(quick_worker(name))
                .expect("valid worker settings");
            let shutdown = shutdown.clone();
            tokio::spawn(async move { worker.run(shutdown).await })
        })
        .collect();

    let started = tokio::time::Instant::now();
    let finished = tokio::time::timeout(SUSPECT_WITHIN, async {
        loop {
            let record = db.store.event_get(seq).await.unwrap().unwrap();
            if record.state == EventState::Done {
                return;
            }
            // Polling the workers' database row, with a deadline.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let took = started.elapsed();
    let left = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'pending'")
        .await;
    shutdown.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }

    assert!(
        left > 0,
        "the backlog ran dry (else this test shows nothing): make it longer"
    );
    assert!(
        finished.is_ok(),
        "the suspect was not run within {SUSPECT_WITHIN:?} under a steady backlog \
         ({left} events still pending)"
    );
    tracing::info!(
        took_ms = took.as_millis() as u64,
        left,
        "the suspect is done"
    );
    assert_eq!(
        charged(&db, seq).await,
        1,
        "its losses in a batch were not charged"
    );
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 3));
}
