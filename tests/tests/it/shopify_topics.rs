//! Shopify sends one byte-identical body under several topics
//! (`orders/create` and `orders/paid` of an order paid at checkout,
//! `products/create` and `products/update` on publish), and signs neither
//! the topic nor the ids. Over a real socket, on SQLite and PostgreSQL,
//! with handlers for `orders/create` and `orders/paid` only (no `*`):
//!
//! - one body under two handled topics is two events, each run once; the
//!   same body re-sent under either topic with fresh ids runs nothing more:
//!   at most once per handled topic;
//! - the same body under a topic no handler takes records nothing; a body
//!   first seen under such a topic still runs once under a handled one;
//! - deliveries with one `X-Shopify-Event-Id` and topic (a retry, a second
//!   subscription's copy with another API version's body) are one event;
//!   another topic of the same event id is its own event.
//!
//! docs/receiver.md, "Byte-identical bodies" and "Replays".

use crate::receiver_support::{all_sources, assert_answer, b64, hmac256, Harness, Kind, Transport};
use tickmark::{Backend, Handler, Handlers};
use tickmark_tests::http_client::Outgoing;
use tickmark_tests::test_steps::Record;

/// Handlers for two topics of the `shopify` source, and nothing else.
fn two_topics() -> Handlers {
    ["orders/create", "orders/paid"]
        .into_iter()
        .fold(Handlers::new(), |handlers, topic| {
            handlers.on(
                Kind::Shopify.source(),
                topic,
                Handler::new().named_step("first", Record::default()),
            )
        })
}

async fn harness(backend: Backend) -> Option<Harness> {
    Harness::new(backend, Transport::Socket, two_topics(), all_sources).await
}

/// An order paid at checkout: the body both topics carry.
fn order_body(id: u64) -> String {
    serde_json::json!({"id": id, "financial_status": "paid", "total_price": "11.00"}).to_string()
}

/// `body`, signed, under `topic` with `webhook_id` (and `event_id`).
fn delivery(body: &str, topic: &str, webhook_id: &str, event_id: Option<&str>) -> Outgoing {
    let signature = b64(&hmac256(Kind::Shopify.secret().as_bytes(), body.as_bytes()));
    let request = Outgoing::post("/hooks/shopify", body.to_owned())
        .header("content-type", "application/json")
        .header("x-shopify-hmac-sha256", signature)
        .header("x-shopify-webhook-id", webhook_id)
        .header("x-shopify-topic", topic);
    match event_id {
        Some(event_id) => request.header("x-shopify-event-id", event_id),
        None => request,
    }
}

/// `orders/create` and `orders/paid` with one body are two events, each
/// run once; copies under either topic with fresh ids run nothing more.
async fn one_body_under_two_handled_topics_runs_once_under_each(backend: Backend) {
    let Some(h) = harness(backend).await else {
        return;
    };
    let body = order_body(450789469);
    let create = delivery(&body, "orders/create", "wh-create", None);
    let paid = delivery(&body, "orders/paid", "wh-paid", None);
    assert_answer(&h.send(&create).await, 200, "new", None);
    let reply = h.send(&paid).await;
    assert_answer(&reply, 200, "new", None);
    assert_eq!(reply.json()["kind"], "orders/paid");

    // Shopify's own retry: a plain duplicate.
    let again = h.send(&paid).await;
    assert_answer(&again, 200, "duplicate", None);
    assert_eq!(again.json()["matched"], "event_id");
    // A captured body re-sent under a handled topic with a fresh id: the
    // topic's event exists, nothing more is recorded.
    for (n, topic) in ["orders/create", "orders/paid", "orders/paid"]
        .iter()
        .enumerate()
    {
        let copy = delivery(&body, topic, &format!("wh-copy-{n}"), None);
        let reply = h.send(&copy).await;
        assert_answer(&reply, 200, "duplicate", None);
        assert_eq!(reply.json()["matched"], "replay_key", "{topic}");
    }

    assert_eq!(h.event_rows().await, 2, "one event per handled topic");
    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 2);
    assert_eq!(h.db.probe.runs("wh-create", "first").await, 1);
    assert_eq!(h.db.probe.runs("wh-paid", "first").await, 1);
    assert_eq!(h.db.probe.runs_of("first").await, 2);
}

