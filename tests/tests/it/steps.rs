//! The ready-made steps of `tickmark-steps` in a real engine, on SQLite and
//! PostgreSQL, against a loopback HTTP stand-in that answers from a script
//! and records every request (time, path, headers, body).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use serde::{Deserialize, Serialize};
use tickmark::receiver::providers::{Delivery, Provider, StandardWebhooks, Verdict};
use tickmark::{
    Engine, EventState, Handler, Handlers, NewEvent, RetryPolicy, Step, StepContext, StepError,
    StepResult, StepState,
};
use tickmark_steps::outbox::{self, DeliverWebhook, EnqueueWebhook, OutboxEndpoints};
use tickmark_steps::{HttpCall, HttpClient, OutputDir, ValueFrom, WriteFile};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::LoopbackServer;
use tickmark_tests::{wait, TestDb};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the stand-in received.
#[derive(Debug, Clone)]
struct Call {
    at: Instant,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Call {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// A scripted answer: status, headers, body.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// The HTTP stand-in: the n-th request gets the n-th answer (the last one
/// repeats).
struct StandIn {
    server: LoopbackServer,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl StandIn {
    async fn start(script: Vec<Answer>) -> StandIn {
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let recorded = Arc::clone(&calls);
        let script = Arc::new(script);
        let router = Router::new().fallback(move |request: axum::extract::Request| {
            let calls = Arc::clone(&recorded);
            let script = Arc::clone(&script);
            async move {
                let at = Instant::now();
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20)
                    .await
                    .expect("body")
                    .to_vec();
                let index = {
                    let mut calls = calls.lock().expect("lock");
                    calls.push(Call {
                        at,
                        path: parts.uri.path().to_owned(),
                        headers: parts.headers,
                        body,
                    });
                    calls.len() - 1
                };
                let (status, headers, body) = script[index.min(script.len() - 1)].clone();
                let mut response =
                    (StatusCode::from_u16(status).expect("status"), body).into_response();
                for (name, value) in headers {
                    response
                        .headers_mut()
                        .insert(name, value.parse().expect("header value"));
                }
                response
            }
        });
        StandIn {
            server: LoopbackServer::start(router).await,
            calls,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }

    fn calls_to(&self, path: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.path == path)
            .collect()
    }
}

fn distinct(values: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut values: Vec<String> = values.into_iter().collect();
    values.sort();
    values.dedup();
    values
}

fn json_answer(status: u16, body: &'static str) -> Answer {
    (status, vec![("content-type", "application/json")], body)
}

/// Retries that come quickly: 20 ms, then 50 ms, no jitter.
fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        jitter: 0.0,
        ..RetryPolicy::attempts(max_attempts)
            .delays(Duration::from_millis(20), Duration::from_millis(50))
    }
}

fn order_paid(id: &str) -> NewEvent {
    NewEvent::with_id(
        "shop",
        id,
        "order.paid",
        serde_json::json!({"order": {"id": "o_1", "total": 4200}}),
    )
}

/// An engine on `db` with `handler` for shop/order.paid, the probe and a
/// shared HTTP client.
fn shop_engine(db: &TestDb, handler: Handler) -> Engine {
    engine(db, Handlers::new().on("shop", "order.paid", handler))
        .with_resource(HttpClient::default())
}

/// Runs a ready-made step, then fails its first attempt: a step that ran
/// (had its effect) but was not marked, as after a crash, so it runs again.
#[derive(Debug, Serialize, Deserialize)]
struct ThenFailOnce {
    inner: Box<dyn Step>,
}

#[typetag::serde(name = "test_then_fail_once")]
#[async_trait::async_trait]
impl Step for ThenFailOnce {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let output = self.inner.run(ctx).await?;
        if ctx.attempt() == 1 {
            return Err(StepError::retryable(format!(
                "planned failure after the step ran; it output {output}"
            )));
        }
        Ok(output)
    }
}

/// Runs a ready-made step; on the first attempt, then holds on until the
/// step is cancelled (its lease was taken over): a worker that did the work
/// but never got to mark it.
#[derive(Debug, Serialize, Deserialize)]
struct ThenHangOnce {
    inner: Box<dyn Step>,
}

