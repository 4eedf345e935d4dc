//! Personal data (docs/privacy.md), read where an attacker with the disk
//! would read it: a full `pg_dump` of the test schema, and the bytes of
//! the SQLite file and its WAL.
//!
//! With keys set, a marker in the payloads and the outputs is in neither.
//! After its subject is erased, the marker is gone from both (encryption
//! off, so it was there in clear before), a redelivery of each erased
//! event is a duplicate that runs nothing, an erased event that had not
//! run never runs, and another subject's events are untouched. A rotation
//! killed again and again while workers run loses nothing, and leaves every
//! value sealed with the new key and the old one retired.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::operator::{Actor, Operations, RetryRequest};
use tickmark::privacy::{sealed_with, EraseRequest, Keyring, Privacy, Subject, SubjectKey};
use tickmark::{
    Accepted, Backend, Engine, Handler, Handlers, NewEvent, Step, StepContext, StepResult,
};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::{oneshot, Outgoing};
use tickmark_tests::TestDb;

/// Two keys, as `TICKMARK_KEYS` entries.
const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const K2: &str = "k2:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const SUBJECT_KEY: &str = "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";

/// In the payloads of customer c-1's events, and echoed into their outputs.
const MARKER: &str = "marker-7f3a@example.com";
/// In customer c-2's.
const OTHER: &str = "other-91b2@example.com";

/// How many times the echo step ran, all events together.
#[derive(Default)]
struct Runs(AtomicUsize);

/// Echoes the payload's note into its output.
#[derive(Debug, Serialize, Deserialize)]
struct EchoNote;

#[typetag::serde(name = "privacy_echo_note")]
#[async_trait::async_trait]
impl Step for EchoNote {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        ctx.resource::<Arc<Runs>>()?
            .0
            .fetch_add(1, Ordering::SeqCst);
        Ok(json!({ "echo": ctx.event().payload["note"] }))
    }
}

fn handlers() -> Handlers {
    Handlers::new().on(
        "shop",
        "orders/create",
        Handler::new()
            .named_step("echo", EchoNote)
            .subject("customer", "/customer/id")
            .subject("email", "/customer/email"),
    )
}

fn privacy(keys: Option<&str>) -> Privacy {
    let privacy = Privacy::new().with_subject_key(SubjectKey::parse(SUBJECT_KEY).unwrap());
    match keys {
        Some(keys) => privacy.with_keys(Keyring::parse(keys).unwrap()),
        None => privacy,
    }
}

fn private_engine(db: &TestDb, keys: Option<&str>, runs: &Arc<Runs>) -> Engine {
    engine(db, handlers())
        .with_privacy(privacy(keys))
        .with_resource(Arc::clone(runs))
}

fn order(id: &str, customer: &str, note: &str) -> NewEvent {
    NewEvent::with_id(
        "shop",
        id,
        "orders/create",
        json!({ "customer": { "id": customer, "email": note }, "note": note }),
    )
}

async fn run_until_idle(engine: &Engine) {
    engine
        .worker(quick_worker("privacy"))
        .unwrap()
        .run_until_idle()
        .await
        .expect("worker");
}

