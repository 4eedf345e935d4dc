//! The fake Stripe (tickmark_tests::stripe_api) against Stripe's documented
//! behaviour, over real loopback sockets: paging both ways, filters, the
//! 30-day horizon, errors, injected 429 and 5xx answers, signed webhook
//! deliveries (verified by tickmark's own Stripe verifier) with retries and
//! the 3-day give-up, and the official stripe-python client listing the
//! same events as the fake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tickmark::receiver::providers::{Delivery, Provider, Stripe, Verdict};
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Outgoing, Reply};
use tickmark_tests::stripe_api::{sender, DeliveryRound, FakeStripe};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// `GET path` with the fake's key as a Bearer token.
async fn get(fake: &FakeStripe, path: &str) -> Reply {
    get_with(fake, path, Some(format!("Bearer {}", fake.api_key()))).await
}

async fn get_with(fake: &FakeStripe, path: &str, authorization: Option<String>) -> Reply {
    let mut request = Outgoing::get(path);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    HttpClient::new()
        .send(fake.addr(), &request)
        .await
        .expect("the fake answers")
}

/// The ids of a list page, and its `has_more`.
fn page(reply: &Reply) -> (Vec<String>, bool) {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["url"], "/v1/events");
    let ids = body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_owned())
        .collect();
    (ids, body["has_more"].as_bool().expect("has_more"))
}

fn error_of(reply: &Reply) -> Value {
    reply.json()["error"].clone()
}

/// `n` events, two per second of the fake's clock (so `created` ties
/// occur), cycling through `kinds`; ids oldest first.
fn make_events(fake: &FakeStripe, n: usize, kinds: &[&str]) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                fake.advance(Duration::from_secs(1));
            }
            fake.create_event(
                kinds[i % kinds.len()],
                json!({"id": format!("in_{i}"), "object": "invoice"}),
            )
        })
        .collect()
}

#[tokio::test]
async fn starting_after_pages_newest_first_with_has_more() {
    let fake = FakeStripe::start().await;
    let oldest_first = make_events(&fake, 25, &["invoice.paid"]);
    let newest_first: Vec<String> = oldest_first.iter().rev().cloned().collect();

    let (first, more) = page(&get(&fake, "/v1/events?limit=10").await);
    assert_eq!((first.as_slice(), more), (&newest_first[..10], true));
    let (second, more) = page(
        &get(
            &fake,
            &format!("/v1/events?limit=10&starting_after={}", first[9]),
        )
        .await,
    );
    assert_eq!((second.as_slice(), more), (&newest_first[10..20], true));
    let (third, more) = page(
        &get(
            &fake,
            &format!("/v1/events?limit=10&starting_after={}", second[9]),
        )
        .await,
    );
    assert_eq!((third.as_slice(), more), (&newest_first[20..], false));

    // The default limit is 10.
    let (default, more) = page(&get(&fake, "/v1/events").await);
    assert_eq!((default.len(), more), (10, true));

    // Event objects carry the documented fields.
    let body = get(&fake, "/v1/events?limit=1").await.json();
    let event = &body["data"][0];
    assert_eq!(event["id"], newest_first[0].as_str());
    assert_eq!(event["object"], "event");
    assert_eq!(event["type"], "invoice.paid");
    assert_eq!(event["livemode"], false);
    assert_eq!(event["pending_webhooks"], 0);
    assert_eq!(
        event["request"],
        json!({"id": null, "idempotency_key": null})
    );
    assert_eq!(event["data"]["object"]["id"], "in_24");
    assert!(event["api_version"].is_string());
    assert_eq!(event["created"], fake.now());
}

