//! Flow control across the fleet (docs/flow_control.md): rate limits per
//! key shared by every worker on the database, and concurrency limits per
//! key decided in the claim.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use tickmark::flow::RateLimit;
use tickmark::{Accepted, Engine, EventState, Handler, Handlers, NewEvent, StepState};
use tickmark_driver::store::{ClaimParams, Release};

use super::{engine, quick_worker};
use crate::test_steps::Record;
use crate::{wait, TestDb};

/// A limit so slow that no token refills during a test: only the burst
/// is ever granted, whatever the machine's speed.
fn slow_api(burst: u32) -> RateLimit {
    RateLimit::new("api", 1, Duration::from_secs(600)).burst(burst)
}

fn rate_limited_handlers(burst: u32) -> Handlers {
    Handlers::new().rate_limit(slow_api(burst)).on(
        "shop",
        "product.updated",
        Handler::new()
            .named_step("push", Record::default())
            .rate_limited("api", "/shop"),
    )
}

async fn accept(engine: &Engine, id: &str, payload: serde_json::Value) -> i64 {
    match engine
        .accept(NewEvent::with_id("shop", id, "product.updated", payload))
        .await
        .unwrap()
    {
        Accepted::New { seq } => seq,
        other => panic!("expected new, got {other:?}"),
    }
}

/// How many of these events are in each step state.
async fn states(db: &TestDb, seqs: &[i64]) -> HashMap<StepState, usize> {
    let mut counts = HashMap::new();
    for seq in seqs {
        let state = db.store.step_status(*seq).await.unwrap()[0].state;
        *counts.entry(state).or_default() += 1;
    }
    counts
}

/// Guarantee 10: a rate-limited step runs only with a token from its key's
/// bucket; one that finds the bucket empty does not run, spends no attempt,
/// holds no lease, and shows as `throttled` until its token is due. Other
/// keys are not held up.
pub async fn an_empty_bucket_throttles_the_step_without_spending_an_attempt(db: TestDb) {
    let engine = engine(&db, rate_limited_handlers(2));
    let mut shop_a = Vec::new();
    for n in 0..3 {
        shop_a.push(accept(&engine, &format!("evt_a{n}"), json!({"shop": "a"})).await);
    }
    let shop_b = accept(&engine, "evt_b0", json!({"shop": "b"})).await;
    let worker = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings");
    let running = tokio::spawn(worker.run_until_idle());

    wait::until(
        "two events of shop a done, one throttled, shop b done",
        Duration::from_secs(30),
        || async {
            let a = states(&db, &shop_a).await;
            let b = states(&db, &[shop_b]).await;
            a.get(&StepState::Done) == Some(&2)
                && a.get(&StepState::Throttled) == Some(&1)
                && b.get(&StepState::Done) == Some(&1)
        },
    )
    .await;
    let mut throttled = None;
    for seq in &shop_a {
        let step = db.store.step_status(*seq).await.unwrap().remove(0);
        match step.state {
            StepState::Done => assert_eq!(step.attempts, 1, "{step:?}"),
            StepState::Throttled => throttled = Some((*seq, step)),
            other => panic!("unexpected state {other:?}"),
        }
    }
    let (seq, step) = throttled.expect("one throttled event");
    assert_eq!(step.attempts, 0, "a throttled step spends no attempt");
    let due = step.retry_at.expect("a throttled step has a due time");
    assert!(
        due > Utc::now() + chrono::Duration::seconds(300),
        "due when its token is, not polled: {due}"
    );
    let why = step.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("rate limit `api`") && why.contains("api:a"),
        "{why}"
    );
    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Pending, "no lease is held");
    assert_eq!(
        db.probe.runs_of("push").await,
        3,
        "the throttled step never ran"
    );

    // Time passes: the bucket refills and the event falls due.
    db.probe
        .execute("UPDATE tickmark_rate_buckets SET tat_us = 0, wait_us = 0")
        .await;
    db.probe.expire_lease(seq).await;
    running.await.unwrap().unwrap();
    let step = db.store.step_status(seq).await.unwrap().remove(0);
    assert_eq!(
        (step.state, step.attempts),
        (StepState::Done, 1),
        "it ran on its first attempt"
    );
}

