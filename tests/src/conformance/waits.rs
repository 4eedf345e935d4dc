//! Durable waits (docs/long_handlers.md): a step that waits for another
//! accepted event, or for a time, holding nothing, until a match or its
//! timeout settles exactly one outcome.

use std::time::Duration;

use serde_json::json;
use tickmark::operator::{Actor, Operations};
use tickmark::wait::WaitFor;
use tickmark::{Accepted, Engine, EventState, Handler, Handlers, NewEvent, StepState};

use super::{engine, quick_worker};
use crate::test_steps::Record;
use crate::TestDb;

/// Long enough that no deadline passes during a test by itself: a timeout
/// happens only when the test moves the deadline.
const PAY_TIMEOUT: Duration = Duration::from_secs(3600);

/// `order.created`: reserve, wait for `order.paid` with the same `/id`,
/// then fulfil (paid) or release (timed out).
fn order_handlers() -> Handlers {
    Handlers::new()
        .on(
            "shop",
            "order.created",
            Handler::new()
                .named_step("reserve", Record::default())
                .wait(
                    "paid",
                    WaitFor::event("shop", "order.paid")
                        .matching("/id")
                        .timeout(PAY_TIMEOUT),
                )
                .named_step("fulfill", Record::default())
                .if_matched("paid")
                .named_step("release", Record::default())
                .if_timed_out("paid"),
        )
        .on(
            "shop",
            "order.paid",
            Handler::new().named_step("note_payment", Record::default()),
        )
}

async fn accept(engine: &Engine, kind: &str, id: &str, order: u32) -> i64 {
    match engine
        .accept(NewEvent::with_id("shop", id, kind, json!({ "id": order })))
        .await
        .unwrap()
    {
        // An event no handler runs is recorded (ignored), and may still match.
        Accepted::New { seq } | Accepted::Ignored { seq } => seq,
        other => panic!("expected new, got {other:?}"),
    }
}

async fn run_until_idle(engine: &Engine, name: &str) {
    engine
        .worker(quick_worker(name))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
}

/// The state of each step of `seq`, in order.
async fn step_states(db: &TestDb, seq: i64) -> Vec<StepState> {
    db.store
        .step_status(seq)
        .await
        .unwrap()
        .iter()
        .map(|step| step.state)
        .collect()
}

/// A waiting event holds no lease, no attempt and no worker, shows
/// `waiting` with its deadline and what it waits for; the accept of a
/// matching event makes it due at once, and it settles as matched with the
/// matched event's id as the wait's output. The other branch is skipped.
pub async fn a_waiting_event_holds_nothing_until_a_match_wakes_it(db: TestDb) {
    let engine = engine(&db, order_handlers());
    let order = accept(&engine, "order.created", "o-1", 1).await;
    run_until_idle(&engine, "w1").await;

    let steps = db.store.step_status(order).await.unwrap();
    assert_eq!(steps[0].state, StepState::Done);
    let paid = &steps[1];
    assert_eq!(paid.state, StepState::Waiting, "{paid:?}");
    assert_eq!(paid.attempts, 0, "a wait spends no attempt");
    assert_eq!(paid.worker, None, "no worker holds it");
    let deadline = paid.retry_at.expect("a waiting step shows its deadline");
    assert!(
        deadline > chrono::Utc::now() + chrono::Duration::minutes(50),
        "due at its deadline, not polled: {deadline}"
    );
    let why = paid.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("order.paid") && why.contains("/id is 1"),
        "{why}"
    );
    let record = db.store.event_get(order).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Pending, "no lease is held");
    assert_eq!(db.store.event_counts().await.unwrap().waiting, 1);

    let payment = accept(&engine, "order.paid", "p-1", 1).await;
    let woken = db.store.event_get(order).await.unwrap().unwrap();
    assert!(
        woken.due_at <= chrono::Utc::now(),
        "the accept made the order due at once: {}",
        woken.due_at
    );
    run_until_idle(&engine, "w2").await;

    assert_eq!(
        step_states(&db, order).await,
        [
            StepState::Done,
            StepState::Done,
            StepState::Done,
            StepState::Skipped
        ]
    );
    let output = db.store.step_status(order).await.unwrap()[1]
        .output
        .clone()
        .unwrap();
    assert_eq!(output["matched"]["event_seq"], payment);
    assert_eq!(output["matched"]["event_id"], "p-1");
    assert_eq!(db.probe.runs("o-1", "fulfill").await, 1);
    assert_eq!(db.probe.runs("o-1", "release").await, 0);
    assert_eq!(db.store.event_counts().await.unwrap().waiting, 0);
}

