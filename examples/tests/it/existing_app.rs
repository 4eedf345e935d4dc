//! `existing_app`, the shop service that added tickmark to what it had: a
//! real process on a fresh PostgreSQL schema that already holds the
//! service's own sqlx migrations, real sockets, signed Stripe and Shopify
//! deliveries.
//!
//! - `the_service_keeps_its_migrations_router_and_pool`: the service's
//!   migrator and tickmark's both run (and run again at a restart) without
//!   a `VersionMissing`; its own routes and fallback answer beside the
//!   receiver's; each delivery runs once; a payload that does not fit the
//!   service's type parks its event with serde's words.
//! - `a_crash_between_accept_ins_commit_and_the_answer_loses_nothing`: the
//!   process aborts after `POST /orders` committed the order and its event
//!   and before it answered; after a restart the event runs, the client's
//!   retry is a duplicate, and the order is confirmed once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tickmark_examples::existing_app::APP_MIGRATOR;
use tickmark_examples::stripe_signature::stripe_signature;
use tickmark_tests::db::EmptySchema;
use tickmark_tests::http_client::{HttpClient, Outgoing, Reply};
use tokio::process::{Child, Command};

const STRIPE_SECRET: &str = "whsec_existing_app_test_secret_0123";
const SHOPIFY_SECRET: &str = "shpss_existing_app_test_secret_0123";

/// Generous limit for conditions that normally hold within a second.
const PATIENCE: Duration = Duration::from_secs(60);