/// Guarantee 10, fleet-wide: two engines (as two processes would) on one
/// database share each key's bucket, so together they run only its burst.
pub async fn workers_on_one_database_share_each_bucket(db: TestDb) {
    let first = engine(&db, rate_limited_handlers(2));
    let second = engine(&db, rate_limited_handlers(2));
    let mut seqs = Vec::new();
    for n in 0..6 {
        let engine = if n % 2 == 0 { &first } else { &second };
        seqs.push(accept(engine, &format!("evt_{n}"), json!({"shop": "a"})).await);
    }
    let workers = [
        tokio::spawn(first.worker(quick_worker("w1")).unwrap().run_until_idle()),
        tokio::spawn(second.worker(quick_worker("w2")).unwrap().run_until_idle()),
    ];
    wait::until(
        "the burst done and the rest throttled",
        Duration::from_secs(30),
        || async {
            let counts = states(&db, &seqs).await;
            counts.get(&StepState::Done) == Some(&2)
                && counts.get(&StepState::Throttled) == Some(&4)
        },
    )
    .await;
    assert_eq!(db.probe.runs_of("push").await, 2);
    for worker in workers {
        worker.abort();
    }
}

/// A plan naming a rate limit this build does not define is parked, not
/// run unlimited.
pub async fn an_unknown_rate_limit_parks_the_event(db: TestDb) {
    let old = engine(&db, rate_limited_handlers(2));
    let seq = accept(&old, "evt_1", json!({"shop": "a"})).await;
    let new = engine(
        &db,
        Handlers::new().on(
            "shop",
            "product.updated",
            Handler::new().named_step("push", Record::default()),
        ),
    );
    new.worker(quick_worker("w"))
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Parked);
    assert!(
        record
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("rate limit `api`"),
        "{record:?}"
    );
    assert_eq!(db.probe.runs_of("push").await, 0);
}

fn limited_handlers(limit: u32, pause_ms: u64) -> Handlers {
    Handlers::new().on(
        "shop",
        "product.updated",
        Handler::new()
            .named_step(
                "push",
                Record {
                    pause_ms,
                    ..Record::default()
                },
            )
            .concurrency_per("/shop", limit),
    )
}

fn claim(worker: &str, limit: u32) -> ClaimParams<'_> {
    ClaimParams::new(worker, limit, Duration::from_secs(60))
}

/// Guarantee 11: the claim leases at most N events of a key at once, in
/// one batch or across claimers; a key's slot frees when its event leaves
/// `running`; other keys are not held up.
pub async fn a_key_never_has_more_running_events_than_its_limit(db: TestDb) {
    let engine = engine(&db, limited_handlers(2, 0));
    for n in 0..5 {
        accept(&engine, &format!("evt_a{n}"), json!({"shop": "a"})).await;
    }
    let b = accept(&engine, "evt_b", json!({"shop": "b"})).await;
    let free = accept(&engine, "evt_free", json!({})).await;

    let first = db.store.event_claim_many(&claim("w1", 10)).await.unwrap();
    let of_a: Vec<_> = first
        .iter()
        .filter(|e| e.event.payload["shop"] == "a")
        .collect();
    assert_eq!(of_a.len(), 2, "one batch stays within the limit");
    let others: Vec<i64> = first
        .iter()
        .filter(|e| e.event.payload["shop"] != "a")
        .map(|e| e.lease.event_seq)
        .collect();
    assert_eq!(
        others.len(),
        2,
        "shop b and the unkeyed event are claimed too"
    );
    assert!(others.contains(&b) && others.contains(&free));

    let second = db.store.event_claim_many(&claim("w2", 10)).await.unwrap();
    assert!(second.is_empty(), "the key is full: {second:?}");

    // One of the key's events is given back: one slot frees, for one event.
    db.store
        .event_release(&of_a[0].lease, &Release::now(true))
        .await
        .unwrap();
    let third = db.store.event_claim_many(&claim("w3", 10)).await.unwrap();
    assert_eq!(third.len(), 1, "{third:?}");
    let fourth = db.store.event_claim_many(&claim("w4", 10)).await.unwrap();
    assert!(fourth.is_empty(), "{fourth:?}");

    // A lease that expires frees its slot too (its worker died).
    db.probe.expire_lease(of_a[1].lease.event_seq).await;
    let fifth = db.store.event_claim_many(&claim("w5", 10)).await.unwrap();
    assert_eq!(fifth.len(), 1, "{fifth:?}");
}