/// A matching event accepted before the wait began (a payment that
/// overtook its order) is found: the wait settles at once, never waiting.
pub async fn a_match_accepted_before_the_wait_is_found(db: TestDb) {
    let engine = engine(&db, order_handlers());
    let payment = accept(&engine, "order.paid", "p-2", 2).await;
    // Another order's payment, which must not match.
    accept(&engine, "order.paid", "p-3", 3).await;
    let order = accept(&engine, "order.created", "o-2", 2).await;
    run_until_idle(&engine, "w1").await;

    let steps = db.store.step_status(order).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.state).collect::<Vec<_>>(),
        [
            StepState::Done,
            StepState::Done,
            StepState::Done,
            StepState::Skipped
        ]
    );
    assert_eq!(
        steps[1].output.as_ref().unwrap()["matched"]["event_seq"],
        payment
    );
}

/// A lookback bounds how far back a match may have been accepted: a
/// payment recorded two hours before an order whose wait looks back one
/// hour is not its match; a later one is.
pub async fn a_match_older_than_the_lookback_is_not_found(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.created",
        Handler::new()
            .wait(
                "paid",
                WaitFor::event("shop", "order.paid")
                    .matching("/id")
                    .timeout(PAY_TIMEOUT)
                    .lookback(Duration::from_secs(3600)),
            )
            .named_step("fulfill", Record::default()),
    );
    let engine = engine(&db, handlers);
    let old = accept(&engine, "order.paid", "p-old", 10).await;
    let two_hours_back = match db.backend() {
        tickmark::Backend::Postgres => "received_at - interval '2 hours'",
        tickmark::Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', received_at, '-2 hours')",
    };
    let moved = db
        .probe
        .execute(&format!(
            "UPDATE tickmark_match_keys SET received_at = {two_hours_back} WHERE event_seq = {old}"
        ))
        .await;
    assert_eq!(moved, 1, "the payment is recorded under one match key");
    let order = accept(&engine, "order.created", "o-10", 10).await;
    run_until_idle(&engine, "w1").await;
    assert_eq!(step_states(&db, order).await[0], StepState::Waiting);

    let fresh = accept(&engine, "order.paid", "p-new", 10).await;
    run_until_idle(&engine, "w2").await;
    let steps = db.store.step_status(order).await.unwrap();
    assert_eq!(steps[1].state, StepState::Done);
    assert_eq!(
        steps[0].output.as_ref().unwrap()["matched"]["event_seq"],
        fresh
    );
}

/// At the deadline with no match, the wait settles as timed out and the
/// timeout branch runs; the matched branch is recorded skipped.
pub async fn a_timeout_runs_the_timeout_branch(db: TestDb) {
    let engine = engine(&db, order_handlers());
    let order = accept(&engine, "order.created", "o-4", 4).await;
    // A payment for another order changes nothing.
    accept(&engine, "order.paid", "p-5", 5).await;
    run_until_idle(&engine, "w1").await;
    assert_eq!(step_states(&db, order).await[1], StepState::Waiting);

    db.probe.expire_wait(order).await;
    run_until_idle(&engine, "w2").await;
    let steps = db.store.step_status(order).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.state).collect::<Vec<_>>(),
        [
            StepState::Done,
            StepState::Done,
            StepState::Skipped,
            StepState::Done
        ]
    );
    assert_eq!(steps[1].output.as_ref().unwrap()["timed_out"], true);
    assert_eq!(db.probe.runs("o-4", "fulfill").await, 0);
    assert_eq!(db.probe.runs("o-4", "release").await, 1);
}

/// A wait with no `if_timed_out` step dead-letters the event on timeout,
/// saying what it waited for.
pub async fn a_timeout_without_a_timeout_branch_dead_letters(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.created",
        Handler::new()
            .wait(
                "paid",
                WaitFor::event("shop", "order.paid")
                    .matching("/id")
                    .timeout(PAY_TIMEOUT),
            )
            .named_step("fulfill", Record::default()),
    );
    let engine = engine(&db, handlers);
    let order = accept(&engine, "order.created", "o-6", 6).await;
    run_until_idle(&engine, "w1").await;
    db.probe.expire_wait(order).await;
    run_until_idle(&engine, "w2").await;

    let record = db.store.event_get(order).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Dead);
    let why = record.last_error.unwrap_or_default();
    assert!(
        why.contains("timed out") && why.contains("order.paid") && why.contains("/id is 6"),
        "{why}"
    );
    assert_eq!(db.probe.runs("o-6", "fulfill").await, 0);
}

