//! Operator actions and reads (`store::admin::Admin`): retry, cancel, skip,
//! mark done by hand, prune, status, list and lookup. Every action is one
//! transaction that filters on the expected state, bumps the fencing token
//! and writes an audit row; a refused action changes nothing.

use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::operator::{Actor, AdminError, Operations, RetryRequest};
use tickmark::{
    Backend, EventState, Handler, Handlers, NewEvent, RetryPolicy, Step, StepContext, StepError,
    StepResult, StepState, StoreError,
};
use tickmark_driver::store::admin::{
    AuditNote, Decision, EventFilter, EventSnapshot, PruneBatch, Replan, SettledAs,
    TransitionError, Verdict,
};
use tickmark_driver::store::{ClaimParams, ClaimedEvent, MarkDone};
use tokio_util::sync::CancellationToken;

use super::{engine, order_paid, quick_worker};
use crate::probe::Probe;
use crate::test_steps::{Flaky, Record, WaitForCancel};
use crate::{wait, TestDb};

/// Fails terminally on its first `failing_runs` runs for an event — counted
/// by the probe, so across operator retries — then succeeds: a bug that an
/// operator fixes before retrying.
#[derive(Debug, Serialize, Deserialize)]
pub struct BrokenUntilFixed {
    /// Runs that fail.
    pub failing_runs: i64,
}

#[typetag::serde(name = "test_broken_until_fixed")]
#[async_trait::async_trait]
impl Step for BrokenUntilFixed {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let probe = ctx.resource::<Probe>()?;
        probe
            .record_run(&ctx.event().id, ctx.step_name(), ctx.attempt())
            .await?;
        if probe.runs(&ctx.event().id, ctx.step_name()).await <= self.failing_runs {
            return Err(StepError::terminal("broken until an operator fixes it"));
        }
        Ok(json!({ "key": ctx.idempotency_key(), "attempt": ctx.attempt() }))
    }
}

/// `first`, `second`, `third`, each a recording step.
pub fn three_steps() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", Record::default())
            .named_step("second", Record::default())
            .named_step("third", Record::default()),
    )
}

/// `first` records, `second` is broken on its first run: the event goes
/// dead at `second` (a terminal failure, at once).
pub fn broken_second() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", Record::default())
            .named_step("second", BrokenUntilFixed { failing_runs: 1 })
            .retry(RetryPolicy::attempts(3)),
    )
}

/// An operator with a reason.
pub fn ops(reason: &'static str) -> Actor<'static> {
    Actor {
        who: "ops@test",
        reason: Some(reason),
    }
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

fn mark_first(claimed: &ClaimedEvent) -> MarkDone<'static> {
    let now = Utc::now();
    MarkDone {
        lease: claimed.lease,
        position: claimed.next_step,
        step: "first",
        attempt: claimed.attempt,
        started_at: now,
        finished_at: now,
        output_json: "{}",
        skipped: false,
    }
}

fn retry_request(event_seq: i64, from_step: Option<&str>, force: bool) -> RetryRequest<'_> {
    RetryRequest {
        event_seq,
        from_step,
        force,
        actor: ops("test"),
    }
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, AdminError>, needle: &str) {
    match result {
        Err(AdminError::Refused(message)) => assert!(
            message.contains(needle),
            "refusal {message:?} should mention {needle:?}"
        ),
        other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
}

fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost { .. })),
        "{what}: expected LeaseLost, got {result:?}"
    );
}

/// Run a quick worker with `handlers` on `db` until nothing is due.
pub async fn run_until_idle(db: &TestDb, handlers: Handlers) {
    engine(db, handlers)
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
}

/// Move the named events' `received_at` back by `days` days.
pub async fn age(db: &TestDb, ids: &[&str], days: u32) {
    let list = ids
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = match db.backend() {
        Backend::Postgres => format!(
            "UPDATE tickmark_events SET received_at = now() - interval '{days} days' \
             WHERE dedup_key IN ({list})"
        ),
        Backend::Sqlite => format!(
            "UPDATE tickmark_events SET received_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', \
             '-{days} days') WHERE dedup_key IN ({list})"
        ),
    };
    assert_eq!(db.probe.execute(&sql).await, ids.len() as u64);
}

async fn audit_rows(db: &TestDb) -> i64 {
    db.probe.scalar("SELECT count(*) FROM tickmark_audit").await
}