#[tokio::test]
async fn ending_before_an_old_id_walks_forward_oldest_page_first() {
    let fake = FakeStripe::start().await;
    let oldest_first = make_events(&fake, 25, &["invoice.paid"]);

    // As stripe-python walks backwards: each page is newest first, the next
    // request is ending_before=<the page's first (newest) id>.
    let mut cursor = oldest_first[0].clone();
    let mut walked = Vec::new();
    let mut pages = Vec::new();
    loop {
        let (ids, more) = page(
            &get(
                &fake,
                &format!("/v1/events?limit=10&ending_before={cursor}"),
            )
            .await,
        );
        pages.push((ids.clone(), more));
        walked.extend(ids.iter().rev().cloned());
        if !more {
            break;
        }
        cursor = ids[0].clone();
    }
    // The first page is the 10 events just newer than the cursor.
    let expected_first: Vec<String> = oldest_first[1..11].iter().rev().cloned().collect();
    assert_eq!(pages[0], (expected_first, true));
    assert_eq!(pages.len(), 3);
    assert_eq!(pages[2].0.len(), 4);
    assert_eq!(walked, oldest_first[1..]);

    // Ending before the newest: nothing newer.
    let (ids, more) = page(
        &get(
            &fake,
            &format!("/v1/events?ending_before={}", oldest_first[24]),
        )
        .await,
    );
    assert!(ids.is_empty() && !more);
}

#[tokio::test]
async fn type_wildcard_types_array_and_their_limits() {
    let fake = FakeStripe::start().await;
    let ids = make_events(
        &fake,
        12,
        &["invoice.paid", "invoice.payment_failed", "charge.succeeded"],
    );
    let of = |k: usize| -> Vec<String> {
        ids.iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == k)
            .map(|(_, id)| id.clone())
            .rev()
            .collect()
    };

    let (got, _) = page(&get(&fake, "/v1/events?type=charge.succeeded").await);
    assert_eq!(got, of(2));
    let (got, _) = page(&get(&fake, "/v1/events?type=invoice.*&limit=100").await);
    let invoices: Vec<String> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 2)
        .map(|(_, id)| id.clone())
        .rev()
        .collect();
    assert_eq!(got, invoices);
    let (got, _) = page(
        &get(
            &fake,
            "/v1/events?types[]=charge.succeeded&types[]=invoice.paid&limit=100",
        )
        .await,
    );
    let wanted: Vec<String> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 1)
        .map(|(_, id)| id.clone())
        .rev()
        .collect();
    assert_eq!(got, wanted);
    // stripe-python's indexed encoding.
    let (got, _) = page(&get(&fake, "/v1/events?types%5B0%5D=invoice.payment_failed").await);
    assert_eq!(got, of(1));

    let twenty: String = (0..20).map(|i| format!("types[]=t{i}&")).collect();
    assert_eq!(
        get(&fake, &format!("/v1/events?{twenty}")).await.status,
        200
    );
    let reply = get(&fake, &format!("/v1/events?{twenty}types[]=t20")).await;
    assert_eq!(reply.status, 400);
    assert_eq!(error_of(&reply)["param"], "types");
    let reply = get(&fake, "/v1/events?type=a&types[]=b").await;
    assert_eq!(reply.status, 400);
    assert_eq!(error_of(&reply)["type"], "invalid_request_error");
}

#[tokio::test]
async fn created_filters_exact_and_ranges() {
    let fake = FakeStripe::start().await;
    let t0 = fake.now();
    let mut ids = Vec::new();
    for i in 0..5 {
        fake.set_now(t0 + 100 * i);
        ids.push(fake.create_event("invoice.paid", json!({})));
    }
    let list = |q: String| {
        let fake = fake.clone();
        async move { page(&get(&fake, &format!("/v1/events?{q}")).await).0 }
    };
    assert_eq!(
        list(format!("created={}", t0 + 200)).await,
        vec![ids[2].clone()]
    );
    assert_eq!(
        list(format!("created[gt]={}", t0 + 200)).await,
        vec![ids[4].clone(), ids[3].clone()]
    );
    assert_eq!(
        list(format!("created[gte]={}", t0 + 300)).await,
        vec![ids[4].clone(), ids[3].clone()]
    );
    assert_eq!(
        list(format!("created[lt]={}", t0 + 100)).await,
        vec![ids[0].clone()]
    );
    assert_eq!(
        list(format!(
            "created[gte]={}&created[lte]={}",
            t0 + 100,
            t0 + 300
        ))
        .await,
        vec![ids[3].clone(), ids[2].clone(), ids[1].clone()]
    );
    for bad in [
        "created=abc",
        "created[gt]=1.5",
        "created[since]=1",
        "created=1&created[gt]=0",
    ] {
        let reply = get(&fake, &format!("/v1/events?{bad}")).await;
        assert_eq!(reply.status, 400, "{bad}");
    }
}