/// The payment and the timeout at the same instant, many times: the
/// deadlines have passed when the payments are accepted, while two workers
/// settle the waits. Each order settles exactly one outcome, in one
/// transaction: its wait's output and the branch that ran agree, and
/// exactly one of fulfil and release ran.
pub async fn a_match_racing_the_timeout_settles_one_outcome(db: TestDb) {
    const ORDERS: u32 = 40;
    const ROUNDS: u32 = 3;
    let engine = engine(&db, order_handlers());
    let (mut matched, mut timed_out) = (0, 0);
    for round in 0..ROUNDS {
        let ids: Vec<u32> = (0..ORDERS).map(|n| round * 1000 + n).collect();
        let mut orders = Vec::new();
        for id in &ids {
            orders.push(accept(&engine, "order.created", &format!("o-{id}"), *id).await);
        }
        run_until_idle(&engine, "w0").await;
        for order in &orders {
            db.probe.expire_wait(*order).await;
        }
        let workers: Vec<_> = ["w1", "w2"]
            .into_iter()
            .map(|name| {
                let worker = engine.worker(quick_worker(name)).unwrap();
                tokio::spawn(worker.run_until_idle())
            })
            .collect();
        for id in &ids {
            accept(&engine, "order.paid", &format!("p-{id}"), *id).await;
        }
        for worker in workers {
            worker.await.unwrap().unwrap();
        }
        run_until_idle(&engine, "w3").await;

        for (id, order) in ids.iter().zip(&orders) {
            let steps = db.store.step_status(*order).await.unwrap();
            let output = steps[1].output.clone().unwrap_or_default();
            let fulfilled = db.probe.runs(&format!("o-{id}"), "fulfill").await;
            let released = db.probe.runs(&format!("o-{id}"), "release").await;
            assert_eq!(
                fulfilled + released,
                1,
                "order {id}: exactly one branch ran ({output})"
            );
            if output.get("matched").is_some() {
                matched += 1;
                assert_eq!(
                    (fulfilled, steps[3].state),
                    (1, StepState::Skipped),
                    "{output}"
                );
            } else {
                timed_out += 1;
                assert_eq!(output["timed_out"], true, "order {id}: {output}");
                assert_eq!(
                    (released, steps[2].state),
                    (1, StepState::Skipped),
                    "{output}"
                );
            }
        }
    }
    assert_eq!(matched + timed_out, ORDERS * ROUNDS);
    eprintln!("race: {matched} matched, {timed_out} timed out");
}

/// Waits begin while the matching events are being accepted, by two
/// workers and concurrent accepts: no wake-up is lost. (The deadlines are an
/// hour away, so an order whose wake-up was lost would still be waiting.)
pub async fn accepts_racing_the_start_of_waits_lose_no_wake_up(db: TestDb) {
    const ORDERS: u32 = 60;
    let engine = engine(&db, order_handlers());
    let mut orders = Vec::new();
    for id in 0..ORDERS {
        orders.push(accept(&engine, "order.created", &format!("o-{id}"), id).await);
    }
    let workers: Vec<_> = ["w1", "w2"]
        .into_iter()
        .map(|name| {
            let worker = engine.worker(quick_worker(name)).unwrap();
            tokio::spawn(worker.run_until_idle())
        })
        .collect();
    for id in 0..ORDERS {
        accept(&engine, "order.paid", &format!("p-{id}"), id).await;
    }
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    run_until_idle(&engine, "w3").await;
    for (id, order) in orders.iter().enumerate() {
        let states = step_states(&db, *order).await;
        assert_eq!(
            states,
            [
                StepState::Done,
                StepState::Done,
                StepState::Done,
                StepState::Skipped
            ],
            "order {id}"
        );
    }
    assert_eq!(db.probe.runs_of("fulfill").await, i64::from(ORDERS));
}

/// A durable timer: the event waits, holding nothing, across a restart
/// (a new engine on the same database), and goes on when its time comes;
/// `sleep_until` reads its time from the payload.
pub async fn a_durable_timer_survives_a_restart(db: TestDb) {
    let handlers = || {
        Handlers::new().on(
            "shop",
            "order.created",
            Handler::new()
                .sleep("cool_off", Duration::from_secs(3 * 24 * 3600))
                .sleep_until("until_remind_at", "/remind_at")
                .named_step("remind", Record::default()),
        )
    };
    let first = engine(&db, handlers());
    let seq = match first
        .accept(NewEvent::with_id(
            "shop",
            "o-t",
            "order.created",
            json!({"remind_at": "2000-01-01T00:00:00Z"}),
        ))
        .await
        .unwrap()
    {
        Accepted::New { seq } => seq,
        other => panic!("{other:?}"),
    };
    run_until_idle(&first, "w1").await;
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Waiting);
    let due = steps[0].retry_at.unwrap();
    assert!(
        due > chrono::Utc::now() + chrono::Duration::days(2),
        "{due}"
    );
    drop(first);

    let restarted = engine(&db, handlers());
    db.probe.expire_wait(seq).await;
    run_until_idle(&restarted, "w2").await;
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.state).collect::<Vec<_>>(),
        [StepState::Done, StepState::Done, StepState::Done]
    );
    assert!(steps[0].output.as_ref().unwrap()["slept_until"].is_string());
    assert_eq!(
        steps[1].output.as_ref().unwrap()["slept_until"],
        "2000-01-01T00:00:00+00:00",
        "a time already past fires at once"
    );
    assert_eq!(db.probe.runs("o-t", "remind").await, 1);
}