/// Re-running a finished event from a step keeps the earlier steps (rows,
/// outputs, keys) and runs the later ones again with the same idempotency keys.
pub async fn retry_from_a_step_keeps_earlier_steps_and_reruns_later_ones_with_the_same_keys(
    db: TestDb,
) {
    order_paid(&engine(&db, three_steps()), "evt_rerun").await;
    run_until_idle(&db, three_steps()).await;
    let seq = db.record_of("shop", "evt_rerun").await.event.seq;
    let before = db.store.step_status(seq).await.unwrap();
    let token = db.store.event_get(seq).await.unwrap().unwrap().lease_token;

    let record = db
        .store
        .event_retry(&RetryRequest {
            event_seq: seq,
            from_step: Some("second"),
            force: false,
            actor: ops("receipt template fixed"),
        })
        .await
        .unwrap();
    assert_eq!(record.state, EventState::Pending);
    assert_eq!((record.next_step, record.attempt), (1, 0));
    assert_eq!(record.lease_token, token + 1, "the fencing token moves");
    assert_eq!(record.finished_at, None);
    assert!(record.due_at <= Utc::now() + chrono::Duration::seconds(1));
    let requeued = db.store.step_status(seq).await.unwrap();
    assert_eq!(
        requeued[0], before[0],
        "the first step's row is kept as it was"
    );
    assert_eq!(
        [requeued[1].state, requeued[2].state],
        [StepState::Pending, StepState::Pending]
    );
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_steps WHERE event_seq = {seq}"
            ))
            .await,
        1,
        "the marks of `second` and `third` are forgotten"
    );

    run_until_idle(&db, three_steps()).await;
    let after = db.store.step_status(seq).await.unwrap();
    assert_eq!(
        db.store.event_get(seq).await.unwrap().unwrap().state,
        EventState::Done
    );
    assert_eq!(after[0], before[0], "the first step did not run again");
    assert_eq!(db.probe.runs("evt_rerun", "first").await, 1);
    for position in [1, 2] {
        let (old, new) = (&before[position], &after[position]);
        assert_eq!(db.probe.runs("evt_rerun", &new.step).await, 2);
        assert_eq!(new.state, StepState::Done);
        assert_eq!(new.idempotency_key, old.idempotency_key);
        assert_eq!(
            new.output.as_ref().unwrap()["key"],
            old.output.as_ref().unwrap()["key"],
            "the re-run step saw the same idempotency key"
        );
        assert!(new.finished_at > old.finished_at, "it really ran again");
    }
    assert_eq!(
        after[2].output.as_ref().unwrap()["seen"],
        json!(["first", "second"]),
        "the re-run steps see the kept output of `first`"
    );
}

/// A dead event resumes at its failed step (earlier steps stay done), and the
/// retry wakes an idle worker at once (NOTIFY on PostgreSQL, the in-process
/// signal on SQLite) instead of waiting for its poll.
pub async fn retry_resumes_a_dead_event_at_its_failed_step_and_wakes_a_worker(db: TestDb) {
    order_paid(&engine(&db, broken_second()), "evt_dead").await;
    run_until_idle(&db, broken_second()).await;
    let dead = db.record_of("shop", "evt_dead").await;
    assert_eq!((dead.state, dead.next_step), (EventState::Dead, 1));
    let first_before = db.store.step_status(dead.event.seq).await.unwrap()[0].clone();

    let worker = engine(&db, broken_second())
        .worker(quick_worker("sleeper").with_poll_every(Duration::from_secs(120)))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    stats.wait_for(|s| s.idle_waits >= 1).await.unwrap();

    let record = db
        .store
        .event_retry(&retry_request(dead.event.seq, None, false))
        .await
        .unwrap();
    assert_eq!(record.state, EventState::Pending);
    assert_eq!((record.next_step, record.attempt), (1, 0));
    assert_eq!(record.last_error, None);
    assert_eq!(record.lease_owner, None);
    assert_eq!(record.lease_token, dead.lease_token + 1);

    let woke = tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.events_done == 1),
    )
    .await
    .is_ok();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert!(
        woke,
        "the retried event waited for the 120 s poll: no wake-up"
    );

    let done = db.record_of("shop", "evt_dead").await;
    assert_eq!(done.state, EventState::Done);
    let steps = db.store.step_status(done.event.seq).await.unwrap();
    assert_eq!(steps[0], first_before, "the done step stays done");
    assert_eq!(db.probe.runs("evt_dead", "first").await, 1);
    assert_eq!(db.probe.runs("evt_dead", "second").await, 2);
    assert_eq!(
        (steps[1].state, steps[1].attempts),
        (StepState::Done, 1),
        "the retry starts the step's attempts afresh"
    );
    assert_eq!(
        steps[1].output.as_ref().unwrap()["key"],
        "shop:evt_dead:second"
    );
}