#[tokio::test]
async fn events_older_than_thirty_days_are_not_listed() {
    let fake = FakeStripe::start().await;
    let old = fake.create_event("invoice.paid", json!({}));
    fake.advance(29 * DAY);
    let recent = fake.create_event("invoice.paid", json!({}));
    assert_eq!(
        page(&get(&fake, "/v1/events").await).0,
        vec![recent.clone(), old.clone()]
    );
    fake.advance(2 * DAY);
    assert_eq!(
        page(&get(&fake, "/v1/events").await).0,
        vec![recent.clone()]
    );
    let reply = get(&fake, &format!("/v1/events/{old}")).await;
    assert_eq!(reply.status, 404);
    assert_eq!(
        get(&fake, &format!("/v1/events/{recent}")).await.json()["id"],
        recent.as_str()
    );
}

#[tokio::test]
async fn errors_are_stripe_json_401_400_404() {
    let fake = FakeStripe::start().await;
    let id = fake.create_event("invoice.paid", json!({}));

    let reply = get_with(&fake, "/v1/events", None).await;
    assert_eq!(reply.status, 401);
    assert_eq!(error_of(&reply)["type"], "invalid_request_error");
    assert!(error_of(&reply)["message"]
        .as_str()
        .expect("message")
        .contains("API key"));
    let reply = get_with(
        &fake,
        "/v1/events",
        Some("Bearer sk_test_wrong_key_0000000000".into()),
    )
    .await;
    assert_eq!(reply.status, 401);
    assert!(!error_of(&reply)["message"]
        .as_str()
        .expect("message")
        .contains("sk_test_wrong_key_0000000000"));
    // HTTP Basic with the key as the username, as `curl -u key:` sends.
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:", fake.api_key()));
    assert_eq!(
        get_with(&fake, "/v1/events", Some(format!("Basic {basic}")))
            .await
            .status,
        200
    );

    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("limit=1&limit=2", "limit"),
        ("delivery_success=maybe", "delivery_success"),
        ("colour=blue", "colour"),
    ] {
        let reply = get(&fake, &format!("/v1/events?{query}")).await;
        assert_eq!(reply.status, 400, "{query}");
        assert_eq!(error_of(&reply)["type"], "invalid_request_error", "{query}");
        assert_eq!(error_of(&reply)["param"], param, "{query}");
    }
    assert_eq!(get(&fake, "/v1/events?limit=100").await.status, 200);
    assert_eq!(get(&fake, "/v1/events?limit=1").await.status, 200);
    let reply = get(
        &fake,
        &format!("/v1/events?starting_after={id}&ending_before={id}"),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(error_of(&reply)["message"]
        .as_str()
        .expect("message")
        .contains("starting_after and ending_before"));

    let reply = get(&fake, "/v1/events?starting_after=evt_nope").await;
    assert_eq!(reply.status, 404);
    assert_eq!(error_of(&reply)["code"], "resource_missing");
    assert_eq!(error_of(&reply)["message"], "No such event: 'evt_nope'");
    assert_eq!(error_of(&reply)["param"], "starting_after");
    let reply = get(&fake, "/v1/events/evt_nope").await;
    assert_eq!(
        (reply.status, error_of(&reply)["code"].clone()),
        (404, json!("resource_missing"))
    );

    let reply = get(&fake, "/v1/charges").await;
    assert_eq!(reply.status, 404);
    assert!(error_of(&reply)["message"]
        .as_str()
        .expect("message")
        .starts_with("Unrecognized request URL (GET: /v1/charges)"));
    let post = HttpClient::new()
        .send(
            fake.addr(),
            &Outgoing::post("/v1/events", "")
                .header("authorization", format!("Bearer {}", fake.api_key())),
        )
        .await
        .expect("answer");
    assert_eq!(post.status, 404);

    // Every answer was logged with its status.
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses[..3], [401, 401, 200]);
    assert!(fake.requests().iter().all(|r| r.path.starts_with("/v1/")));
}