/// Guarantee 11 under racing claimers: many single-event claims at once
/// still lease only the limit.
pub async fn racing_claims_never_exceed_a_keys_limit(db: TestDb) {
    let engine = engine(&db, limited_handlers(2, 0));
    for n in 0..8 {
        accept(&engine, &format!("evt_{n}"), json!({"shop": "a"})).await;
    }
    let mut claims = tokio::task::JoinSet::new();
    for n in 0..8 {
        let store = db.store.clone();
        claims.spawn(async move {
            let name = format!("w{n}");
            store
                .event_claim_many(&ClaimParams::new(&name, 1, Duration::from_secs(60)))
                .await
                .unwrap()
                .len()
        });
    }
    let mut leased = 0;
    while let Some(claimed) = claims.join_next().await {
        leased += claimed.unwrap();
    }
    assert_eq!(leased, 2);
}

/// Guarantee 11 end to end: two workers run every event of a key, never
/// more than its limit at once (the steps' run windows never overlap by
/// more than two), and the other keys alongside.
pub async fn workers_run_every_event_of_a_limited_key(db: TestDb) {
    let first = engine(&db, limited_handlers(2, 40));
    let second = engine(&db, limited_handlers(2, 40));
    let mut seqs = Vec::new();
    for n in 0..8 {
        seqs.push(accept(&first, &format!("evt_a{n}"), json!({"shop": "a"})).await);
        accept(&second, &format!("evt_b{n}"), json!({"shop": "b"})).await;
    }
    let workers = [
        tokio::spawn(first.worker(quick_worker("w1")).unwrap().run_until_idle()),
        tokio::spawn(second.worker(quick_worker("w2")).unwrap().run_until_idle()),
    ];
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    let mut windows: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for seq in &seqs {
        let step = db.store.step_status(*seq).await.unwrap().remove(0);
        assert_eq!(step.state, StepState::Done);
        windows.push((step.started_at.unwrap(), step.finished_at.unwrap()));
    }
    for (start, _) in &windows {
        let overlapping = windows
            .iter()
            .filter(|(s, f)| s <= start && start < f)
            .count();
        assert!(
            overlapping <= 2,
            "{overlapping} steps of one key ran at once: {windows:?}"
        );
    }
    assert_eq!(db.probe.runs_of("push").await, 16);
}

fn debounced_handlers(stale_check: bool) -> Handlers {
    let handler = Handler::new()
        .named_step("push", Record::default())
        .debounce_per(
            "/product",
            Duration::from_millis(200),
            Duration::from_secs(10),
        );
    let handler = if stale_check {
        handler.skip_stale("/product", "/version")
    } else {
        handler
    };
    Handlers::new().on("shop", "product.updated", handler)
}