/// Every manual action leaves an audit row: who, what, which step, why, and
/// what changed; in order, with the event.
pub async fn the_audit_trail_records_every_manual_action(db: TestDb) {
    let handlers = || {
        Handlers::new().on(
            "shop",
            "order.paid",
            Handler::new()
                .named_step(
                    "first",
                    Flaky {
                        fail_first: 99,
                        terminal: true,
                    },
                )
                .named_step("second", BrokenUntilFixed { failing_runs: 99 }),
        )
    };
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_audit").await;
    run_until_idle(&db, handlers()).await;
    let seq = db.record_of("shop", "evt_audit").await.event.seq;
    assert!(db.store.audit_list(seq).await.unwrap().is_empty());

    db.store
        .step_skip(seq, "first", ops("the flaky check is obsolete"))
        .await
        .unwrap();
    db.store
        .event_cancel(seq, ops("customer asked us to wait"))
        .await
        .unwrap();
    db.store
        .event_retry(&RetryRequest {
            event_seq: seq,
            from_step: None,
            force: false,
            actor: Actor {
                who: "dashboard",
                reason: None,
            },
        })
        .await
        .unwrap();
    run_until_idle(&db, handlers()).await;
    assert_eq!(
        db.record_of("shop", "evt_audit").await.state,
        EventState::Dead
    );
    db.store
        .step_mark_done_by_hand(seq, "second", ops("fixed in the ERP, OPS-7"))
        .await
        .unwrap();

    let audit = db.store.audit_list(seq).await.unwrap();
    let summary: Vec<(&str, &str, Option<&str>, Option<&str>)> = audit
        .iter()
        .map(|a| {
            (
                a.actor.as_str(),
                a.action.as_str(),
                a.step.as_deref(),
                a.reason.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "ops@test",
                "skip",
                Some("first"),
                Some("the flaky check is obsolete")
            ),
            (
                "ops@test",
                "cancel",
                Some("second"),
                Some("customer asked us to wait")
            ),
            ("dashboard", "retry", Some("second"), None),
            (
                "ops@test",
                "mark_done",
                Some("second"),
                Some("fixed in the ERP, OPS-7")
            ),
        ]
    );
    let details: Vec<&str> = audit.iter().map(|a| a.detail.as_deref().unwrap()).collect();
    assert!(details[0].starts_with("dead → pending"), "{}", details[0]);
    assert!(details[0].contains("terminal failure"), "{}", details[0]);
    assert!(
        details[1].starts_with("pending → cancelled"),
        "{}",
        details[1]
    );
    assert!(
        details[2].starts_with("cancelled → pending"),
        "{}",
        details[2]
    );
    assert!(details[3].starts_with("dead → done"), "{}", details[3]);
    assert!(audit.iter().all(|a| a.event_seq == seq));
    assert!(audit
        .windows(2)
        .all(|w| w[0].id < w[1].id && w[0].at <= w[1].at));
    assert_eq!(
        db.record_of("shop", "evt_audit").await.state,
        EventState::Done
    );
}

