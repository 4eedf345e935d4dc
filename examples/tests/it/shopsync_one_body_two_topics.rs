//! `shopsync` when Shopify sends one order's byte-identical body under two
//! topics: a real `shopsync` process, real sockets, signed deliveries, a
//! fake Admin API that records every call.
//!
//! An order paid at checkout comes as `orders/create` and `orders/paid` with
//! one body (`"financial_status": "paid"`). Each topic must run once: the
//! order is reserved, its wait matches its own `orders/paid`, and it is
//! fulfilled. (When the second topic was answered as a replay of the first,
//! no such order was fulfilled: one created first waited out its timeout
//! and was released; one paid first was never even reserved.)
//!
//! Neither the topic nor the ids are signed, so the money decision must read
//! the signed body: an unpaid order's `orders/create` body re-sent under
//! `orders/paid` with a fresh webhook id is recorded, but releases the order
//! all the same; and a paid order's body re-sent under `orders/create` with
//! a fresh id does not reserve or fulfil it a second time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use tickmark::Backend;
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Outgoing};
use tickmark_tests::TestDb;
use tokio::process::{Child, Command};

pub(crate) const SECRET: &str = "shpss_shopsync_one_body_two_topics_secret";

/// Short, so that unpaid orders are released during the test.
const PAY_TIMEOUT_SECS: u64 = 3;

/// Generous limit for conditions that normally hold within seconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(120);

/// One call the Admin API received: (shop, order, action) and its key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    order: String,
    action: String,
    key: String,
    body: String,
}

/// Answers every order call 200, and keeps them.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeAdminApi {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl FakeAdminApi {
    pub(crate) async fn start() -> (LoopbackServer, Self) {
        let api = FakeAdminApi::default();
        let router = axum::Router::new()
            .route(
                "/shops/{shop}/orders/{id}/{action}",
                axum::routing::post(order_call),
            )
            .with_state(api.clone());
        (LoopbackServer::start(router).await, api)
    }

    /// The calls of one order, by action, each action's distinct keys.
    pub(crate) fn of(&self, order: &str) -> BTreeMap<String, Vec<String>> {
        let mut by_action: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for call in self.calls.lock().unwrap().iter() {
            if call.order == order {
                let keys = by_action.entry(call.action.clone()).or_default();
                if !keys.contains(&call.key) {
                    keys.push(call.key.clone());
                }
            }
        }
        by_action
    }

    fn body_of(&self, order: &str, action: &str) -> serde_json::Value {
        let calls = self.calls.lock().unwrap();
        let call = calls
            .iter()
            .find(|c| c.order == order && c.action == action)
            .unwrap_or_else(|| panic!("no {action} call for {order}"));
        serde_json::from_str(&call.body).unwrap()
    }
}

async fn order_call(
    State(api): State<FakeAdminApi>,
    UrlPath((_shop, order, action)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
    body: String,
) -> &'static str {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    api.calls.lock().unwrap().push(Call {
        order,
        action,
        key,
        body,
    });
    "{}"
}