#[typetag::serde(name = "test_then_hang_once")]
#[async_trait::async_trait]
impl Step for ThenHangOnce {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let output = self.inner.run(ctx).await?;
        if ctx.attempt() == 1 {
            ctx.cancellation().cancelled().await;
            return Err(StepError::retryable("cancelled after the step ran"));
        }
        Ok(output)
    }
}

// ---------------------------------------------------------------- HttpCall

/// A 503 is retried on the durable schedule; every attempt sends the same
/// Idempotency-Key; the 2xx answer is the step's output, and a later step
/// sends a part of it (a JSON pointer into the earlier output).
async fn http_call_retries_a_503_and_sends_one_key_on_every_attempt(db: TestDb) {
    let stand_in = StandIn::start(vec![
        (503, vec![], "busy"),
        (503, vec![], "still busy"),
        json_answer(200, r#"{"charge": {"id": "ch_1", "amount": 4200}}"#),
    ])
    .await;
    let engine = shop_engine(
        &db,
        Handler::new()
            .named_step(
                "charge",
                HttpCall::post(stand_in.url("/charges")).body(ValueFrom::event_at("/order")),
            )
            .named_step(
                "note",
                HttpCall::put(stand_in.url("/notes"))
                    .body(ValueFrom::output("charge", "/body/charge")),
            )
            .retry(quick_retries(5)),
    );
    engine.accept(order_paid("evt_503")).await.unwrap();
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.steps_failed, stats.events_done), (2, 1));

    let charges = stand_in.calls_to("/charges");
    assert_eq!(charges.len(), 3, "503, 503, 200");
    assert_eq!(
        distinct(
            charges
                .iter()
                .map(|c| c.header("idempotency-key").to_owned())
        ),
        [tickmark::idempotency_key("shop", "evt_503", "charge")]
    );
    for call in &charges {
        assert_eq!(call.json(), serde_json::json!({"id": "o_1", "total": 4200}));
    }
    let notes = stand_in.calls_to("/notes");
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].header("idempotency-key"), "shop:evt_503:note");
    assert_eq!(
        notes[0].json(),
        serde_json::json!({"id": "ch_1", "amount": 4200})
    );

    let record = db
        .store
        .event_find("shop", "evt_503")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Done);
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 3));
    let output = steps[0].output.as_ref().unwrap();
    assert_eq!(output["status"], 200);
    assert_eq!(output["body"]["charge"]["id"], "ch_1");
    assert_eq!(output["headers"]["content-type"], "application/json");
}

/// A 404 will not get better: dead-lettered after one call, with the status
/// in the error.
async fn http_call_dead_letters_a_404_at_once(db: TestDb) {
    let stand_in = StandIn::start(vec![(404, vec![], "no such customer")]).await;
    let engine = shop_engine(
        &db,
        Handler::new()
            .named_step("lookup", HttpCall::get(stand_in.url("/customers/c_1")))
            .retry(quick_retries(5)),
    );
    engine.accept(order_paid("evt_404")).await.unwrap();
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.steps_failed, stats.events_dead), (1, 1));
    assert_eq!(stand_in.calls().len(), 1);
    let record = db
        .store
        .event_find("shop", "evt_404")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Dead);
    let error = record.last_error.unwrap();
    assert!(
        error.contains("terminal") && error.contains("404") && error.contains("no such customer"),
        "{error}"
    );
}

/// A 429 with `Retry-After: 1` is retried no sooner than a second later,
/// although the handler's own schedule would retry after 20 ms.
async fn http_call_waits_at_least_retry_after_on_429(db: TestDb) {
    let stand_in = StandIn::start(vec![
        (429, vec![("retry-after", "1")], "slow down"),
        json_answer(200, "{}"),
    ])
    .await;
    let engine = shop_engine(
        &db,
        Handler::new()
            .named_step("charge", HttpCall::post(stand_in.url("/charges")))
            .retry(quick_retries(5)),
    );
    engine.accept(order_paid("evt_429")).await.unwrap();
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    let calls = stand_in.calls();
    assert_eq!(calls.len(), 2);
    let gap = calls[1].at - calls[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert_eq!(
        calls[0].header("idempotency-key"),
        calls[1].header("idempotency-key")
    );
    let record = db
        .store
        .event_find("shop", "evt_429")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Done);
}