/// An action the event's state does not allow is refused with a message that
/// says where the event is and what would work, and changes nothing.
pub async fn actions_are_refused_in_states_that_do_not_allow_them(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_done").await;
    run_until_idle(&db, three_steps()).await;
    order_paid(&engine, "evt_running").await;
    let claimed = claim_one(&db, "busy").await;
    order_paid(&engine, "evt_pending").await;
    let done = db.record_of("shop", "evt_done").await.event.seq;
    let running = claimed.lease.event_seq;
    let pending = db.record_of("shop", "evt_pending").await.event.seq;

    // Pending: already queued.
    assert_refused(
        db.store
            .event_retry(&retry_request(pending, None, false))
            .await,
        "already queued",
    );
    // Running under a live lease: no retry (even forced), no skip, no mark-done.
    for force in [false, true] {
        assert_refused(
            db.store
                .event_retry(&retry_request(running, None, force))
                .await,
            "holds its lease",
        );
    }
    assert_refused(
        db.store.step_skip(running, "first", ops("no")).await,
        "holds its lease",
    );
    assert_refused(
        db.store
            .step_mark_done_by_hand(running, "first", ops("no"))
            .await,
        "holds its lease",
    );
    // Done: a retry needs a step to re-run from; cancel and skip are refused.
    assert_refused(
        db.store
            .event_retry(&retry_request(done, None, false))
            .await,
        "choose --from-step NAME",
    );
    assert_refused(db.store.event_cancel(done, ops("no")).await, "is done");
    assert_refused(
        db.store.step_skip(done, "third", ops("no")).await,
        "is done",
    );
    // Unknown step names are named, with the known ones.
    match db
        .store
        .event_retry(&retry_request(done, Some("fourth"), false))
        .await
    {
        Err(AdminError::UnknownStep { step, known, .. }) => {
            assert_eq!(
                (step.as_str(), known.as_str()),
                ("fourth", "first, second, third")
            )
        }
        other => panic!("expected UnknownStep, got {other:?}"),
    }
    assert!(matches!(
        db.store.step_skip(pending, "fourth", ops("no")).await,
        Err(AdminError::UnknownStep { .. })
    ));
    // Only the current step can be skipped; a reason is required.
    assert_refused(
        db.store.step_skip(pending, "second", ops("no")).await,
        "only its current step",
    );
    assert_refused(
        db.store
            .step_skip(
                pending,
                "first",
                Actor {
                    who: "ops@test",
                    reason: None,
                },
            )
            .await,
        "--reason",
    );
    // No such event.
    for result in [
        db.store
            .event_retry(&retry_request(999_999, None, false))
            .await
            .map(drop),
        db.store.event_cancel(999_999, ops("no")).await.map(drop),
        db.store
            .step_skip(999_999, "first", ops("no"))
            .await
            .map(drop),
    ] {
        assert!(matches!(result, Err(AdminError::NotFound(_))), "{result:?}");
    }
    // An expired lease may be taken over by a claim: a retry needs --force.
    db.probe.expire_lease(running).await;
    assert_refused(
        db.store
            .event_retry(&retry_request(running, None, false))
            .await,
        "add --force",
    );

    assert_eq!(audit_rows(&db).await, 0, "refusals write no audit row");
    let still = db.store.event_get(running).await.unwrap().unwrap();
    assert_eq!(
        (still.state, still.lease_token),
        (EventState::Running, claimed.lease.token),
        "refusals change nothing"
    );
    assert_eq!(
        db.store.event_get(done).await.unwrap().unwrap().state,
        EventState::Done
    );
}

/// The store enforces on its own: a transition whose decision asks for what
/// its `UPDATE` does not allow (no operator rule in between) changes nothing,
/// writes no audit row and says so (`Unchanged`); a declined decision writes
/// nothing; an allowed one bumps the fencing token and writes its audit row.
pub async fn the_store_enforces_a_transition_the_rules_would_refuse(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_done").await;
    run_until_idle(&db, three_steps()).await;
    order_paid(&engine, "evt_running").await;
    let claimed = claim_one(&db, "busy").await;
    let done = db.record_of("shop", "evt_done").await.event.seq;
    let running = claimed.lease.event_seq;
    let note = || AuditNote {
        actor: "ops@test".into(),
        action: "test".into(),
        step: None,
        reason: None,
        detail: "forced by the test".into(),
    };
    let requeue = |rerun_done, take_over_expired| Decision::Requeue {
        resume_at: 0,
        rerun_done,
        take_over_expired,
    };
    let settle = Decision::SettleStep {
        position: 0,
        as_state: SettledAs::Skipped,
        output: json!({}),
        last_error: None,
    };
    let replan = Decision::Replan(Replan {
        plan_json: db
            .store
            .event_plan(done)
            .await
            .unwrap()
            .unwrap()
            .to_string(),
        step_count: 3,
        resource_key: None,
        resource_seq: None,
        limit_key: None,
        limit_n: None,
        tenant_key: None,
        head_start_ms: 0,
    });
    for (event_seq, was, decision) in [
        (done, EventState::Done, Decision::Cancel),
        (done, EventState::Done, requeue(false, true)),
        (done, EventState::Done, replan.clone()),
        (running, EventState::Running, replan),
        (running, EventState::Running, requeue(true, true)),
        (running, EventState::Running, settle),
    ] {
        let decide = |_: &EventSnapshot| {
            Ok(Verdict {
                decision: decision.clone(),
                audit: note(),
            })
        };
        match db.store.event_transition(event_seq, &decide).await {
            Err(TransitionError::Unchanged {
                event_seq: seq,
                was: found,
            }) => assert_eq!((seq, found), (event_seq, was), "{decision:?}"),
            other => panic!("{decision:?} on a {was} event: expected Unchanged, got {other:?}"),
        }
    }
    let decline = |found: &EventSnapshot| Err(format!("not {}", found.state).into());
    match db.store.event_transition(running, &decline).await {
        Err(TransitionError::Declined(why)) => assert_eq!(why.to_string(), "not running"),
        other => panic!("expected Declined, got {other:?}"),
    }
    assert_eq!(audit_rows(&db).await, 0, "nothing changed, nothing audited");
    let still = db.store.event_get(running).await.unwrap().unwrap();
    assert_eq!(
        (still.state, still.lease_token),
        (EventState::Running, claimed.lease.token)
    );

    let cancel = |_: &EventSnapshot| {
        Ok(Verdict {
            decision: Decision::Cancel,
            audit: note(),
        })
    };
    let cancelled = db.store.event_transition(running, &cancel).await.unwrap();
    assert_eq!(cancelled.state, EventState::Cancelled);
    assert!(
        cancelled.lease_token > claimed.lease.token,
        "the token moves"
    );
    let audit = db.store.audit_list(running).await.unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        (audit[0].action.as_str(), audit[0].detail.as_deref()),
        ("test", Some("forced by the test"))
    );
}