/// A running `shopsync` process; killed if the test ends early.
pub(crate) struct App {
    pub(crate) child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl App {
    pub(crate) async fn start(
        dir: &std::path::Path,
        database_url: &str,
        admin_api: SocketAddr,
        env: &[(&str, &str)],
    ) -> App {
        let log = dir.join("shopsync.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_shopsync"))
            .current_dir(dir)
            .args(["--database-url", database_url, "--listen", "127.0.0.1:0"])
            .args(["--admin-api-url", &format!("http://{admin_api}")])
            .args(["--pay-timeout-secs", &PAY_TIMEOUT_SECS.to_string()])
            .args(["--rate", "1000", "--burst", "1000"])
            .env("SHOPIFY_WEBHOOK_SECRET", SECRET)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "info,sqlx=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("start the shopsync binary");
        let addr = tickmark_tests::announced::listening_address(
            &mut child,
            "shopsync: listening on http://",
            &log,
        )
        .await;
        App { child, addr, log }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Send one signed delivery; its `status` word.
    pub(crate) async fn send(
        &self,
        client: &HttpClient,
        topic: &str,
        webhook_id: &str,
        body: &str,
    ) -> String {
        self.send_for(client, "cool-shop.myshopify.com", topic, webhook_id, body)
            .await
    }

    /// [`send`](Self::send), for `shop`.
    pub(crate) async fn send_for(
        &self,
        client: &HttpClient,
        shop: &str,
        topic: &str,
        webhook_id: &str,
        body: &str,
    ) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(body.as_bytes());
        let signature =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let request = Outgoing::post("/hooks/shopify", body.to_owned())
            .header("content-type", "application/json")
            .header("x-shopify-hmac-sha256", signature)
            .header("x-shopify-webhook-id", webhook_id)
            .header("x-shopify-topic", topic)
            .header("x-shopify-shop-domain", shop);
        let reply = client.send(self.addr, &request).await.expect("an answer");
        assert_eq!(reply.status, 200, "{webhook_id}: {}", reply.json());
        reply.json()["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

fn order(id: u64, financial_status: &str) -> String {
    json!({
        "id": id,
        "name": format!("#{id}"),
        "financial_status": financial_status,
        "total_price": "11.00",
        "line_items": [{"variant_id": 7, "quantity": 1}],
    })
    .to_string()
}

/// Until no event is pending or running (waiting orders are pending): by
/// then every call was made, since a step's call comes before its mark.
pub(crate) async fn settle(db: &TestDb, app: &App) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let active = db
            .probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')")
            .await;
        if active == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{active} events unfinished after {PATIENCE:?}\n{}",
            app.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 20 orders paid at checkout, each as `orders/create` and `orders/paid`
/// with one byte-identical body (every other one's payment sent first):
/// both topics are accepted as new, and every order is reserved once and
/// fulfilled once, naming its own `orders/paid`; none is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_paid_at_checkout_are_fulfilled() {
    let db = TestDb::new(Backend::Sqlite).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (api_server, api) = FakeAdminApi::start().await;
    let mut app = App::start(dir.path(), &db.url, api_server.addr, &[]).await;
    let client = HttpClient::new();

    let orders: Vec<u64> = (0..20).map(|n| 5_000_000 + n).collect();
    let mut answers = Vec::new();
    for (n, id) in orders.iter().enumerate() {
        let body = order(*id, "paid");
        let (create, paid) = (format!("create-{id}"), format!("paid-{id}"));
        let sends = if n % 2 == 0 {
            [("orders/create", &create), ("orders/paid", &paid)]
        } else {
            [("orders/paid", &paid), ("orders/create", &create)]
        };
        for (topic, webhook_id) in sends {
            let status = app.send(&client, topic, webhook_id, &body).await;
            answers.push((webhook_id.clone(), status, "new"));
        }
        // Shopify's retry of the payment: a plain duplicate.
        let status = app.send(&client, "orders/paid", &paid, &body).await;
        answers.push((paid.clone(), status, "duplicate"));
    }
    settle(&db, &app).await;

    let mut wrong = Vec::new();
    for id in &orders {
        let calls = api.of(&id.to_string());
        let expected: BTreeMap<String, Vec<String>> = [
            ("fulfill", format!("shopify:create-{id}:fulfill")),
            ("reserve", format!("shopify:create-{id}:reserve_stock")),
        ]
        .into_iter()
        .map(|(action, key)| (action.to_owned(), vec![key]))
        .collect();
        if calls != expected {
            wrong.push((id, calls));
            continue;
        }
        assert_eq!(
            api.body_of(&id.to_string(), "fulfill"),
            json!({"order_id": id.to_string(), "paid_event_id": format!("paid-{id}")})
        );
    }
    assert!(
        wrong.is_empty(),
        "{} of {} orders paid at checkout not reserved then fulfilled once: {wrong:?}",
        wrong.len(),
        orders.len()
    );
    for (webhook_id, status, expected) in &answers {
        assert_eq!(status, expected, "{webhook_id}");
    }
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'done'")
            .await,
        2 * orders.len() as i64,
        "each topic is its own event, done"
    );

    tickmark_tests::terminate::terminate(&mut app.child, "shopsync").await;
    api_server.shutdown().await;
}

/// The topic pays nothing. An unpaid order's `orders/create` body re-sent
/// under `orders/paid` with a fresh webhook id is recorded, yet the order
/// is released, never fulfilled: its signed body says `pending`. A paid
/// order's body re-sent under `orders/create` with a fresh id is recorded
/// as stale: the order is reserved and fulfilled once, under its own
/// `orders/create`'s keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_without_a_paid_body_never_pays() {
    let db = TestDb::new(Backend::Sqlite).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (api_server, api) = FakeAdminApi::start().await;
    let mut app = App::start(dir.path(), &db.url, api_server.addr, &[]).await;
    let client = HttpClient::new();

    let unpaid: Vec<u64> = (0..5).map(|n| 6_000_000 + n).collect();
    for id in &unpaid {
        let body = order(*id, "pending");
        let create = format!("create-{id}");
        assert_eq!(
            app.send(&client, "orders/create", &create, &body).await,
            "new"
        );
        // The captured body under the topic that waits, with a fresh id:
        // its own event (each topic of one body runs once), not a payment.
        let forged = format!("forged-paid-{id}");
        let status = app.send(&client, "orders/paid", &forged, &body).await;
        assert!(
            status == "new" || status == "duplicate",
            "{forged}: {status}"
        );
    }
    let paid: Vec<u64> = (0..5).map(|n| 7_000_000 + n).collect();
    for id in &paid {
        let created = order(*id, "pending");
        let payment = order(*id, "paid");
        let create = format!("create-{id}");
        assert_eq!(
            app.send(&client, "orders/create", &create, &created).await,
            "new"
        );
        assert_eq!(
            app.send(&client, "orders/paid", &format!("paid-{id}"), &payment)
                .await,
            "new"
        );
        // The payment's body under `orders/create`, with a fresh id.
        let forged = format!("forged-create-{id}");
        let status = app.send(&client, "orders/create", &forged, &payment).await;
        assert!(
            status == "new" || status == "duplicate",
            "{forged}: {status}"
        );
    }
    settle(&db, &app).await;

    for id in &unpaid {
        let calls = api.of(&id.to_string());
        assert_eq!(
            calls.keys().map(String::as_str).collect::<Vec<_>>(),
            ["release", "reserve"],
            "order {id} is unpaid whatever the topic said: released, never fulfilled: {calls:?}"
        );
    }
    for id in &paid {
        let calls = api.of(&id.to_string());
        let expected: BTreeMap<String, Vec<String>> = [
            ("fulfill", format!("shopify:create-{id}:fulfill")),
            ("reserve", format!("shopify:create-{id}:reserve_stock")),
        ]
        .into_iter()
        .map(|(action, key)| (action.to_owned(), vec![key]))
        .collect();
        assert_eq!(
            calls, expected,
            "order {id}: reserved and fulfilled once, by its own orders/create"
        );
    }

    tickmark_tests::terminate::terminate(&mut app.child, "shopsync").await;
    api_server.shutdown().await;
}