// --------------------------------------------------------------- WriteFile

/// A re-run of WriteFile (it wrote, then its attempt failed) replaces the
/// file: one file, the right content, no temporary files, a name that is
/// the escaped event id, in a directory named after the source.
async fn write_file_rerun_overwrites_and_leaves_no_temporary_files(db: TestDb) {
    let out = tempfile::tempdir().unwrap();
    let engine = shop_engine(
        &db,
        Handler::new()
            .named_step(
                "write",
                ThenFailOnce {
                    inner: Box::new(
                        WriteFile::new(ValueFrom::event_at("/order"))
                            .subdir("orders")
                            .extension("json"),
                    ),
                },
            )
            .retry(quick_retries(3)),
    )
    .with_resource(OutputDir::new(out.path()));
    let id = "inv/2024/../7 ü";
    engine.accept(order_paid(id)).await.unwrap();
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.steps_failed, stats.events_done), (1, 1));

    let dir = out.path().join("orders").join("shop");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["inv%2F2024%2F..%2F7%20%C3%BC.json"]);
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        1,
        "nothing but orders/ at the top"
    );
    assert_eq!(
        std::fs::read_dir(out.path().join("orders"))
            .unwrap()
            .count(),
        1,
        "nothing but orders/shop/ under it"
    );
    let path = dir.join(&names[0]);
    let content = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&content).unwrap(),
        serde_json::json!({"id": "o_1", "total": 4200})
    );

    let record = db.store.event_find("shop", id).await.unwrap().unwrap();
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 2));
    let output = steps[0].output.as_ref().unwrap();
    assert_eq!(output["path"], path.display().to_string());
    assert_eq!(output["bytes"], content.len());
}

/// A worker writes the file, then loses its lease before marking (the
/// lease is expired under it); the worker that takes the event over writes
/// the same file again: one file, no temporary files.
async fn write_file_taken_over_mid_step_is_rewritten_in_place(db: TestDb) {
    let out = tempfile::tempdir().unwrap();
    let engine = shop_engine(
        &db,
        Handler::new().named_step(
            "write",
            ThenHangOnce {
                inner: Box::new(WriteFile::new(ValueFrom::template(
                    "{source} {kind} {event_id}\n",
                ))),
            },
        ),
    )
    .with_resource(OutputDir::new(out.path()));
    engine.accept(order_paid("evt_taken")).await.unwrap();
    let path = out.path().join("shop").join("evt_taken");

    let zombie = engine
        .worker(quick_worker("zombie"))
        .expect("valid worker settings");
    let mut zombie_stats = zombie.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(zombie.run(shutdown.clone()));
    wait::until("the first write", Duration::from_secs(20), || async {
        path.exists()
    })
    .await;
    std::fs::write(&path, "scribbled over after the first write").unwrap();
    let seq = db
        .store
        .event_find("shop", "evt_taken")
        .await
        .unwrap()
        .unwrap()
        .event
        .seq;
    db.probe.expire_lease(seq).await;

    let stats = engine
        .worker(quick_worker("heir"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.takeovers, stats.events_done), (1, 1));
    tokio::time::timeout(
        Duration::from_secs(20),
        zombie_stats.wait_for(|s| s.in_flight == 0),
    )
    .await
    .expect("the zombie's step stops")
    .unwrap();
    shutdown.cancel();
    running.await.unwrap().unwrap();

    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "shop order.paid evt_taken\n"
    );
    let names: Vec<String> = std::fs::read_dir(out.path().join("shop"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["evt_taken"]);
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 2));
}