/// Cancelling a running event fences its worker: the old lease can no longer
/// mark, fail, release or heartbeat.
pub async fn cancelling_a_running_event_fences_its_worker(db: TestDb) {
    order_paid(&engine(&db, three_steps()), "evt_cancel").await;
    let claimed = claim_one(&db, "doomed").await;
    let seq = claimed.lease.event_seq;

    let record = db
        .store
        .event_cancel(seq, ops("duplicate order"))
        .await
        .unwrap();
    assert_eq!(record.state, EventState::Cancelled);
    assert_eq!(record.lease_token, claimed.lease.token + 1);
    assert!(record.finished_at.is_some());

    assert_lease_lost(
        db.store.step_mark_done(&mark_first(&claimed), None).await,
        "mark after cancel",
    );
    assert_lease_lost(
        db.store
            .event_release(&claimed.lease, &tickmark_driver::store::Release::now(true))
            .await,
        "release after cancel",
    );
    let renewed = db
        .store
        .event_heartbeat_many(&[claimed.lease], Duration::from_secs(30))
        .await
        .unwrap();
    assert!(renewed.is_empty(), "the cancelled lease is not renewed");
    let after = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(after.state, EventState::Cancelled);
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_steps WHERE event_seq = {seq}"
            ))
            .await,
        0
    );
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Cancelled);
    assert_eq!(steps[1].state, StepState::NotRun);
    let audit = db.store.audit_list(seq).await.unwrap();
    assert!(
        audit[0].detail.as_deref().unwrap().contains("doomed"),
        "{audit:?}"
    );
}

/// End to end: a worker whose running event is cancelled learns it from its
/// heartbeat, stops the step, and marks nothing.
pub async fn a_worker_running_a_cancelled_event_stops_and_marks_nothing(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("first", WaitForCancel)
            .named_step("second", Record::default()),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_stop").await;
    let worker = engine
        .worker(quick_worker("busy"))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait::until("the step starts", Duration::from_secs(20), || async {
        db.probe.runs("evt_stop", "first").await == 1
    })
    .await;

    let seq = db.record_of("shop", "evt_stop").await.event.seq;
    db.store.event_cancel(seq, ops("stop it")).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.leases_lost >= 1 && s.in_flight == 0),
    )
    .await
    .expect("the worker notices the cancel and stops the step")
    .unwrap();
    shutdown.cancel();
    running.await.unwrap().unwrap();

    assert_eq!(
        db.record_of("shop", "evt_stop").await.state,
        EventState::Cancelled
    );
    assert_eq!(db.probe.runs("evt_stop", "second").await, 0);
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_steps WHERE event_seq = {seq}"
            ))
            .await,
        0,
        "the stopped worker marked nothing"
    );
}