#[tokio::test]
async fn rate_limits_and_server_errors_then_recovery() {
    let fake = FakeStripe::start().await;
    fake.create_event("invoice.paid", json!({}));
    fake.rate_limit_next(2, Duration::from_secs(3));
    fake.fail_next(1, 503);
    fake.fail_next(1, 500);

    let reply = get(&fake, "/v1/events").await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("3"));
    assert_eq!(error_of(&reply)["code"], "rate_limit");
    assert_eq!(get(&fake, "/v1/events").await.status, 429);
    let reply = get(&fake, "/v1/events").await;
    assert_eq!(reply.status, 503);
    assert_eq!(error_of(&reply)["type"], "api_error");
    assert_eq!(get(&fake, "/v1/events").await.status, 500);
    let reply = get(&fake, "/v1/events?limit=5").await;
    assert_eq!(page(&reply).0.len(), 1);
    assert!(reply
        .header("request-id")
        .is_some_and(|id| id.starts_with("req_")));

    let log = fake.requests();
    let seen: Vec<(u16, &str)> = log.iter().map(|r| (r.status, r.query.as_str())).collect();
    assert_eq!(
        seen,
        [(429, ""), (429, ""), (503, ""), (500, ""), (200, "limit=5")]
    );
}

/// A loopback webhook receiver that verifies with tickmark's own Stripe
/// verifier and records the ids it accepted.
struct Receiver {
    server: LoopbackServer,
    accepted: Arc<Mutex<Vec<String>>>,
}