/// A running `existing_app`; killed if the test ends early.
struct App {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl App {
    async fn start(dir: &Path, database_url: &str, crash_after_commit: Option<&str>) -> App {
        let log = dir.join(format!("existing_app.{}.log", rand::random::<u32>()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_existing_app"));
        command
            .current_dir(dir)
            .args(["--database-url", database_url, "--listen", "127.0.0.1:0"])
            .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
            .env("SHOPIFY_WEBHOOK_SECRET", SHOPIFY_SECRET)
            .env_remove("DATABASE_URL")
            .env_remove("EXISTING_APP_CRASH_AFTER_COMMIT")
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        if let Some(key) = crash_after_commit {
            command.env("EXISTING_APP_CRASH_AFTER_COMMIT", key);
        }
        let mut child = command.spawn().expect("start the existing_app binary");
        let addr = tickmark_tests::announced::listening_address(
            &mut child,
            "existing_app: listening on http://",
            &log,
        )
        .await;
        App { child, addr, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn send(&self, client: &HttpClient, request: &Outgoing) -> Reply {
        client
            .send(self.addr, request)
            .await
            .unwrap_or_else(|e| panic!("an answer: {e}\n{}", self.log()))
    }

    async fn stop(mut self) {
        let status = tickmark_tests::terminate::terminate(&mut self.child, "existing_app").await;
        assert!(status.success(), "{status}\n{}", self.log());
    }
}

fn create_order(key: &str, shopify_order_id: i64) -> Outgoing {
    Outgoing::post(
        "/orders",
        json!({ "customer": "cus_1", "amount_cents": 1200, "shopify_order_id": shopify_order_id })
            .to_string(),
    )
    .header("content-type", "application/json")
    .header("idempotency-key", key)
}

fn stripe(body: &str) -> Outgoing {
    let signature = stripe_signature(STRIPE_SECRET, chrono::Utc::now().timestamp(), body);
    Outgoing::post("/webhooks/stripe", body.to_owned())
        .header("content-type", "application/json")
        .header("stripe-signature", signature)
}

fn shopify(topic: &str, webhook_id: &str, body: &str) -> Outgoing {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SHOPIFY_SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    Outgoing::post("/webhooks/shopify", body.to_owned())
        .header("content-type", "application/json")
        .header("x-shopify-hmac-sha256", signature)
        .header("x-shopify-webhook-id", webhook_id)
        .header("x-shopify-topic", topic)
        .header("x-shopify-shop-domain", "cool-shop.myshopify.com")
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connect to the test schema")
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Until no event is pending or running.
async fn settle(pool: &PgPool, app: &App) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let active = scalar(
            pool,
            "SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')",
        )
        .await;
        if active == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{active} events unfinished after {PATIENCE:?}\n{}",
            app.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_service_keeps_its_migrations_router_and_pool() {
    let Some(schema) = EmptySchema::new().await else {
        return; // recorded as skipped by EmptySchema
    };
    let db = pool(&schema.url).await;
    // The service was there first: its own migrations are applied.
    APP_MIGRATOR
        .run(&db)
        .await
        .expect("the service's migrations");
    let dir = tempfile::tempdir().unwrap();
    let app = App::start(dir.path(), &schema.url, None).await;
    let client = HttpClient::new();

    // The service's own routes, and its own fallback, beside the receiver.
    let created = app.send(&client, &create_order("k1", 4242)).await;
    assert_eq!(created.status, 200, "{}", created.json());
    assert_eq!(
        created.json(),
        json!({ "order": "ord_k1", "created": true })
    );
    let again = app.send(&client, &create_order("k1", 4242)).await;
    assert_eq!(again.json(), json!({ "order": "ord_k1", "created": false }));
    let unknown = app.send(&client, &Outgoing::get("/no/such/page")).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"], "no such route in the shop service");
    let unknown_source = app
        .send(&client, &Outgoing::post("/webhooks/paypal", "{}"))
        .await;
    assert_eq!(unknown_source.status, 404, "the receiver's own answer");

    // Stripe: a paid invoice, delivered twice; a forged one; one whose body
    // does not fit the service's type.
    let invoice = json!({
        "id": "evt_paid_1", "type": "invoice.payment_succeeded",
        "data": { "object": { "customer": "cus_1", "amount_paid": 1200 } }
    })
    .to_string();
    for expected in ["new", "duplicate"] {
        let reply = app.send(&client, &stripe(&invoice)).await;
        assert_eq!(reply.status, 200, "{}", reply.json());
        assert_eq!(reply.json()["status"], expected);
    }
    let forged =
        Outgoing::post("/webhooks/stripe", invoice.clone()).header("stripe-signature", "t=1,v1=00");
    assert_eq!(app.send(&client, &forged).await.status, 401);
    let misfit = json!({
        "id": "evt_misfit", "type": "invoice.payment_succeeded",
        "data": { "object": { "customer": "cus_1", "amount_paid": "twelve" } }
    })
    .to_string();
    assert_eq!(
        app.send(&client, &stripe(&misfit)).await.json()["status"],
        "new"
    );

    // Shopify: the order is paid.
    let paid = json!({ "id": 4242, "financial_status": "paid" }).to_string();
    let reply = app
        .send(&client, &shopify("orders/paid", "wh_1", &paid))
        .await;
    assert_eq!(reply.json()["status"], "new", "{}", reply.json());

    settle(&db, &app).await;
    assert_eq!(
        scalar(
            &db,
            "SELECT balance_cents FROM customer_balances WHERE customer = 'cus_1'"
        )
        .await,
        1200,
        "credited once\n{}",
        app.log()
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM order_confirmations").await,
        1
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM orders WHERE id = 'ord_k1' AND paid"
        )
        .await,
        1
    );
    let (state, error): (String, Option<String>) = sqlx::query_as(
        "SELECT state, last_error FROM tickmark_events WHERE dedup_key = 'evt_misfit'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(
        state, "parked",
        "a misfit payload waits for a fix, not a retry"
    );
    let error = error.unwrap_or_default();
    assert!(
        error.contains("amount_paid"),
        "serde's words, with the path: {error}"
    );
    let shown = app.send(&client, &Outgoing::get("/orders/ord_k1")).await;
    assert_eq!(shown.json()["event"], "done", "{}", shown.json());
    assert_eq!(shown.json()["steps"][0]["state"], "done");

    // Two histories: the service's in `_sqlx_migrations`, tickmark's apart.
    let service_versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(
        service_versions,
        [1, 2],
        "only the service's own migrations"
    );

    // A restart runs both migrators again: nothing to do, nothing refused.
    app.stop().await;
    let app = App::start(dir.path(), &schema.url, None).await;
    let reply = app.send(&client, &create_order("k2", 4343)).await;
    assert_eq!(reply.json()["created"], true, "{}", app.log());
    settle(&db, &app).await;
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM order_confirmations").await,
        2
    );
    app.stop().await;
}

#[tokio::test]
async fn a_crash_between_accept_ins_commit_and_the_answer_loses_nothing() {
    let Some(schema) = EmptySchema::new().await else {
        return; // recorded as skipped by EmptySchema
    };
    let db = pool(&schema.url).await;
    APP_MIGRATOR
        .run(&db)
        .await
        .expect("the service's migrations");
    let dir = tempfile::tempdir().unwrap();
    let client = HttpClient::new();

    let mut crashing = App::start(dir.path(), &schema.url, Some("k-crash")).await;
    let lost = client
        .send(crashing.addr, &create_order("k-crash", 77))
        .await;
    assert!(lost.is_err(), "no answer: the process died before it");
    let status = tokio::time::timeout(PATIENCE, crashing.child.wait())
        .await
        .expect("the process ends")
        .unwrap();
    assert!(!status.success(), "it aborted: {status}");
    // What committed before the crash: the order and its event, together.
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM orders WHERE id = 'ord_k-crash'").await,
        1
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM tickmark_events WHERE source = 'app' AND dedup_key = 'ord_k-crash'"
        )
        .await,
        1,
        "the event committed with the order\n{}",
        crashing.log()
    );

    // The restarted service runs the event; the client's retry (it never
    // saw an answer) is a duplicate.
    let app = App::start(dir.path(), &schema.url, None).await;
    let retried = app.send(&client, &create_order("k-crash", 77)).await;
    assert_eq!(retried.status, 200, "{}", retried.json());
    assert_eq!(retried.json()["created"], false);
    settle(&db, &app).await;
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM order_confirmations WHERE order_id = 'ord_k-crash'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM tickmark_events WHERE dedup_key = 'ord_k-crash' AND state = 'done'"
        )
        .await,
        1
    );
    app.stop().await;
}