/// Skipping or marking done the last step finishes the event; the step row
/// says who settled it and why; nothing runs again.
pub async fn skipping_or_marking_done_the_last_step_finishes_the_event(db: TestDb) {
    order_paid(&engine(&db, broken_second()), "evt_mark").await;
    order_paid(&engine(&db, broken_second()), "evt_skip").await;
    run_until_idle(&db, broken_second()).await;
    let mark = db.record_of("shop", "evt_mark").await;
    let skip = db.record_of("shop", "evt_skip").await;
    assert_eq!(
        (mark.state, skip.state),
        (EventState::Dead, EventState::Dead)
    );

    let marked = db
        .store
        .step_mark_done_by_hand(mark.event.seq, "second", ops("refunded by hand"))
        .await
        .unwrap();
    assert_eq!((marked.state, marked.next_step), (EventState::Done, 2));
    assert!(marked.finished_at.is_some());
    assert_eq!(marked.last_error, None);
    let steps = db.store.step_status(mark.event.seq).await.unwrap();
    assert_eq!(steps[1].state, StepState::Done);
    assert_eq!(steps[1].attempts, mark.attempt, "attempts as on the event");
    assert_eq!(
        steps[1].output,
        Some(json!({ "marked_done_by": "ops@test", "reason": "refunded by hand" }))
    );
    assert_eq!(
        db.probe
            .scalar(&format!(
                "SELECT lease_token FROM tickmark_steps WHERE event_seq = {} AND position = 1",
                mark.event.seq
            ))
            .await,
        marked.lease_token,
        "the row carries the action's new token"
    );

    let skipped = db
        .store
        .step_skip(skip.event.seq, "second", ops("not needed"))
        .await
        .unwrap();
    assert_eq!((skipped.state, skipped.next_step), (EventState::Done, 2));
    let steps = db.store.step_status(skip.event.seq).await.unwrap();
    assert_eq!(steps[1].state, StepState::Skipped);
    assert!(steps[1].finished_at.is_some());

    assert_eq!(db.store.event_count_active().await.unwrap(), 0);
    run_until_idle(&db, broken_second()).await;
    assert_eq!(db.probe.runs_of("second").await, 2, "nothing ran again");
}