async fn start_receiver(secret: &str) -> Receiver {
    let verifier = Arc::new(Stripe::new([secret]).expect("secret"));
    let accepted = Arc::new(Mutex::new(Vec::new()));
    type ReceiverState = (Arc<Stripe>, Arc<Mutex<Vec<String>>>);
    async fn hook(
        State((verifier, accepted)): State<ReceiverState>,
        headers: HeaderMap,
        body: Bytes,
    ) -> StatusCode {
        let delivery = Delivery {
            headers: &headers,
            body: &body,
            public_url: "http://127.0.0.1/hooks/stripe",
            now: chrono::Utc::now(),
        };
        match verifier.verify(&delivery) {
            Ok(Verdict::Event(event)) => {
                accepted
                    .lock()
                    .expect("lock")
                    .push(event.id.expect("stripe events have ids"));
                StatusCode::OK
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }
    let router = Router::new()
        .route("/hooks/stripe", post(hook))
        .with_state((verifier, accepted.clone()));
    Receiver {
        server: LoopbackServer::start(router).await,
        accepted,
    }
}

#[tokio::test]
async fn deliveries_are_signed_and_verified_by_tickmark() {
    let fake = FakeStripe::start().await;
    let good = start_receiver("whsec_fake_good_secret_0123456789").await;
    let wrong = start_receiver("whsec_fake_other_secret_987654321").await;
    let good_url = format!("http://{}/hooks/stripe", good.server.addr);
    fake.add_endpoint(
        &good_url,
        "whsec_fake_good_secret_0123456789",
        &["invoice.paid"],
    );
    // Signed with a secret that receiver does not hold: 400, retried.
    fake.add_endpoint(
        &format!("http://{}/hooks/stripe", wrong.server.addr),
        "whsec_fake_good_secret_0123456789",
        &["*"],
    );

    let paid = fake.create_event("invoice.paid", json!({"id": "in_1"}));
    let charge = fake.create_event("charge.succeeded", json!({"id": "ch_1"}));
    let round = fake.deliver_due().await;
    assert_eq!(
        round,
        DeliveryRound {
            attempted: 3,
            delivered: 1,
            failed: 2,
            given_up: 0
        }
    );
    assert_eq!(
        good.accepted.lock().expect("lock").clone(),
        vec![paid.clone()]
    );
    assert!(wrong.accepted.lock().expect("lock").is_empty());

    let state = fake.delivery_state(&paid).expect("known");
    assert_eq!(
        (state.delivered, state.attempts, state.pending_webhooks),
        (false, 2, 1)
    );
    assert_eq!(state.next_attempt_at, Some(fake.now() + 300));
    let api = get(&fake, &format!("/v1/events/{paid}")).await.json();
    assert_eq!(api["pending_webhooks"], 1);

    // Nothing due until the backoff has passed.
    assert_eq!(fake.deliver_due().await.attempted, 0);
    fake.advance(sender::retry_delay(1));
    assert_eq!(
        fake.deliver_due().await,
        DeliveryRound {
            attempted: 2,
            delivered: 0,
            failed: 2,
            given_up: 0
        }
    );
    assert_eq!(
        fake.delivery_state(&charge).expect("known").next_attempt_at,
        Some(fake.now() + 600)
    );

    // An event only the good endpoint subscribes to.
    let only_good = fake.create_event("invoice.paid", json!({}));
    let _ = fake.deliver_due().await;
    let state = fake.delivery_state(&only_good).expect("known");
    assert_eq!(
        state.pending_webhooks, 1,
        "the wildcard endpoint still fails"
    );
    assert!(good.accepted.lock().expect("lock").contains(&only_good));
}

#[tokio::test]
async fn a_receiver_down_for_three_days_is_given_up_and_listed_undelivered() {
    let fake = FakeStripe::start().await;
    // A port nothing listens on: bound, then closed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    fake.add_endpoint(
        &format!("http://{addr}/hooks/stripe"),
        "whsec_fake_down_0123456789",
        &["*"],
    );
    let healthy = start_receiver("whsec_fake_up_0123456789abcdef").await;

    let lost = fake.create_event("invoice.paid", json!({}));
    fake.add_endpoint(
        &format!("http://{}/hooks/stripe", healthy.server.addr),
        "whsec_fake_up_0123456789abcdef",
        &["*"],
    );
    // `fine` goes to both endpoints: the healthy one takes it, the dead one never.
    let fine = fake.create_event("invoice.paid", json!({}));
    let created = fake.now();

    let mut attempts = 0;
    let mut given_up = 0;
    // Hour by hour, until past the window and the longest backoff after it.
    let end = sender::RETRY_WINDOW_SECS + sender::MAX_RETRY_DELAY.as_secs() as i64 + 3600;
    while fake.now() - created <= end {
        let round = fake.deliver_due().await;
        attempts += round.attempted;
        given_up += round.given_up;
        fake.advance(Duration::from_secs(60 * 60));
    }
    let state = fake.delivery_state(&lost).expect("known");
    assert!(state.given_up && !state.delivered, "{state:?}");
    assert_eq!(state.pending_webhooks, 1);
    assert!(
        state.attempts >= 8,
        "exponential backoff over 3 days: {state:?}"
    );
    assert!(state.next_attempt_at.is_none());
    assert_eq!(given_up, 2, "both events' deliveries to the dead endpoint");
    assert!(attempts > 0);
    assert_eq!(
        healthy.accepted.lock().expect("lock").clone(),
        vec![fine.clone()]
    );

    // Recent enough to list: delivery_success=false finds both (each failed
    // all attempts to one endpoint), true finds none.
    fake.set_now(created + 4 * 24 * 3600);
    let (undelivered, _) = page(&get(&fake, "/v1/events?delivery_success=false").await);
    assert_eq!(undelivered, vec![fine.clone(), lost.clone()]);
    let (delivered, _) = page(&get(&fake, "/v1/events?delivery_success=true").await);
    assert!(delivered.is_empty());

    // An event delivered everywhere is listed by delivery_success=true.
    let ok_only = FakeStripe::start().await;
    ok_only.add_endpoint(
        &format!("http://{}/hooks/stripe", healthy.server.addr),
        "whsec_fake_up_0123456789abcdef",
        &["*"],
    );
    let good = ok_only.create_event("invoice.paid", json!({}));
    let pending = ok_only.create_event("invoice.paid", json!({}));
    assert_eq!(
        page(&get(&ok_only, "/v1/events?delivery_success=false").await).0,
        vec![pending.clone(), good.clone()]
    );
    assert_eq!(ok_only.deliver_due().await.delivered, 2);
    assert_eq!(
        page(&get(&ok_only, "/v1/events?delivery_success=true").await).0,
        vec![pending, good]
    );
}

/// tests/.python/bin/python (scripts/setup's install_stripe_python), or
/// `None` when the test should skip.
fn stripe_python() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".python/bin/python");
    if python.exists() {
        return Some(python);
    }
    // Records the skip for scripts/test; under CI=true it fails the test instead.
    tickmark_tests::skip::record(
        &tickmark_tests::skip::current_test(),
        &format!(
            "{} is missing: run scripts/setup (installs stripe-python in tests/.python)",
            python.display()
        ),
    );
    None
}