/// An operator feeds a waiting step an event by hand (the matched branch
/// runs), or times another out now (the timeout branch runs); each is in
/// the audit trail, and a step that is not waiting is refused.
pub async fn an_operator_feeds_or_times_out_a_wait_by_hand(db: TestDb) {
    let engine = engine(&db, order_handlers());
    let fed = accept(&engine, "order.created", "o-7", 7).await;
    let timed = accept(&engine, "order.created", "o-8", 8).await;
    // A payment whose id does not match (a typo in the provider's data).
    let payment = accept(&engine, "order.paid", "p-typo", 70).await;
    run_until_idle(&engine, "w1").await;

    let actor = Actor {
        who: "ops@example",
        reason: Some("paid by bank transfer"),
    };
    let refused = db.store.wait_feed(fed, "reserve", payment, actor).await;
    assert!(
        refused.unwrap_err().to_string().contains("is not waiting"),
        "only a waiting step can be fed"
    );
    db.store
        .wait_feed(fed, "paid", payment, actor)
        .await
        .unwrap();
    db.store.wait_time_out(timed, "paid", actor).await.unwrap();
    run_until_idle(&engine, "w2").await;

    let fed_steps = db.store.step_status(fed).await.unwrap();
    assert_eq!(
        fed_steps[1].output.as_ref().unwrap()["matched"]["event_seq"],
        payment
    );
    assert_eq!(
        fed_steps[1].output.as_ref().unwrap()["fed_by"],
        "ops@example"
    );
    assert_eq!(db.probe.runs("o-7", "fulfill").await, 1);
    assert_eq!(db.probe.runs("o-7", "release").await, 0);
    assert_eq!(db.probe.runs("o-8", "fulfill").await, 0);
    assert_eq!(db.probe.runs("o-8", "release").await, 1);

    let audit = db.store.audit_list(fed).await.unwrap();
    assert!(
        audit.iter().any(|entry| entry.action == "feed"),
        "{audit:?}"
    );
    let audit = db.store.audit_list(timed).await.unwrap();
    assert!(
        audit.iter().any(|entry| entry.action == "time_out"),
        "{audit:?}"
    );
}

/// PostgreSQL only (SQLite's write lock serialises every write transaction):
/// an accept whose wake-up would run while a wait is being decided waits
/// for that wait's key lock, so the wake-up sees the wait once it is
/// recorded. The wait's transaction is played by hand and held open until
/// the accept is seen waiting for the lock (or, were the lock missing, has
/// finished without waking anything): no timing is involved.
pub async fn an_accept_waits_for_a_wait_being_decided_on_its_key(db: TestDb) {
    use sqlx::Connection;

    let engine = engine(&db, order_handlers());
    let order = accept(&engine, "order.created", "o-9", 9).await;
    run_until_idle(&engine, "w1").await;
    let key = db
        .probe
        .text(&format!(
            "SELECT wait_key FROM tickmark_events WHERE id = {order}"
        ))
        .await
        .expect("the order waits on a key");
    // Back to the moment before the wait was recorded.
    db.probe
        .execute(&format!(
            "UPDATE tickmark_events SET wait_key = NULL WHERE id = {order}"
        ))
        .await;

    // The wait's transaction: the key's lock, then the wait recorded.
    let mut waiter = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = waiter.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('tickmark.wait:' || $1, 0))")
        .bind(&key)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE tickmark_events SET wait_key = $1 WHERE id = $2")
        .bind(&key)
        .bind(order)
        .execute(&mut *tx)
        .await
        .unwrap();

    let accepting = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .accept(NewEvent::with_id(
                    "shop",
                    "p-9",
                    "order.paid",
                    json!({"id": 9}),
                ))
                .await
        })
    };
    crate::wait::until(
        "the accept waits for the key's lock (or has finished)",
        Duration::from_secs(30),
        || async {
            accepting.is_finished()
                || db
                    .probe
                    .scalar(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                    )
                    .await
                    > 0
        },
    )
    .await;
    tx.commit().await.unwrap();
    assert!(matches!(
        accepting.await.unwrap().unwrap(),
        Accepted::New { .. }
    ));

    let woken = db.store.event_get(order).await.unwrap().unwrap();
    assert!(
        woken.due_at <= chrono::Utc::now(),
        "the accept woke the wait recorded while it waited for the key: due {}",
        woken.due_at
    );
}