/// Guarantee 12: a burst of one key's events runs its handler once, for
/// the latest; the others are recorded `superseded`, pointing at it, and
/// a redelivery of one of them is still a duplicate.
pub async fn a_burst_of_one_key_runs_once_for_the_latest_event(db: TestDb) {
    let engine = engine(&db, debounced_handlers(false));
    // Accepted before any worker runs: the whole burst waits together,
    // whatever the machine's speed.
    let mut p1 = Vec::new();
    for n in 0..5 {
        p1.push(
            accept(
                &engine,
                &format!("evt_p1_{n}"),
                json!({"product": "p1", "n": n}),
            )
            .await,
        );
    }
    let p2 = accept(&engine, "evt_p2", json!({"product": "p2"})).await;
    let no_key = accept(&engine, "evt_none", json!({})).await;
    let latest = *p1.last().unwrap();
    // Each arrival supersedes the one waiting before it: the pointers
    // form a chain that ends at the event that runs.
    for pair in p1.windows(2) {
        let (older, newer) = (pair[0], pair[1]);
        let record = db.store.event_get(older).await.unwrap().unwrap();
        assert_eq!(record.state, EventState::Superseded, "{record:?}");
        let why = record.last_error.unwrap_or_default();
        assert!(
            why.contains(&format!("superseded by event {newer}")),
            "{why}"
        );
        assert_eq!(
            db.store.step_status(older).await.unwrap()[0].state,
            StepState::Superseded
        );
        let pointer = db
            .probe
            .scalar(&format!(
                "SELECT superseded_by FROM tickmark_events WHERE id = {older}"
            ))
            .await;
        assert_eq!(pointer, newer);
    }
    assert_eq!(
        db.store.event_get(latest).await.unwrap().unwrap().state,
        EventState::Pending
    );
    let counts = db.store.event_counts().await.unwrap();
    assert_eq!(
        counts.superseded,
        vec![("shop".to_owned(), "product.updated".to_owned(), 4)],
        "/metrics counts them per handler"
    );

    engine
        .worker(quick_worker("w"))
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    for seq in [latest, p2, no_key] {
        let record = db.store.event_get(seq).await.unwrap().unwrap();
        assert_eq!(record.state, EventState::Done, "{record:?}");
    }
    assert_eq!(db.probe.runs("evt_p1_4", "push").await, 1);
    assert_eq!(
        db.probe.runs_of("push").await,
        3,
        "one run per key, one unkeyed"
    );
    let again = engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_p1_0",
            "product.updated",
            json!({"product": "p1", "n": 0}),
        ))
        .await
        .unwrap();
    assert_eq!(again, Accepted::Duplicate);
}

/// Guarantee 12 with a sequence: the event kept is the newest, whatever
/// order the burst arrived in.
pub async fn a_debounced_burst_keeps_the_newest_sequence(db: TestDb) {
    let engine = engine(&db, debounced_handlers(true));
    accept(&engine, "evt_v3", json!({"product": "p1", "version": 3})).await;
    accept(&engine, "evt_v1", json!({"product": "p1", "version": 1})).await;
    accept(&engine, "evt_v2", json!({"product": "p1", "version": 2})).await;
    engine
        .worker(quick_worker("w"))
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(db.probe.runs("evt_v3", "push").await, 1);
    assert_eq!(db.probe.runs_of("push").await, 1);
    for id in ["evt_v1", "evt_v2"] {
        assert_eq!(db.record_of("shop", id).await.state, EventState::Superseded);
    }
}

/// An event that has started is never superseded: a later event of its
/// key waits its own window and runs after it.
pub async fn a_started_event_is_not_superseded(db: TestDb) {
    let engine = engine(&db, debounced_handlers(false));
    let first = accept(&engine, "evt_1", json!({"product": "p1"})).await;
    db.probe.expire_lease(first).await; // due now
    let claimed = db.store.event_claim_many(&claim("w1", 10)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let second = accept(&engine, "evt_2", json!({"product": "p1"})).await;
    let first_record = db.store.event_get(first).await.unwrap().unwrap();
    assert_eq!(first_record.state, EventState::Running);
    let second_record = db.store.event_get(second).await.unwrap().unwrap();
    assert_eq!(second_record.state, EventState::Pending);
}

/// Guarantee 12 under racing accepts (several receivers at once): one
/// event of the key is left waiting, every other is superseded.
pub async fn racing_accepts_of_one_key_leave_one_event_waiting(db: TestDb) {
    let engine = std::sync::Arc::new(engine(&db, debounced_handlers(false)));
    let mut accepts = tokio::task::JoinSet::new();
    for n in 0..16 {
        let engine = std::sync::Arc::clone(&engine);
        accepts.spawn(async move {
            accept(&engine, &format!("evt_{n}"), json!({"product": "p1"})).await
        });
    }
    while let Some(accepted) = accepts.join_next().await {
        accepted.unwrap();
    }
    let waiting = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'pending'")
        .await;
    let superseded = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'superseded'")
        .await;
    assert_eq!((waiting, superseded), (1, 15));
}