/// Skipping a step that is not the last re-queues the event at the next one;
/// an interrupted step (expired lease) may be skipped too, fencing its worker.
pub async fn skipping_a_middle_step_runs_the_rest(db: TestDb) {
    let handlers = || {
        Handlers::new().on(
            "shop",
            "order.paid",
            Handler::new()
                .named_step(
                    "first",
                    Flaky {
                        fail_first: 99,
                        terminal: true,
                    },
                )
                .named_step("second", Record::default()),
        )
    };
    order_paid(&engine(&db, handlers()), "evt_dead").await;
    run_until_idle(&db, handlers()).await;
    order_paid(&engine(&db, handlers()), "evt_stuck").await;
    let stuck = claim_one(&db, "vanished").await;
    db.probe.expire_lease(stuck.lease.event_seq).await;

    let dead = db.record_of("shop", "evt_dead").await;
    let record = db
        .store
        .step_skip(dead.event.seq, "first", ops("check retired"))
        .await
        .unwrap();
    assert_eq!(record.state, EventState::Pending);
    assert_eq!((record.next_step, record.attempt), (1, 0));
    assert!(record.due_at <= Utc::now() + chrono::Duration::seconds(1));
    let record = db
        .store
        .step_skip(stuck.lease.event_seq, "first", ops("check retired"))
        .await
        .unwrap();
    assert_eq!(record.state, EventState::Pending);
    assert_lease_lost(
        db.store.step_mark_done(&mark_first(&stuck), None).await,
        "the interrupted worker's late mark",
    );

    run_until_idle(&db, handlers()).await;
    for id in ["evt_dead", "evt_stuck"] {
        let record = db.record_of("shop", id).await;
        assert_eq!(record.state, EventState::Done, "{id}");
        let steps = db.store.step_status(record.event.seq).await.unwrap();
        assert_eq!(steps[0].state, StepState::Skipped, "{id}");
        assert_eq!(db.probe.runs(id, "second").await, 1, "{id}");
        assert_eq!(
            steps[1].output.as_ref().unwrap()["seen"],
            json!(["first"]),
            "{id}: a skipped step counts as settled"
        );
    }
    assert_eq!(
        db.probe.runs("evt_dead", "first").await,
        1,
        "the skipped step did not run again"
    );
    let dead_steps = db.store.step_status(dead.event.seq).await.unwrap();
    assert!(
        dead_steps[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("terminal failure"),
        "the skipped step keeps the error it was skipped for"
    );
}

/// A forced retry of an interrupted event re-queues it at once and fences
/// the old lease out.
pub async fn a_forced_retry_of_an_interrupted_event_fences_the_old_lease(db: TestDb) {
    order_paid(&engine(&db, three_steps()), "evt_force").await;
    let claimed = claim_one(&db, "vanished").await;
    db.probe.expire_lease(claimed.lease.event_seq).await;
    let record = db
        .store
        .event_retry(&retry_request(claimed.lease.event_seq, None, true))
        .await
        .unwrap();
    assert_eq!(record.state, EventState::Pending);
    assert_eq!(record.lease_token, claimed.lease.token + 1);
    assert_lease_lost(
        db.store.step_mark_done(&mark_first(&claimed), None).await,
        "the old lease's mark",
    );
    run_until_idle(&db, three_steps()).await;
    let done = db.record_of("shop", "evt_force").await;
    assert_eq!((done.state, done.takeovers), (EventState::Done, 0));
    assert_eq!(db.probe.runs("evt_force", "first").await, 1);
}

/// Prune deletes only finished events older than the cutoff, oldest first
/// in batches, with their step and audit rows; dead ones only when asked.
pub async fn prune_deletes_only_finished_events_older_than_the_cutoff(db: TestDb) {
    let handlers = || {
        three_steps().on(
            "shop",
            "order.failed",
            Handler::new().named_step(
                "first",
                Flaky {
                    fail_first: 99,
                    terminal: true,
                },
            ),
        )
    };
    let engine = engine(&db, handlers());
    for id in ["evt_done_old", "evt_done_new", "evt_cancelled_old"] {
        order_paid(&engine, id).await;
    }
    let accept = |id: &'static str, kind: &'static str| {
        engine.accept(NewEvent::with_id("shop", id, kind, json!({})))
    };
    accept("evt_dead_old", "order.failed").await.unwrap();
    accept("evt_ignored_old", "order.unknown").await.unwrap();
    let cancelled = db.record_of("shop", "evt_cancelled_old").await.event.seq;
    db.store.event_cancel(cancelled, ops("test")).await.unwrap();
    run_until_idle(&db, handlers()).await;
    engine
        .accept(
            NewEvent::with_id("shop", "evt_pending_old", "order.paid", json!({}))
                .not_before(Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    age(
        &db,
        &[
            "evt_done_old",
            "evt_cancelled_old",
            "evt_dead_old",
            "evt_ignored_old",
            "evt_pending_old",
        ],
        10,
    )
    .await;
    let mut doomed = Vec::new();
    for id in ["evt_done_old", "evt_cancelled_old", "evt_ignored_old"] {
        doomed.push(db.record_of("shop", id).await.event.seq);
    }

    let three_days = Duration::from_secs(3 * 86_400);
    assert_eq!(
        db.store
            .event_prune(&prune(three_days, false, 2))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        db.store
            .event_prune(&prune(three_days, false, 2))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        db.store
            .event_prune(&prune(three_days, false, 2))
            .await
            .unwrap(),
        0
    );
    let mut left: Vec<String> = db
        .store
        .event_list(&EventFilter {
            limit: 100,
            ..EventFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.event.id)
        .collect();
    left.sort();
    assert_eq!(left, ["evt_dead_old", "evt_done_new", "evt_pending_old"]);
    let doomed_list = doomed
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    for table in ["tickmark_steps", "tickmark_audit"] {
        assert_eq!(
            db.probe
                .scalar(&format!(
                    "SELECT count(*) FROM {table} WHERE event_seq IN ({doomed_list})"
                ))
                .await,
            0,
            "{table} rows go with their event"
        );
    }
    assert!(db.probe.scalar("SELECT count(*) FROM tickmark_steps").await > 0);

    assert_eq!(
        db.store
            .event_prune(&prune(three_days, true, 10))
            .await
            .unwrap(),
        1
    );
    assert!(db
        .store
        .event_find("shop", "evt_dead_old")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        db.store
            .event_prune(&prune(Duration::from_secs(3600), true, 10))
            .await
            .unwrap(),
        0,
        "a pending event is never pruned, and a new one is not old enough"
    );
}

/// One prune batch: events older than `older_than`, with tombstones for
/// those within prune's default dedup window (30 days).
fn prune(older_than: Duration, include_dead: bool, batch: u32) -> PruneBatch {
    PruneBatch {
        older_than,
        dedup_window: Duration::from_secs(30 * 86_400),
        include_dead,
        batch,
    }
}

/// Status: counts by state and source (in lifecycle order), the oldest due
/// pending event's age, stuck leases, and throughput per minute.
pub async fn status_counts_states_stuck_events_and_throughput(db: TestDb) {
    let handlers = || {
        three_steps().on(
            "shop",
            "order.failed",
            Handler::new().named_step(
                "first",
                Flaky {
                    fail_first: 99,
                    terminal: true,
                },
            ),
        )
    };
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_1").await;
    order_paid(&engine, "evt_2").await;
    engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_dead",
            "order.failed",
            json!({}),
        ))
        .await
        .unwrap();
    engine
        .accept(NewEvent::with_id("github", "gh_1", "push", json!({})))
        .await
        .unwrap();
    run_until_idle(&db, handlers()).await;
    order_paid(&engine, "evt_stuck").await;
    let stuck = claim_one(&db, "vanished").await;
    db.probe.expire_lease(stuck.lease.event_seq).await;
    order_paid(&engine, "evt_waiting").await;

    let report = db.store.status(15).await.unwrap();
    assert_eq!(
        report.counts,
        [
            (EventState::Pending, "shop".to_owned(), 1),
            (EventState::Running, "shop".to_owned(), 1),
            (EventState::Done, "shop".to_owned(), 2),
            (EventState::Dead, "shop".to_owned(), 1),
            (EventState::Ignored, "github".to_owned(), 1),
        ]
    );
    assert_eq!(report.stuck, 1);
    let age = report.oldest_pending_age.expect("a due pending event");
    assert!(age < Duration::from_secs(60), "{age:?}");
    assert_eq!(report.done_per_minute.len(), 15);
    assert_eq!(report.done_per_minute[0], 2, "{:?}", report.done_per_minute);
    assert_eq!(report.done_per_minute.iter().sum::<i64>(), 2);
    assert_eq!(db.store.status(3).await.unwrap().done_per_minute.len(), 3);
    assert_eq!(db.store.sources().await.unwrap(), ["github", "shop"]);
}

/// Listing filters by state, source, kind and age, newest first; lookup takes
/// a row number or a dedup key (optionally within a source).
pub async fn events_are_listed_and_looked_up_by_number_or_key(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_a").await;
    let accept = |source: &'static str, id: &'static str, kind: &'static str| {
        engine.accept(NewEvent::with_id(source, id, kind, json!({})))
    };
    accept("shop", "evt_b", "order.refunded").await.unwrap();
    accept("shop", "4242", "order.paid").await.unwrap();
    accept("shop", "evt_shared", "order.refunded")
        .await
        .unwrap();
    accept("stripe", "evt_shared", "invoice.paid")
        .await
        .unwrap();
    age(&db, &["evt_a"], 2).await;

    let list = |filter: EventFilter| {
        let store = db.store.clone();
        async move {
            store
                .event_list(&filter)
                .await
                .unwrap()
                .into_iter()
                .map(|r| format!("{}/{}", r.event.source, r.event.id))
                .collect::<Vec<_>>()
        }
    };
    let all = || EventFilter {
        limit: 50,
        ..EventFilter::default()
    };
    assert_eq!(
        list(all()).await,
        [
            "stripe/evt_shared",
            "shop/evt_shared",
            "shop/4242",
            "shop/evt_b",
            "shop/evt_a"
        ],
        "newest first"
    );
    assert_eq!(
        list(EventFilter { limit: 2, ..all() }).await,
        ["stripe/evt_shared", "shop/evt_shared"]
    );
    assert_eq!(
        list(EventFilter {
            state: Some(EventState::Pending),
            ..all()
        })
        .await,
        ["shop/4242", "shop/evt_a"]
    );
    assert_eq!(
        list(EventFilter {
            source: Some("stripe".into()),
            ..all()
        })
        .await,
        ["stripe/evt_shared"]
    );
    assert_eq!(
        list(EventFilter {
            kind: Some("order.refunded".into()),
            ..all()
        })
        .await,
        ["shop/evt_shared", "shop/evt_b"]
    );
    assert_eq!(
        list(EventFilter {
            since: Some(Duration::from_secs(86_400)),
            ..all()
        })
        .await
        .len(),
        4,
        "evt_a arrived two days ago"
    );

    let lookup = |id: &'static str, source: Option<&'static str>| {
        let store = db.store.clone();
        async move {
            store
                .event_lookup(id, source)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.event.seq, r.event.source, r.event.id))
                .collect::<Vec<_>>()
        }
    };
    let a = db.record_of("shop", "evt_a").await.event.seq;
    let by_number = db.store.event_lookup(&a.to_string(), None).await.unwrap();
    assert_eq!(by_number.len(), 1);
    assert_eq!(by_number[0].event.id, "evt_a");
    let digits = lookup("4242", None).await;
    assert_eq!(digits.len(), 1, "no row 4242: the digits are a dedup key");
    assert_eq!(digits[0].2, "4242");
    assert_eq!(lookup("evt_shared", None).await.len(), 2);
    let stripe = lookup("evt_shared", Some("stripe")).await;
    assert_eq!((stripe.len(), stripe[0].1.as_str()), (1, "stripe"));
    assert!(lookup("evt_nope", None).await.is_empty());
    assert!(
        db.store
            .event_lookup(&a.to_string(), Some("stripe"))
            .await
            .unwrap()
            .is_empty(),
        "a row number from another source is not it"
    );

    let plan = db.store.event_plan(a).await.unwrap().expect("a plan");
    assert_eq!(plan["steps"][1]["name"], "second");
    assert!(db.store.event_plan(999_999).await.unwrap().is_none());
}