/// The same body under a topic no handler takes (`customers/redact`, or
/// `Orders/create`: topics are exact) records nothing, with a fresh id. A
/// body first seen under such a topic is recorded as ignored, and still
/// runs once under a handled topic.
async fn a_body_under_a_topic_no_handler_takes_records_nothing(backend: Backend) {
    let Some(h) = harness(backend).await else {
        return;
    };
    let body = order_body(450789470);
    assert_answer(
        &h.send(&delivery(&body, "orders/create", "wh-1", None))
            .await,
        200,
        "new",
        None,
    );
    for (n, topic) in ["customers/redact", "Orders/create", "x1"]
        .iter()
        .enumerate()
    {
        let copy = delivery(&body, topic, &format!("wh-unhandled-{n}"), None);
        let reply = h.send(&copy).await;
        assert_answer(&reply, 200, "duplicate", None);
        assert_eq!(reply.json()["matched"], "replay_key", "{topic}");
    }
    assert_eq!(h.event_rows().await, 1, "nothing recorded for the copies");

    // Another body, first under a topic no handler takes: ignored, once.
    let other = order_body(450789471);
    assert_answer(
        &h.send(&delivery(&other, "shop/redact", "wh-2", None)).await,
        200,
        "ignored",
        None,
    );
    let reply = h
        .send(&delivery(&other, "customers/redact", "wh-3", None))
        .await;
    assert_answer(&reply, 200, "duplicate", None);
    assert_eq!(reply.json()["matched"], "replay_key");
    // Under a handled topic it is that topic's event: once.
    assert_answer(
        &h.send(&delivery(&other, "orders/paid", "wh-4", None)).await,
        200,
        "new",
        None,
    );
    let reply = h.send(&delivery(&other, "orders/paid", "wh-5", None)).await;
    assert_answer(&reply, 200, "duplicate", None);

    assert_eq!(h.event_rows().await, 3);
    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 2);
    assert_eq!(h.db.probe.runs_of("first").await, 2);
    assert_eq!(h.db.probe.runs("wh-1", "first").await, 1);
    assert_eq!(h.db.probe.runs("wh-4", "first").await, 1);
}

/// One `X-Shopify-Event-Id` under one topic is one event, whatever its
/// webhook id and body (a second subscription, another API version); the
/// same event id under another topic is another event. A retry stays a
/// duplicate.
async fn a_repeated_shopify_event_id_is_a_duplicate(backend: Backend) {
    let Some(h) = harness(backend).await else {
        return;
    };
    const EVENT: &str = "7b8c9d0a-1234-5678-90ab-cdef12345678";
    let body = order_body(450789472);
    let first = delivery(&body, "orders/create", "wh-a", Some(EVENT));
    let reply = h.send(&first).await;
    assert_answer(&reply, 200, "new", None);
    assert_eq!(
        reply.json()["event_id"],
        format!("event:{EVENT}:orders/create:450789472")
    );
    // The retry of that delivery.
    let retry = h.send(&first).await;
    assert_answer(&retry, 200, "duplicate", None);
    assert_eq!(retry.json()["matched"], "event_id");
    // The same event to a second subscription of the topic: another webhook
    // id, and a body of another API version.
    let newer = serde_json::json!({
        "id": 450789472u64, "financial_status": "paid", "total_price": "11.00",
        "current_total_price": "11.00"
    })
    .to_string();
    let second = h
        .send(&delivery(&newer, "orders/create", "wh-b", Some(EVENT)))
        .await;
    assert_answer(&second, 200, "duplicate", None);
    assert_eq!(second.json()["matched"], "event_id");
    // The same merchant action's other topic, with the same body.
    let paid = h
        .send(&delivery(&body, "orders/paid", "wh-c", Some(EVENT)))
        .await;
    assert_answer(&paid, 200, "new", None);

    assert_eq!(h.event_rows().await, 2);
    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 2);
    assert_eq!(h.db.probe.runs_of("first").await, 2);
}

// Every case, once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(backend => [
    one_body_under_two_handled_topics_runs_once_under_each,
    a_body_under_a_topic_no_handler_takes_records_nothing,
    a_repeated_shopify_event_id_is_a_duplicate,
]);
