//! OpenTelemetry traces (docs/observability.md), as a collector receives
//! them: spans exported over real HTTP to a loopback OTLP collector that
//! decodes them with the official protobuf definitions
//! (`tickmark_tests::otlp_collector`).
//!
//! One trace per event: its accept is the root, and every step attempt is
//! a span under it, across a worker process killed in the middle of a step
//! and the takeover by another, and across a retry days later. A duplicate
//! delivery links to the event's trace; an outbound call carries the step's
//! `traceparent`; nothing of the payload reaches a span.

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::dashboard::Dashboard;
use tickmark::testing::TestEngine;
use tickmark::{
    Backend, Handler, Handlers, NewEvent, RetryPolicy, Step, StepContext, StepError, StepResult,
};
use tickmark_steps::outbox::{self, EnqueueWebhook, OutboxEndpoints};
use tickmark_steps::{HttpCall, ValueFrom};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::{oneshot, Outgoing};
use tickmark_tests::otlp_collector::{trace_this_process, CollectedSpan, OtlpCollector};
use tickmark_tests::{wait, TestDb};
use tokio::process::Command;

use crate::crash::credit_render_notify;
use crate::receiver_support::{all_sources, now, record_everything, Harness, Kind, Transport};

const WORKER: &str = env!("CARGO_BIN_EXE_tickmark-test-worker");

/// In every payload: it must reach no span.
const MARKER: &str = "marker-5c1e@example.com";

fn of_event<'a>(spans: &'a [CollectedSpan], name: &str, id: &str) -> Vec<&'a CollectedSpan> {
    spans
        .iter()
        .filter(|span| span.name == name && span.attr("event_id") == Some(id))
        .collect()
}

/// The step attempts of event `id`: (step, attempt, outcome, service).
fn attempts(spans: &[CollectedSpan], id: &str) -> Vec<(String, String, String, String)> {
    let mut attempts: Vec<_> = of_event(spans, "step", id)
        .into_iter()
        .map(|span| {
            (
                span.attr("step").unwrap_or_default().to_owned(),
                span.attr("attempt").unwrap_or_default().to_owned(),
                span.attr("outcome").unwrap_or_default().to_owned(),
                span.service.clone(),
            )
        })
        .collect();
    attempts.sort();
    attempts
}

fn no_payload_in(spans: &[CollectedSpan]) {
    for span in spans {
        assert!(
            span.texts().all(|text| !text.contains(MARKER)),
            "the payload reached a span: {span:#?}"
        );
    }
}