/// Everything the database holds, as an attacker with its files reads it:
/// `pg_dump` of the test's schema, or the SQLite file and its WAL, bytes.
async fn at_rest(db: &TestDb) -> String {
    match db.backend() {
        Backend::Postgres => {
            let schema = db
                .url
                .split("options[search_path]=")
                .nth(1)
                .and_then(|rest| rest.split('&').next())
                .expect("the test schema is in the URL");
            let server = tickmark_tests::db::postgres_url().expect("PostgreSQL is not skipped");
            let output = tokio::process::Command::new("pg_dump")
                .args(["--schema", schema, "--dbname", &server])
                .output()
                .await
                .expect("run pg_dump (the PostgreSQL client tools)");
            assert!(
                output.status.success(),
                "pg_dump failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
        Backend::Sqlite => {
            let path = db.url.trim_start_matches("sqlite://");
            let mut bytes = std::fs::read(path).expect("the SQLite file");
            for suffix in ["-wal", "-shm"] {
                if let Ok(more) = std::fs::read(format!("{path}{suffix}")) {
                    bytes.extend(more);
                }
            }
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }
}

tickmark_tests::per_backend!(fresh_db => [
    payloads_and_outputs_are_sealed_at_rest,
    an_erased_subject_keeps_its_dedup_and_only_its_data_goes,
    a_running_event_finishes_before_it_is_erased,
    the_keys_are_checked_before_anything_is_written,
    a_rotation_killed_again_and_again_loses_nothing,
]);

async fn payloads_and_outputs_are_sealed_at_rest(db: TestDb) {
    let runs = Arc::new(Runs::default());
    let engine = private_engine(&db, Some(K1), &runs);
    for n in 0..3 {
        let accepted = engine
            .accept(order(&format!("o-{n}"), "c-1", MARKER))
            .await
            .unwrap();
        assert!(matches!(accepted, Accepted::New { .. }));
    }
    run_until_idle(&engine).await;
    assert_eq!(runs.0.load(Ordering::SeqCst), 3);

    let stored = at_rest(&db).await;
    assert!(!stored.contains(MARKER), "the marker is stored in clear");
    assert!(
        stored.contains("tickmark:sealed:1:k1:"),
        "nothing sealed was found at rest"
    );

    // The engine reads them opened: the payload and the step's output.
    let status = engine.event_status("shop", "o-0").await.unwrap().unwrap();
    assert_eq!(status.record.event.payload["note"], MARKER);
    assert_eq!(status.steps[0].output, Some(json!({ "echo": MARKER })));
    // The step-status table stays queryable in clear.
    assert_eq!(status.steps[0].idempotency_key, "shop:o-0:echo");

    // The dashboard says so plainly: opened with the engine's key, named
    // without it, never shown sealed.
    let seq = status.record.event.seq;
    let page = event_page(&engine, seq).await;
    assert!(page.contains("encrypted at rest (key k1)"), "{page}");
    assert!(page.contains(MARKER), "{page}");
    let page = event_page(&engine_without_keys(&db), seq).await;
    assert!(page.contains("[encrypted with key k1]"), "{page}");
    assert!(
        !page.contains(MARKER) && !page.contains("tickmark:sealed:"),
        "{page}"
    );
}

const DASHBOARD_TOKEN: &str = "a-dashboard-token-of-32-bytes-or-more";

/// The dashboard's page of event `seq`, as an operator with the token sees it.
async fn event_page(engine: &Engine, seq: i64) -> String {
    let dashboard = tickmark::dashboard::Dashboard::new(engine.clone())
        .token(DASHBOARD_TOKEN)
        .router();
    let reply = oneshot(
        &dashboard,
        &Outgoing::get(format!("/events/{seq}"))
            .header("authorization", format!("Bearer {DASHBOARD_TOKEN}")),
    )
    .await;
    assert_eq!(reply.status, 200);
    String::from_utf8(reply.body.to_vec()).unwrap()
}

/// An engine on `db` without keys (a dashboard deployed without them).
fn engine_without_keys(db: &TestDb) -> Engine {
    Engine::new(db.store.clone(), Handlers::new()).unwrap()
}

async fn an_erased_subject_keeps_its_dedup_and_only_its_data_goes(db: TestDb) {
    let runs = Arc::new(Runs::default());
    // Encryption off: the marker is in clear until the erasure.
    let engine = private_engine(&db, None, &runs);
    engine.accept(order("o-1", "c-1", MARKER)).await.unwrap();
    engine.accept(order("o-2", "c-2", OTHER)).await.unwrap();
    run_until_idle(&engine).await;
    // One more of c-1's, not run yet (due in a day): it must never run.
    let later = chrono::Utc::now() + chrono::Duration::days(1);
    engine
        .accept(order("o-3", "c-1", MARKER).not_before(later))
        .await
        .unwrap();
    assert_eq!(runs.0.load(Ordering::SeqCst), 2);
    assert!(at_rest(&db).await.contains(MARKER));

    let report = engine
        .erase_subject(
            &Subject::new("customer", "c-1"),
            &EraseRequest {
                actor: "tester",
                reason: "customers/redact",
                wait_for_running: Duration::ZERO,
                except_event: None,
            },
        )
        .await
        .unwrap();
    let o1 = db.record_of("shop", "o-1").await;
    let o3 = db.record_of("shop", "o-3").await;
    assert_eq!(report.erased, [o1.event.seq, o3.event.seq]);
    assert_eq!(
        report.cancelled,
        [o3.event.seq],
        "the unrun event is cancelled"
    );
    assert!(report.is_complete());

    let stored = at_rest(&db).await;
    assert!(
        !stored.contains(MARKER),
        "the erased subject's marker is still stored"
    );
    assert!(stored.contains(OTHER), "another subject's data was erased");

    // Rows, keys and step states stay; payloads and outputs are gone.
    let status = engine.event_status("shop", "o-1").await.unwrap().unwrap();
    assert!(status.record.erased_at.is_some());
    assert_eq!(status.record.event.payload, serde_json::Value::Null);
    assert_eq!(status.steps[0].state, tickmark::StepState::Done);
    assert_eq!(status.steps[0].output, None);
    assert_eq!(
        db.record_of("shop", "o-3").await.state,
        tickmark::EventState::Cancelled
    );
    let page = event_page(&engine_without_keys(&db), o1.event.seq).await;
    assert!(page.contains("erased "), "{page}");
    assert!(!page.contains(MARKER), "{page}");
    // An operator cannot re-queue an erased event: its payload is gone.
    let retried = engine
        .event_retry(&RetryRequest {
            event_seq: o3.event.seq,
            from_step: None,
            force: false,
            actor: Actor {
                who: "tester",
                reason: None,
            },
        })
        .await;
    assert!(
        retried.is_err(),
        "an erased event was re-queued: {retried:?}"
    );
    let audit = db.store.audit_list(o1.event.seq).await.unwrap();
    assert!(audit
        .iter()
        .any(|entry| entry.action == "erase" && entry.actor == "tester"));

    // Each erased event redelivered is a duplicate, and nothing runs again.
    for id in ["o-1", "o-3"] {
        let again = engine.accept(order(id, "c-1", MARKER)).await.unwrap();
        assert!(matches!(again, Accepted::Duplicate), "{id}: {again:?}");
    }
    run_until_idle(&engine).await;
    assert_eq!(runs.0.load(Ordering::SeqCst), 2, "an erased event ran");
    assert!(!at_rest(&db).await.contains(MARKER));

    // The other subject's event is untouched.
    let other = engine.event_status("shop", "o-2").await.unwrap().unwrap();
    assert_eq!(other.record.erased_at, None);
    assert_eq!(other.record.event.payload["note"], OTHER);
    assert_eq!(other.steps[0].output, Some(json!({ "echo": OTHER })));

    // Erasing again finds nothing more.
    let again = engine
        .erase_subject(
            &Subject::new("email", MARKER),
            &EraseRequest {
                actor: "tester",
                reason: "again",
                wait_for_running: Duration::ZERO,
                except_event: None,
            },
        )
        .await
        .unwrap();
    assert!(again.erased.is_empty());
}

/// Holds its event running until the test lets it go.
#[derive(Debug, Serialize, Deserialize)]
struct HoldUntilReleased;

#[derive(Default)]
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[typetag::serde(name = "privacy_hold_until_released")]
#[async_trait::async_trait]
impl Step for HoldUntilReleased {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let gate = Arc::clone(ctx.resource::<Arc<Gate>>()?);
        gate.entered.notify_one();
        gate.release.notified().await;
        Ok(json!({ "note": ctx.event().payload["note"] }))
    }
}

async fn a_running_event_finishes_before_it_is_erased(db: TestDb) {
    let gate = Arc::new(Gate::default());
    let handlers = Handlers::new().on(
        "shop",
        "orders/create",
        Handler::new()
            .named_step("hold", HoldUntilReleased)
            .subject("customer", "/customer/id"),
    );
    let engine = engine(&db, handlers)
        .with_privacy(privacy(Some(K1)))
        .with_resource(Arc::clone(&gate));
    engine.accept(order("o-1", "c-1", MARKER)).await.unwrap();
    let seq = db.record_of("shop", "o-1").await.event.seq;
    let worker = tokio::spawn(
        engine
            .worker(quick_worker("privacy").with_lease(Duration::from_secs(30)))
            .unwrap()
            .run_until_idle(),
    );
    gate.entered.notified().await;

    let request = EraseRequest {
        actor: "tester",
        reason: "customers/redact",
        wait_for_running: Duration::ZERO,
        except_event: None,
    };
    let subject = Subject::new("customer", "c-1");
    let first = engine.erase_subject(&subject, &request).await.unwrap();
    assert!(
        first.erased.is_empty(),
        "a running event was erased under its worker"
    );
    assert_eq!(first.still_running, [seq]);

    // It finishes (its mark is not fenced out), then the erasure takes it.
    gate.release.notify_one();
    worker.await.unwrap().expect("worker");
    let record = db.record_of("shop", "o-1").await;
    assert_eq!(record.state, tickmark::EventState::Done);
    let second = engine.erase_subject(&subject, &request).await.unwrap();
    assert_eq!(second.erased, [seq]);
    assert!(second.cancelled.is_empty(), "a done event stays done");
    assert_eq!(
        db.record_of("shop", "o-1").await.state,
        tickmark::EventState::Done
    );
}

async fn the_keys_are_checked_before_anything_is_written(db: TestDb) {
    let runs = Arc::new(Runs::default());
    let sealed = private_engine(&db, Some(K1), &runs);
    sealed.accept(order("o-1", "c-1", MARKER)).await.unwrap();

    // No keys beside sealed rows: refused, nothing written in clear.
    let clear = private_engine(&db, None, &runs);
    let refused = clear.accept(order("o-2", "c-1", MARKER)).await.unwrap_err();
    assert!(refused.to_string().contains("TICKMARK_KEYS"), "{refused}");
    assert!(db.store.event_find("shop", "o-2").await.unwrap().is_none());
    // Another key under the same id: refused at start.
    let impostor = private_engine(&db, Some(&K2.replace("k2", "k1")), &runs);
    let wrong = impostor.check_keys().await.unwrap_err();
    assert!(
        wrong.to_string().contains("key `k1` is not the key"),
        "{wrong}"
    );
    // Without the key its rows were sealed with: refused at start.
    let missing = private_engine(&db, Some(K2), &runs);
    let error = missing.check_keys().await.unwrap_err();
    assert!(error.to_string().contains("k1"), "{error}");
    // Subjects declared, no subject key: refused.
    let no_subject_key =
        engine(&db, handlers()).with_privacy(Privacy::new().with_keys(Keyring::parse(K1).unwrap()));
    let error = no_subject_key.check_keys().await.unwrap_err();
    assert!(
        error.to_string().contains("TICKMARK_SUBJECT_KEY"),
        "{error}"
    );
    assert!(!at_rest(&db).await.contains(MARKER));
}

/// `tickmark keys rotate` as an operator runs it, with these keys.
fn rotate_command(db: &TestDb) -> tokio::process::Command {
    let mut command =
        tokio::process::Command::new(tickmark_tests::cargo_bin("tickmark", "tickmark"));
    command
        .args(["--database-url", &db.url, "keys", "rotate", "--batch", "7"])
        .env("TICKMARK_KEYS", format!("{K2},{K1}"))
        .env_remove("DATABASE_URL")
        .kill_on_drop(true);
    command
}

async fn a_rotation_killed_again_and_again_loses_nothing(db: TestDb) {
    let runs = Arc::new(Runs::default());
    let before = private_engine(&db, Some(K1), &runs);
    const EVENTS: usize = 120;
    for n in 0..EVENTS / 2 {
        before
            .accept(order(&format!("o-{n}"), "c-1", MARKER))
            .await
            .unwrap();
    }
    run_until_idle(&before).await;

    // The new key is deployed (first), and workers run while the rest
    // arrive and rotations are killed part-way, again and again.
    let after = private_engine(&db, Some(&format!("{K2},{K1}")), &runs);
    let shutdown = tickmark::CancellationToken::new();
    let worker = tokio::spawn(
        after
            .worker(quick_worker("privacy"))
            .unwrap()
            .run(shutdown.clone()),
    );
    for kill_after_ms in [40u64, 90, 150, 250] {
        for n in 0..EVENTS / 8 {
            let id = format!("o-{}-{n}", kill_after_ms);
            after.accept(order(&id, "c-1", MARKER)).await.unwrap();
        }
        let mut rotation = rotate_command(&db)
            .spawn()
            .expect("start tickmark keys rotate");
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        let _ = rotation.start_kill();
        let _ = rotation.wait().await;
    }
    tickmark_tests::wait::until("every event done", Duration::from_secs(60), || async {
        after.event_counts().await.is_ok_and(|counts| {
            counts
                .by_state
                .iter()
                .all(|(state, n)| *n == 0 || *state == tickmark::EventState::Done)
        })
    })
    .await;
    shutdown.cancel();
    worker.await.unwrap().expect("worker");

    // A rotation left to finish retires k1.
    let finished = rotate_command(&db)
        .output()
        .await
        .expect("run tickmark keys rotate");
    assert!(
        finished.status.success(),
        "{}",
        String::from_utf8_lossy(&finished.stderr)
    );
    let registered: Vec<String> = db
        .store
        .keys_registered()
        .await
        .unwrap()
        .into_iter()
        .map(|key| key.key_id)
        .collect();
    assert_eq!(registered, ["k2"]);

    // Nothing lost, nothing run twice, nothing left under k1 or in clear:
    // every stored value is sealed with k2...
    let total = EVENTS / 2 + 4 * (EVENTS / 8);
    assert_eq!(runs.0.load(Ordering::SeqCst), total);
    let page = db.store.values_page(0, 1000).await.unwrap();
    assert_eq!(page.len(), total);
    for row in &page {
        let values = std::iter::once(&row.payload_json).chain(row.outputs.iter().map(|(_, o)| o));
        for json in values {
            let value: serde_json::Value = serde_json::from_str(json).unwrap();
            assert_eq!(
                sealed_with(&value),
                Some("k2"),
                "event {}: {json}",
                row.event_seq
            );
        }
    }
    // ...and, at rest, no old ciphertext is left: on PostgreSQL in what a
    // dump reads; on SQLite once `VACUUM` has rewritten the pages the rows
    // moved out of, as docs/privacy.md tells an operator to after a
    // rotation (a page freed by a split keeps its old bytes until then).
    if db.backend() == Backend::Sqlite {
        db.probe.execute("VACUUM").await;
        db.probe.execute("PRAGMA wal_checkpoint(TRUNCATE)").await;
    }
    let stored = at_rest(&db).await;
    assert!(!stored.contains(MARKER));
    assert!(!stored.contains("tickmark:sealed:1:k1:"));
    // An engine with k2 alone reads every payload and output.
    let k2_only = private_engine(&db, Some(K2), &runs);
    k2_only.check_keys().await.expect("k1 is retired");
    let events = k2_only
        .events(&tickmark::EventFilter {
            limit: 1000,
            ..tickmark::EventFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(events.len(), total);
    for record in events {
        assert_eq!(record.event.payload["note"], MARKER);
        let status = k2_only
            .event_status("shop", &record.event.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.steps[0].output, Some(json!({ "echo": MARKER })));
    }
}