/// Dedup keys are unique per source only: two sources' events with the same
/// id write two files, each its own content, neither over the other.
async fn write_file_keeps_two_sources_with_one_id_apart(db: TestDb) {
    let out = tempfile::tempdir().unwrap();
    let write =
        || Handler::new().step(WriteFile::new(ValueFrom::template("{source} {event_id}\n")));
    let engine = engine(
        &db,
        Handlers::new()
            .on("shop", "order.paid", write())
            .on("billing", "order.paid", write()),
    )
    .with_resource(OutputDir::new(out.path()));
    for source in ["shop", "billing"] {
        let event = NewEvent::with_id(source, "evt_1", "order.paid", serde_json::json!({}));
        engine.accept(event).await.unwrap();
    }
    let stats = engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.events_done, 2);
    for source in ["shop", "billing"] {
        assert_eq!(
            std::fs::read_to_string(out.path().join(source).join("evt_1")).unwrap(),
            format!("{source} evt_1\n")
        );
    }
}

// ------------------------------------------------------------------ Outbox

fn endpoints(stand_in: &StandIn) -> OutboxEndpoints {
    OutboxEndpoints::new()
        .endpoint("partner", &stand_in.url("/hooks/partner"), SECRET)
        .unwrap()
}

/// Verify a delivery with the receiver's own Standard Webhooks provider.
fn verify(call: &Call) -> tickmark::receiver::providers::VerifiedEvent {
    let provider = StandardWebhooks::new([SECRET]).unwrap();
    let verdict = provider
        .verify(&Delivery {
            headers: &call.headers,
            body: &call.body,
            public_url: "",
            now: chrono::Utc::now(),
        })
        .unwrap_or_else(|rejection| panic!("delivery does not verify: {rejection:?}"));
    match verdict {
        Verdict::Event(event) => event,
        other => panic!("expected an event, got {other:?}"),
    }
}

async fn outbox_events(db: &TestDb) -> i64 {
    db.probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE source = 'outbox'")
        .await
}

/// The enqueue step runs twice (it enqueued, then its attempt failed): one
/// outbox event. Its delivery meets a 500, is retried by the engine, and is
/// delivered once, signed so that the receiver's own provider verifies it.
async fn outbox_enqueues_once_and_delivers_once_after_a_500(db: TestDb) {
    let stand_in = StandIn::start(vec![(500, vec![], "oops"), (204, vec![], "")]).await;
    let handlers = Handlers::new()
        .on(
            "shop",
            "order.paid",
            Handler::new()
                .named_step(
                    "notify",
                    ThenFailOnce {
                        inner: Box::new(EnqueueWebhook::new(
                            "partner",
                            "order.confirmed",
                            ValueFrom::event_at("/order"),
                        )),
                    },
                )
                .retry(quick_retries(3)),
        )
        .on(
            outbox::SOURCE,
            outbox::KIND,
            // outbox::handler()'s policy, with delays short enough for a test.
            Handler::new()
                .step(DeliverWebhook::default())
                .retry(quick_retries(5)),
        );
    let engine = engine(&db, handlers).with_resource(endpoints(&stand_in));
    engine.accept(order_paid("evt_outbox")).await.unwrap();
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();

    let outbox_id = tickmark::idempotency_key("shop", "evt_outbox", "notify");
    // The enqueue step ran twice; the second time it was a duplicate.
    let origin = db
        .store
        .event_find("shop", "evt_outbox")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(origin.state, EventState::Done);
    let steps = db.store.step_status(origin.event.seq).await.unwrap();
    assert_eq!(steps[0].attempts, 2);
    assert_eq!(
        steps[0].output.as_ref().unwrap(),
        &serde_json::json!({"outbox_id": outbox_id, "outcome": "duplicate"})
    );
    assert_eq!(outbox_events(&db).await, 1, "one outbox event, not two");

    // Delivered: a 500, then a 2xx; the same webhook-id both times.
    let calls = stand_in.calls_to("/hooks/partner");
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert_eq!(call.header("webhook-id"), outbox_id);
        let verified = verify(call);
        assert_eq!(verified.id.as_deref(), Some(outbox_id.as_str()));
        assert_eq!(verified.kind, "order.confirmed");
        assert_eq!(
            verified.payload["data"],
            serde_json::json!({"id": "o_1", "total": 4200})
        );
    }
    assert_eq!(
        calls[0].body, calls[1].body,
        "the same body on every attempt"
    );

    let delivery = db
        .store
        .event_find(outbox::SOURCE, &outbox_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(delivery.state, EventState::Done);
    let steps = db.store.step_status(delivery.event.seq).await.unwrap();
    assert_eq!((steps[0].state, steps[0].attempts), (StepState::Done, 2));
    assert_eq!(steps[0].output.as_ref().unwrap()["status"], 204);
}