/// A worker process is SIGKILLed in the middle of step 2 of 3, and a worker
/// in this process takes the event over: the collector receives one trace,
/// rooted at the accept, whose step attempts (from both processes) are each
/// a child of the accept, the takeover's saying so. The attempt the kill cut
/// short never ended, so its span never left the process; the next attempt
/// of the step is numbered 2. A duplicate delivery is its own trace, linked
/// to the event's.
async fn one_trace_across_a_kill_and_a_takeover(backend: Backend) {
    let collector = OtlpCollector::start().await;
    let Some(traces) = trace_this_process(&collector) else {
        return;
    };
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    // Step 2 of 3 pauses on its first attempt: the kill finds it there.
    let engine = engine(&db, credit_render_notify());
    let event = NewEvent::with_id(
        "shop",
        "evt_traced",
        "order.paid",
        json!({ "email": MARKER }),
    );
    assert!(engine.accept(event.clone()).await.unwrap().is_new());
    assert!(!engine.accept(event).await.unwrap().is_new());

    let mut victim = Command::new(WORKER)
        .args([
            "--database-url",
            &db.url,
            "--name",
            "victim",
            "--lease-ms",
            "2000",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
        .env("OTEL_SERVICE_NAME", "victim")
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the test worker");
    wait::until(
        "the victim is inside step 2",
        Duration::from_secs(60),
        || async { db.probe.runs("evt_traced", "render").await == 1 },
    )
    .await;
    collector
        .wait_for("of the victim's step 1", Duration::from_secs(30), |span| {
            span.service == "victim" && span.name == "step" && span.attr("step") == Some("credit")
        })
        .await;
    victim.start_kill().expect("SIGKILL");
    victim.wait().await.unwrap();

    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((stats.takeovers, stats.events_done), (1, 1));
    traces.flush().expect("the collector took every span");
    let spans = collector.spans();

    let accepts = of_event(&spans, "accept", "evt_traced");
    let [first, duplicate] = [Some("new"), Some("duplicate")].map(|verdict| {
        *accepts
            .iter()
            .find(|span| span.attr("verdict") == verdict)
            .unwrap_or_else(|| panic!("an accept span with verdict {verdict:?}: {accepts:#?}"))
    });
    assert_eq!(first.parent_span_id, None, "the accept is the trace's root");
    let trace = &first.trace_id;
    assert_ne!(
        &duplicate.trace_id, trace,
        "a duplicate is a trace of its own…"
    );
    assert_eq!(
        duplicate.links,
        [(trace.clone(), first.span_id.clone())],
        "…linked to the event's"
    );

    let steps = of_event(&spans, "step", "evt_traced");
    for step in &steps {
        assert_eq!(
            &step.trace_id, trace,
            "every attempt is in the event's trace: {step:#?}"
        );
        assert_eq!(
            step.parent_span_id.as_ref(),
            Some(&first.span_id),
            "every attempt is a child of the accept: {step:#?}"
        );
        let name = step.attr("step").unwrap();
        assert_eq!(
            step.attr("idempotency_key"),
            Some(format!("shop:evt_traced:{name}").as_str())
        );
    }
    let s = |text: &str| text.to_owned();
    assert_eq!(
        attempts(&spans, "evt_traced"),
        [
            (s("credit"), s("1"), s("done"), s("victim")),
            (s("notify"), s("1"), s("done"), s("tickmark-tests")),
            (s("render"), s("2"), s("done"), s("tickmark-tests")),
        ]
    );
    let takeover = steps
        .iter()
        .find(|step| step.attr("step") == Some("render"))
        .unwrap();
    assert_eq!(takeover.attr("took_over"), Some("true"));
    // The victim held it in a batch: its crash is counted, not charged
    // (docs/guarantees.md, exact blame).
    assert_eq!(
        (takeover.attr("interrupted"), takeover.attr("charged")),
        (Some("1"), Some("1"))
    );
    no_payload_in(&spans);
    assert_eq!(traces.counts().dropped(), 0);
}

/// Fails its first attempt, retryably.
#[derive(Debug, Serialize, Deserialize)]
struct FailOnce;

#[typetag::serde(name = "traces_fail_once")]
#[async_trait::async_trait]
impl Step for FailOnce {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        if ctx.attempt() == 1 {
            return Err(StepError::retryable("the supplier is down"));
        }
        Ok(json!({ "attempt": ctx.attempt() }))
    }
}

/// A retry two days later (the test kit's clock) joins the event's trace,
/// and the HTTP call of the step after it sends that step's `traceparent`.
#[tokio::test]
async fn a_retry_days_later_joins_the_same_trace_and_calls_carry_it() {
    let (server, seen) = traceparents_received().await;
    let collector = OtlpCollector::start().await;
    let Some(traces) = trace_this_process(&collector) else {
        return;
    };
    let kit = TestEngine::sqlite(
        Handlers::new().on(
            "shop",
            "order.paid",
            Handler::new()
                .retry(RetryPolicy {
                    max_attempts: 3,
                    initial_delay: Duration::from_secs(2 * 24 * 3600),
                    max_delay: Duration::from_secs(2 * 24 * 3600),
                    multiplier: 1.0,
                    jitter: 0.0,
                })
                .named_step("reserve", FailOnce)
                .named_step("order", HttpCall::post(format!("{server}/orders"))),
        ),
    )
    .await
    .unwrap();
    kit.deliver(NewEvent::with_id(
        "shop",
        "evt_later",
        "order.paid",
        json!({ "email": MARKER }),
    ))
    .await
    .unwrap();
    kit.run_until_idle_within(Duration::from_secs(20))
        .await
        .unwrap();
    kit.advance(Duration::from_secs(3 * 24 * 3600)).unwrap();
    kit.run_until_idle_within(Duration::from_secs(20))
        .await
        .unwrap();
    kit.assert_done("shop", "evt_later").await.unwrap();
    traces.flush().expect("the collector took every span");
    let spans = collector.spans();

    let accept = of_event(&spans, "accept", "evt_later")[0];
    let s = |text: &str| text.to_owned();
    let here = s("tickmark-tests");
    assert_eq!(
        attempts(&spans, "evt_later"),
        [
            (s("order"), s("1"), s("done"), here.clone()),
            (s("reserve"), s("1"), s("retry_scheduled"), here.clone()),
            (s("reserve"), s("2"), s("done"), here),
        ]
    );
    let steps = of_event(&spans, "step", "evt_later");
    for step in &steps {
        assert_eq!(step.trace_id, accept.trace_id, "{step:#?}");
        assert_eq!(
            step.parent_span_id.as_ref(),
            Some(&accept.span_id),
            "{step:#?}"
        );
    }
    let order = steps
        .iter()
        .find(|step| step.attr("step") == Some("order"))
        .unwrap();
    let sent = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(
        sent,
        [format!("00-{}-{}-01", accept.trace_id, order.span_id)],
        "the call carries its step's span as parent"
    );
    no_payload_in(&spans);
}

/// A service that answers every POST and keeps the `traceparent` of each:
/// its base URL, and what it received.
async fn traceparents_received() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = Arc::clone(&seen);
    let app = Router::new().fallback(post(move |headers: HeaderMap| async move {
        if let Some(parent) = headers.get("traceparent") {
            let parent = parent.to_str().unwrap_or_default().to_owned();
            kept.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(parent);
        }
        "{}"
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

/// The outbox: the webhook an event's step enqueues is an event of its own,
/// accepted inside that step's span, so its delivery continues the origin's
/// trace, and the partner receives the delivery attempt as parent.
#[tokio::test]
async fn an_outbox_delivery_continues_the_origins_trace_and_sends_it() {
    let (partner, seen) = traceparents_received().await;
    let collector = OtlpCollector::start().await;
    let Some(traces) = trace_this_process(&collector) else {
        return;
    };
    let endpoints = OutboxEndpoints::new()
        .endpoint(
            "partner",
            &format!("{partner}/hooks/partner"),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        .unwrap();
    let kit = TestEngine::sqlite(
        Handlers::new()
            .on(
                "shop",
                "order.paid",
                Handler::new().named_step(
                    "notify",
                    EnqueueWebhook::new(
                        "partner",
                        "order.confirmed",
                        ValueFrom::event_at("/order"),
                    ),
                ),
            )
            .on(outbox::SOURCE, outbox::KIND, outbox::handler()),
    )
    .await
    .unwrap()
    .with_resource(endpoints);
    kit.deliver(NewEvent::with_id(
        "shop",
        "evt_origin",
        "order.paid",
        json!({ "order": { "id": "o_1" }, "email": MARKER }),
    ))
    .await
    .unwrap();
    kit.run_until_idle_within(Duration::from_secs(20))
        .await
        .unwrap();
    traces.flush().expect("the collector took every span");
    let spans = collector.spans();

    let origin = of_event(&spans, "accept", "evt_origin")[0];
    let outbox_id = tickmark::idempotency_key("shop", "evt_origin", "notify");
    let notify = of_event(&spans, "step", "evt_origin")[0];
    let queued = of_event(&spans, "accept", &outbox_id)[0];
    assert_eq!(queued.trace_id, origin.trace_id, "{queued:#?}");
    assert_eq!(queued.parent_span_id.as_ref(), Some(&notify.span_id));
    let delivery = of_event(&spans, "step", &outbox_id)[0];
    assert_eq!(
        (&delivery.trace_id, delivery.parent_span_id.as_ref()),
        (&origin.trace_id, Some(&queued.span_id))
    );
    let sent = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(
        sent,
        [format!("00-{}-{}-01", origin.trace_id, delivery.span_id)]
    );
    no_payload_in(&spans);
}

/// A delivery that carries a `traceparent` (a service of the team's own,
/// through a generic source) starts its event's trace under that parent:
/// the delivery's span is its child, the accept the delivery's, each step
/// attempt the accept's. The delivery's span names the verdict. A
/// malformed `traceparent` names no parent: that delivery is a root.
async fn a_senders_traceparent_parents_the_events_trace(transport: Transport) {
    const SENDER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SENDER_SPAN: &str = "00f067aa0ba902b7";
    let collector = OtlpCollector::start().await;
    let Some(traces) = trace_this_process(&collector) else {
        return;
    };
    let Some(harness) =
        Harness::new(Backend::Sqlite, transport, record_everything(), all_sources).await
    else {
        return;
    };
    let kind = Kind::GenericHmac;
    let traced = |id: &str, traceparent: &str| {
        kind.delivery(kind.secret(), id, now())
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=opaque")
    };
    let parent = format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01");
    for delivery in [
        traced("evt_child", &parent),
        traced("evt_child", &parent),
        traced("evt_orphan", &parent.to_uppercase()),
    ] {
        assert_eq!(harness.send(&delivery).await.status, 200);
    }
    assert_eq!(harness.run_worker().await.events_done, 2);
    traces.flush().expect("the collector took every span");
    let spans = collector.spans();

    let deliveries = of_event(&spans, "webhook", "evt_child");
    let verdicts: Vec<_> = deliveries.iter().map(|span| span.attr("verdict")).collect();
    assert_eq!(verdicts, [Some("new"), Some("duplicate")]);
    for delivery in &deliveries {
        assert_eq!(delivery.trace_id, SENDER_TRACE);
        assert_eq!(delivery.parent_span_id.as_deref(), Some(SENDER_SPAN));
    }
    let accept = of_event(&spans, "accept", "evt_child")
        .into_iter()
        .find(|span| span.attr("verdict") == Some("new"))
        .expect("the first delivery's accept");
    assert_eq!(accept.trace_id, SENDER_TRACE);
    assert_eq!(accept.parent_span_id, Some(deliveries[0].span_id.clone()));
    let step = of_event(&spans, "step", "evt_child")[0];
    assert_eq!(
        (&step.trace_id, step.parent_span_id.as_ref()),
        (&accept.trace_id, Some(&accept.span_id))
    );
    let orphan = of_event(&spans, "webhook", "evt_orphan")[0];
    assert_eq!(orphan.parent_span_id, None, "{orphan:#?}");
    assert_ne!(orphan.trace_id, SENDER_TRACE);

    // The dashboard's event page names the trace to look up.
    let seq = harness.db.record_of("generic", "evt_child").await.event.seq;
    let dashboard = Dashboard::new(harness.engine.clone())
        .token(DASHBOARD_TOKEN)
        .router();
    let reply = oneshot(
        &dashboard,
        &Outgoing::get(format!("/events/{seq}"))
            .header("authorization", format!("Bearer {DASHBOARD_TOKEN}")),
    )
    .await;
    assert_eq!(reply.status, 200);
    let page = String::from_utf8(reply.body.to_vec()).unwrap();
    assert!(
        page.contains(&format!("<th>trace id</th><td>{SENDER_TRACE}</td>")),
        "{page}"
    );
}

const DASHBOARD_TOKEN: &str = "a-dashboard-token-of-32-bytes-or-more";

#[tokio::test]
async fn a_senders_traceparent_parents_the_events_trace_in_process() {
    a_senders_traceparent_parents_the_events_trace(Transport::InProcess).await;
}

#[tokio::test]
async fn a_senders_traceparent_parents_the_events_trace_over_a_socket() {
    a_senders_traceparent_parents_the_events_trace(Transport::Socket).await;
}

tickmark_tests::per_backend!(backend => [one_trace_across_a_kill_and_a_takeover]);
