//! Exact blame for a poison step, with real kills: a step that SIGKILLs its
//! worker process every time it runs, claimed in a batch beside 500
//! innocent events, by workers of 16 slots that claim up to 256 events at
//! once and hold up to 1,024 ahead (64× the slots) while events are quick.
//! Only the poison is charged, once per crash it caused while running
//! alone, and it is dead-lettered after exactly `max_attempts` charged
//! crashes (after the two uncharged ones in a batch: the first loss and
//! its second chance); every innocent event finishes with one attempt
//! charged, however often a crash beside the poison interrupted it
//! (docs/guarantees.md, "A crash is charged to the event that caused it").

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tickmark::{Backend, EventState, Handler, Handlers, NewEvent, RetryPolicy, StepState};
use tickmark_tests::conformance::engine;
use tickmark_tests::test_steps::{KillWorker, Record};
use tickmark_tests::TestDb;
use tokio::process::Command;

const WORKER: &str = env!("CARGO_BIN_EXE_tickmark-test-worker");
const INNOCENT: usize = 500;
const MAX_ATTEMPTS: u32 = 3;
/// Crashes in a batch before the poison runs alone: its first loss, and
/// the loss of its second chance.
const UNCHARGED_CRASHES: u32 = 2;

async fn a_poison_step_is_charged_alone_and_its_neighbours_never(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let retry = RetryPolicy {
        jitter: 0.0,
        ..RetryPolicy::attempts(MAX_ATTEMPTS)
            .delays(Duration::from_millis(20), Duration::from_millis(50))
    };
    let handlers = Handlers::new()
        .on(
            "shop",
            "order.paid",
            Handler::new()
                .named_step("record", Record::default())
                .retry(retry),
        )
        .on(
            "shop",
            "order.poison",
            Handler::new().named_step("kill", KillWorker).retry(retry),
        );
    let engine = engine(&db, handlers);
    // The poison in the middle of the backlog: claimed in a full batch,
    // with events prefetched and running beside it.
    for n in 0..INNOCENT {
        if n == INNOCENT / 2 {
            engine
                .accept(NewEvent::with_id(
                    "shop",
                    "evt_poison",
                    "order.poison",
                    json!({}),
                ))
                .await
                .unwrap();
        }
        engine
            .accept(NewEvent::with_id(
                "shop",
                format!("evt_{n:03}"),
                "order.paid",
                json!({ "n": n }),
            ))
            .await
            .unwrap();
    }

    // Run worker processes one after the other until one drains the
    // backlog and exits on its own; each of the others was killed. How
    // many events each held beside the poison when it died:
    let mut held_beside = Vec::new();
    let mut kills = 0;
    loop {
        let status = Command::new(WORKER)
            .args([
                "--database-url",
                &db.url,
                "--name",
                &format!("worker-{kills}"),
                "--lease-ms",
                "1500",
                "--concurrency",
                "16",
                "--prefetch",
                "1024",
                "--claim-batch",
                "256",
                "--until-idle",
            ])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .expect("run the test worker");
        if status.success() {
            break;
        }
        // Leases the dead worker still held: its own, never finished (an
        // older suspect still waiting belongs to the worker before it).
        held_beside.push(
            db.probe
                .scalar(&format!(
                    "SELECT count(*) FROM tickmark_events \
                     WHERE state = 'running' AND kind = 'order.paid' \
                       AND lease_owner = 'worker-{kills}'"
                ))
                .await,
        );
        kills += 1;
        assert!(
            kills <= MAX_ATTEMPTS + UNCHARGED_CRASHES,
            "more crashes than the poison may cause: {kills} ({status:?})"
        );
    }

    let innocent_done = db
        .probe
        .scalar(
            "SELECT count(*) FROM tickmark_steps AS s JOIN tickmark_events AS e \
             ON e.id = s.event_seq \
             WHERE e.kind = 'order.paid' AND e.state = 'done' AND s.state = 'done'",
        )
        .await;
    assert_eq!(
        innocent_done, INNOCENT as i64,
        "every innocent event finished"
    );
    let innocent_charged = db
        .probe
        .scalar(
            "SELECT count(*) FROM tickmark_events \
             WHERE kind = 'order.paid' AND attempt - interrupted <> 1",
        )
        .await;
    assert_eq!(
        innocent_charged, 0,
        "every innocent event finished on its first charged attempt"
    );
    let innocent_interrupted = db
        .probe
        .scalar(
            "SELECT count(*) FROM tickmark_events WHERE kind = 'order.paid' AND interrupted > 0",
        )
        .await;
    assert!(
        innocent_interrupted > 0,
        "some innocent events were interrupted by the poison's crashes (else this test shows nothing)"
    );

    let poison = db.record_of("shop", "evt_poison").await;
    assert_eq!(poison.state, EventState::Dead);
    assert!(
        poison
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("ran out of attempts"),
        "{:?}",
        poison.last_error
    );
    let poison_charged = db
        .probe
        .scalar(&format!(
            "SELECT CAST(attempt - interrupted AS BIGINT) FROM tickmark_events WHERE id = {}",
            poison.event.seq
        ))
        .await;
    assert_eq!(
        poison_charged,
        i64::from(MAX_ATTEMPTS),
        "the poison is charged exactly max_attempts"
    );
    // Two crashes in a batch (not charged: nobody knew who caused them),
    // then one per attempt, each run alone and charged.
    let poison_runs = db.probe.runs("evt_poison", "kill").await;
    assert_eq!(poison_runs, i64::from(MAX_ATTEMPTS + UNCHARGED_CRASHES));
    assert_eq!(i64::from(kills), poison_runs, "every kill was the poison's");
    let steps = db.store.step_status(poison.event.seq).await.unwrap();
    assert_eq!(
        (steps[0].state, i64::from(steps[0].attempts)),
        (StepState::Dead, poison_runs),
        "the step-status table shows every run"
    );
    assert!(
        held_beside[0] > 0,
        "the first kill came with a batch in hand: {held_beside:?}"
    );
    let charged_kills = &held_beside[UNCHARGED_CRASHES as usize..];
    assert!(
        charged_kills.iter().all(|&n| n == 0),
        "every charged kill came with the poison alone in hand: {held_beside:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_poison_step_is_charged_alone_and_its_neighbours_never() {
    a_poison_step_is_charged_alone_and_its_neighbours_never(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_poison_step_is_charged_alone_and_its_neighbours_never() {
    a_poison_step_is_charged_alone_and_its_neighbours_never(Backend::Postgres).await;
}