#[tokio::test]
async fn stripe_python_lists_what_the_fake_lists() {
    let Some(python) = stripe_python() else {
        return;
    };
    let fake = FakeStripe::start().await;
    let t0 = fake.now() - 1000;
    fake.set_now(t0);
    let oldest_first = make_events(
        &fake,
        25,
        &["invoice.paid", "charge.succeeded", "customer.created"],
    );
    let newest_first: Vec<String> = oldest_first.iter().rev().cloned().collect();
    let created_of = |id: &str| {
        fake.event_json(id).expect("known")["created"]
            .as_i64()
            .expect("created")
    };
    let created_gte = created_of(&oldest_first[12]);
    let config = json!({
        "base_url": fake.base_url(),
        "api_key": fake.api_key(),
        "limit": 10,
        "starting_after": newest_first[4],
        "ending_before": oldest_first[2],
        "types": ["charge.succeeded", "customer.created"],
        "created_gte": created_gte,
    });
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stripe_python/list_events.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(config.to_string())
        .output()
        .await
        .expect("run stripe-python");
    assert!(
        output.status.success(),
        "stripe-python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed: Value = serde_json::from_slice(&output.stdout).expect("JSON from the script");
    let ids = |key: &str| -> Vec<String> {
        serde_json::from_value(listed[key].clone())
            .unwrap_or_else(|e| panic!("{key}: {e}: {listed}"))
    };

    assert_eq!(ids("all"), newest_first);
    assert_eq!(ids("after"), newest_first[5..]);
    // Backwards: stripe-python reverses each page, so oldest first.
    assert_eq!(ids("before"), oldest_first[3..]);
    let typed: Vec<String> = newest_first
        .iter()
        .filter(|id| fake.event_json(id).expect("known")["type"] != "invoice.paid")
        .cloned()
        .collect();
    assert_eq!(ids("types"), typed);
    let recent: Vec<String> = newest_first
        .iter()
        .filter(|id| created_of(id) >= created_gte)
        .cloned()
        .collect();
    assert_eq!(ids("created_gte"), recent);

    // It paged with the documented cursors and indexed arrays.
    let queries: Vec<String> = fake.requests().into_iter().map(|r| r.query).collect();
    assert!(
        queries.iter().any(|q| q.contains("ending_before=")),
        "{queries:?}"
    );
    assert!(
        queries
            .iter()
            .any(|q| q.contains("types%5B0%5D=charge.succeeded")),
        "{queries:?}"
    );
    assert!(
        queries.iter().any(|q| q.contains("created%5Bgte%5D=")),
        "{queries:?}"
    );
    assert!(fake.requests().iter().all(|r| r.status == 200));
}