/// A 400 from the endpoint dead-letters the outbox event at once, visible as
/// `dead` in tickmark_events under source `outbox`; the origin event is done.
async fn outbox_dead_letters_a_delivery_refused_with_400(db: TestDb) {
    let stand_in = StandIn::start(vec![(400, vec![], "unknown type")]).await;
    let handlers = Handlers::new()
        .on(
            "shop",
            "order.paid",
            Handler::new().step(EnqueueWebhook::new(
                "partner",
                "order.confirmed",
                ValueFrom::event(),
            )),
        )
        .on(outbox::SOURCE, outbox::KIND, outbox::handler());
    let engine = engine(&db, handlers)
        .with_resource(endpoints(&stand_in))
        .with_resource(HttpClient::default());
    engine.accept(order_paid("evt_refused")).await.unwrap();
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();

    assert_eq!(stand_in.calls().len(), 1);
    verify(&stand_in.calls()[0]);
    let origin = db
        .store
        .event_find("shop", "evt_refused")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(origin.state, EventState::Done);
    assert_eq!(outbox_events(&db).await, 1);
    let state = db
        .probe
        .text("SELECT state FROM tickmark_events WHERE source = 'outbox'")
        .await;
    assert_eq!(state.as_deref(), Some("dead"));
    let outbox_id = tickmark::idempotency_key("shop", "evt_refused", "tickmark.enqueue_webhook");
    let delivery = db
        .store
        .event_find(outbox::SOURCE, &outbox_id)
        .await
        .unwrap()
        .unwrap();
    let error = delivery.last_error.unwrap();
    assert!(
        error.contains("endpoint `partner`") && error.contains("400"),
        "{error}"
    );
}

/// A ready-made step whose value comes from an earlier step's output names
/// it in `reads()`: `Engine::new` refuses a handler in which that step comes
/// later or does not exist, before any event runs.
async fn a_value_from_a_step_not_before_it_is_refused_by_engine_new(db: TestDb) {
    let refusal = |handler: Handler| {
        Engine::new(
            db.store.clone(),
            Handlers::new().on("shop", "order.paid", handler),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let later = refusal(
        Handler::new()
            .named_step(
                "note",
                HttpCall::put("http://h/notes").body(ValueFrom::output("charge", "/body")),
            )
            .named_step("charge", HttpCall::post("http://h/charges")),
    );
    assert!(
        later.contains("step `note` of (shop, order.paid) reads the output of step `charge`"),
        "{later}"
    );
    let typo = refusal(
        Handler::new()
            .named_step("render", HttpCall::get("http://h/render"))
            .step(WriteFile::new(ValueFrom::output("rendr", "/body"))),
    );
    assert!(
        typo.contains("named `rendr`; the steps before it: [render]"),
        "{typo}"
    );
    let outbox = refusal(Handler::new().step(EnqueueWebhook::new(
        "customer",
        "order.reserved",
        ValueFrom::output("reserve", "/body"),
    )));
    assert!(outbox.contains("named `reserve`"), "{outbox}");
}

// Every case, once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(fresh_db => [
    http_call_retries_a_503_and_sends_one_key_on_every_attempt,
    http_call_dead_letters_a_404_at_once,
    http_call_waits_at_least_retry_after_on_429,
    write_file_rerun_overwrites_and_leaves_no_temporary_files,
    write_file_taken_over_mid_step_is_rewritten_in_place,
    write_file_keeps_two_sources_with_one_id_apart,
    outbox_enqueues_once_and_delivers_once_after_a_500,
    outbox_dead_letters_a_delivery_refused_with_400,
    a_value_from_a_step_not_before_it_is_refused_by_engine_new,
]);
