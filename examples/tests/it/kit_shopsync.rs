//! The `shopsync` example's real handlers under the test kit
//! (`tickmark::testing`), as a user of tickmark would test them: its
//! steps, its [`AdminApi`] resource pointed at an [`EffectLedger`] (every
//! Admin API call carries its step's `Idempotency-Key`, and the ledger
//! answers as an idempotent API does), its own table, and events laid out
//! by its own provider ([`ShopifyWithShop`]) from signed deliveries.
//!
//! - the order flow (`reserve_stock`, the wait `paid`, `fulfill`) survives a
//!   crash at every step boundary, on SQLite and PostgreSQL (the wait has
//!   none of its own: it runs no code of the app's);
//! - ten copies of an `orders/create` at once and one late reserve and
//!   fulfil once; its calls run twice by `always_replay` apply once;
//! - a product's updates end with its newest version pushed, once,
//!   whatever order they arrive in (`skip_stale` with the debounce);
//! - `push_product` crashed after its call, before its mark, pushes once
//!   (by hand, and by a CrashTest whose clock passes the debounce).
//!
//! Only the PostgreSQL URL (and its recorded skip) comes from
//! `tickmark_tests`, as for the other tests of this crate.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use tickmark::receiver::providers::{Delivery, Provider, Verdict};
use tickmark::testing::{
    BoxError, Crash, CrashReport, CrashTest, EffectLedger, Order, TestEngine, TestError,
};
use tickmark::{Backend, EventState, NewEvent};
use tickmark_examples::shopsync::{
    self, AdminApi, FlowSettings, OrderSettings, ShopifyWithShop, ORDERS_CREATE, ORDERS_PAID,
    PRODUCTS_UPDATE, SOURCE,
};

/// How long one run of the handlers may take.
const WITHIN: Duration = Duration::from_secs(30);

/// The app's client secret the deliveries are signed with.
const SECRET: &str = "shpss_kit_shopsync_secret";

/// The shop every delivery is for.
const SHOP: &str = "kit-shop.myshopify.com";

/// The order of the order-flow tests.
const ORDER_ID: u64 = 450_789_469;

/// The product of the product tests.
const PRODUCT_ID: u64 = 632_910_392;

/// A delivery of `body` under `topic`, signed and verified by shopsync's own
/// provider, as the event the receiver would record: the webhook id is its
/// id, the payload laid out with the shop.
fn shopify(topic: &str, webhook_id: &str, body: &Value) -> NewEvent {
    let body = body.to_string();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key size");
    mac.update(body.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let mut headers = HeaderMap::new();
    let header = |value: &str| HeaderValue::from_str(value).expect("a header value");
    headers.insert("x-shopify-hmac-sha256", header(&signature));
    headers.insert("x-shopify-webhook-id", header(webhook_id));
    headers.insert("x-shopify-topic", header(topic));
    headers.insert("x-shopify-shop-domain", header(SHOP));
    let provider = ShopifyWithShop::new([SECRET]).expect("a secret");
    let verdict = provider.verify(&Delivery {
        headers: &headers,
        body: body.as_bytes(),
        public_url: "",
        now: chrono::Utc::now(),
    });
    match verdict {
        Ok(Verdict::Event(event)) => NewEvent::with_id(
            SOURCE,
            event.id.expect("Shopify's webhook id"),
            event.kind,
            event.payload,
        ),
        other => panic!("a signed delivery verifies: {other:?}"),
    }
}

fn orders_create(webhook_id: &str) -> NewEvent {
    let body = json!({"id": ORDER_ID, "financial_status": "pending", "total_price": "11.00"});
    shopify(ORDERS_CREATE, webhook_id, &body)
}

fn orders_paid(webhook_id: &str) -> NewEvent {
    let body = json!({"id": ORDER_ID, "financial_status": "paid", "total_price": "11.00"});
    shopify(ORDERS_PAID, webhook_id, &body)
}

/// Update `version` (1, 2, 3: newer each) of the product.
fn products_update(version: u32) -> NewEvent {
    let body = json!({
        "id": PRODUCT_ID,
        "title": format!("Hat v{version}"),
        "updated_at": format!("2024-01-02T10:00:0{version}-05:00"),
    });
    shopify(PRODUCTS_UPDATE, &format!("wh-product-{version}"), &body)
}

/// shopsync's handlers (its default limits: a 2 s debounce) on a fresh
/// database of `backend`, its table created as the binary creates it, its
/// Admin API at a fresh ledger.
async fn shopsync_kit(backend: Backend) -> Result<(TestEngine, EffectLedger), BoxError> {
    let handlers = shopsync::handlers(&FlowSettings::default(), &OrderSettings::default());
    let kit = match backend {
        Backend::Sqlite => TestEngine::sqlite(handlers).await?,
        Backend::Postgres => {
            let url = tickmark_tests::db::postgres_url().ok_or("PostgreSQL skipped")?;
            TestEngine::postgres(&url, handlers).await?
        }
    };
    shopsync::create_tables(kit.engine()).await?;
    let ledger = EffectLedger::start().await?;
    let kit = kit
        .with_resource(AdminApi::new(Some(ledger.url().parse()?)))
        .with_ledger(&ledger);
    Ok((kit, ledger))
}

/// The calls the Admin API applied, `POST /shops/…`, in order.
fn applied(ledger: &EffectLedger) -> Vec<String> {
    ledger
        .effects()
        .iter()
        .map(|call| format!("{} {}", call.method, call.path))
        .collect()
}

/// What the order flow ends with: the Admin API's effects, and how many
/// events `record` noted (the `orders/paid`).
type OrderEnd = (Vec<String>, i64);

async fn order_end(kit: &TestEngine, ledger: &EffectLedger) -> Result<OrderEnd, BoxError> {
    let mut transaction = kit.engine().transaction().await?;
    let (recorded,): (i64,) = transaction
        .query("SELECT count(*) FROM shopsync_received")
        .fetch_one()
        .await?;
    Ok((applied(ledger), recorded))
}

/// The order reserved once and fulfilled once; its payment recorded.
fn paid_order_end() -> OrderEnd {
    let order = format!("POST /shops/{SHOP}/orders/{ORDER_ID}");
    (
        vec![format!("{order}/reserve"), format!("{order}/fulfill")],
        1,
    )
}

/// The order flow crashed at every boundary; its payment accepted (and
/// recorded) before, so the wait matches at once.
async fn order_crash_test(backend: Backend) -> CrashReport {
    CrashTest::new(
        orders_create("wh-create-1"),
        move || async move {
            let (kit, ledger) = shopsync_kit(backend).await?;
            kit.deliver(orders_paid("wh-paid-1")).await?;
            kit.run_until_idle_within(WITHIN).await?;
            Ok((kit, ledger))
        },
        |(kit, ledger): (TestEngine, EffectLedger)| async move { order_end(&kit, &ledger).await },
    )
    .within(WITHIN)
    .run()
    .await
    .unwrap_or_else(|error| panic!("the order flow is idempotent: {error}"))
}

fn assert_order_report(report: &CrashReport) {
    // The wait `paid` is not a step the kit sees start (the engine settles
    // it without running code of the app's), so it has no boundary of its
    // own: the crash after reserve_stock's mark resumes at it. release_stock
    // is on the branch not taken: never started, never crashed.
    assert_eq!(
        report.steps,
        vec![
            ("reserve_stock".to_owned(), false),
            ("fulfill".to_owned(), false)
        ],
        "{report:?}"
    );
    let boundaries = [
        ("reserve_stock", Crash::BeforeMark),
        ("reserve_stock", Crash::AfterMark),
        ("fulfill", Crash::BeforeMark),
    ]
    .map(|(step, crash)| (step.to_owned(), crash, true));
    assert_eq!(report.runs, boundaries, "{report:?}");
    assert_eq!(report.end_state, format!("{:?}", paid_order_end()));
}

#[tokio::test]
async fn the_order_flow_survives_a_crash_at_every_step_boundary_on_sqlite() {
    let report = order_crash_test(Backend::Sqlite).await;
    assert_order_report(&report);
}

#[tokio::test]
async fn the_order_flow_survives_a_crash_at_every_step_boundary_on_postgres() {
    if tickmark_tests::db::postgres_url().is_none() {
        return; // recorded as skipped by postgres_url()
    }
    let report = order_crash_test(Backend::Postgres).await;
    assert_order_report(&report);
}

#[tokio::test]
async fn ten_copies_of_an_order_at_once_and_one_late_reserve_and_fulfil_once() {
    let (kit, ledger) = shopsync_kit(Backend::Sqlite).await.unwrap();
    kit.deliver(orders_paid("wh-paid-2")).await.unwrap();
    let deliveries = kit
        .deliver_like_a_provider(orders_create("wh-create-2"), 10, WITHIN)
        .await
        .unwrap();
    assert_eq!((deliveries.new, deliveries.duplicates), (1, 10));
    assert_eq!(order_end(&kit, &ledger).await.unwrap(), paid_order_end());
    let keys: Vec<_> = ledger
        .effects()
        .into_iter()
        .map(|call| call.idempotency_key.unwrap_or_default())
        .collect();
    assert_eq!(
        keys,
        [
            "shopify:wh-create-2:reserve_stock",
            "shopify:wh-create-2:fulfill"
        ]
    );
    kit.check_ledger().unwrap();
}

#[tokio::test]
async fn the_order_calls_run_twice_apply_once() {
    let (kit, ledger) = shopsync_kit(Backend::Sqlite).await.unwrap();
    let kit = kit.always_replay(true);
    kit.deliver(orders_paid("wh-paid-3")).await.unwrap();
    kit.deliver(orders_create("wh-create-3")).await.unwrap();
    let report = kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_done(SOURCE, "wh-create-3").await.unwrap();
    assert_eq!(report.crashes, 2, "reserve_stock and fulfill, each once");
    assert_eq!(kit.runs_of(SOURCE, "wh-create-3", "reserve_stock"), 2);
    assert_eq!(kit.runs_of(SOURCE, "wh-create-3", "fulfill"), 2);
    assert_eq!(ledger.calls().len(), 4);
    assert_eq!(order_end(&kit, &ledger).await.unwrap(), paid_order_end());
    kit.check_ledger().unwrap();
}

/// The product's updates delivered in `order`, run to the end (the clock
/// moved past the debounce); the Admin API's effects, each with its body.
async fn product_updates_in(order: Order) -> (TestEngine, Vec<(String, Value)>) {
    let (kit, ledger) = shopsync_kit(Backend::Sqlite).await.unwrap();
    let updates = (1..=3).map(products_update).collect();
    kit.deliver_in(updates, order).await.unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    assert!(ledger.effects().is_empty(), "debounced: nothing pushed yet");
    kit.advance(FlowSettings::default().max_wait() + Duration::from_secs(1))
        .unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.check_ledger().unwrap();
    let pushes = ledger
        .effects()
        .into_iter()
        .map(|call| {
            let body = serde_json::from_slice(&call.body).expect("a JSON body");
            (format!("{} {}", call.method, call.path), body)
        })
        .collect();
    (kit, pushes)
}

#[tokio::test]
async fn a_products_updates_in_any_order_push_its_newest_version_once() {
    let (kit, as_given) = product_updates_in(Order::AsGiven).await;
    let newest = json!({
        "id": PRODUCT_ID,
        "title": "Hat v3",
        "updated_at": "2024-01-02T10:00:03-05:00",
    });
    assert_eq!(
        as_given,
        [(format!("POST /shops/{SHOP}/products/{PRODUCT_ID}"), newest)]
    );
    kit.assert_done(SOURCE, "wh-product-3").await.unwrap();
    for order in [Order::Reversed, Order::Shuffled { seed: 7 }] {
        let (kit, pushes) = product_updates_in(order).await;
        assert_eq!(pushes, as_given, "{order:?}");
        kit.assert_done(SOURCE, "wh-product-3").await.unwrap();
        for older in ["wh-product-1", "wh-product-2"] {
            let state = kit.status(SOURCE, older).await.unwrap().state();
            assert!(
                matches!(state, EventState::Superseded | EventState::Stale),
                "{order:?}: {older} is {state}"
            );
        }
    }
}

#[tokio::test]
async fn a_push_crashed_after_its_call_before_its_mark_pushes_once() {
    let (kit, ledger) = shopsync_kit(Backend::Sqlite).await.unwrap();
    kit.crash_once("push_product", Crash::BeforeMark);
    kit.deliver(products_update(1)).await.unwrap();
    kit.advance(FlowSettings::default().debounce + Duration::from_secs(1))
        .unwrap();
    let report = kit.run_until_idle_within(WITHIN).await.unwrap();
    assert_eq!(report.crashes, 1);
    kit.assert_done(SOURCE, "wh-product-1").await.unwrap();
    assert_eq!(kit.runs_of(SOURCE, "wh-product-1", "push_product"), 2);
    let calls = ledger.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[1].replayed,
        "the re-run's call was the first's, replayed"
    );
    assert_eq!(ledger.effects().len(), 1);
    kit.check_ledger().unwrap();
}

/// `push_product` crashed at its one boundary (it is the handler's last
/// step: after its mark the event is done), with each run's clock moved
/// past the debounce once the update is delivered; the end state is the
/// Admin API's effects.
async fn product_crash_test(advance: Duration) -> Result<CrashReport, TestError> {
    CrashTest::new(
        products_update(1),
        || shopsync_kit(Backend::Sqlite),
        |(_kit, ledger): (TestEngine, EffectLedger)| async move {
            Ok::<_, BoxError>(applied(&ledger))
        },
    )
    .advance_after_delivery(advance)
    .within(WITHIN)
    .run()
    .await
}

#[tokio::test]
async fn a_product_push_survives_a_crash_at_every_step_boundary() {
    let report = product_crash_test(FlowSettings::default().debounce + Duration::from_secs(1))
        .await
        .unwrap_or_else(|error| panic!("push_product is idempotent: {error}"));
    assert_eq!(report.steps, vec![("push_product".to_owned(), false)]);
    assert_eq!(
        report.runs,
        vec![("push_product".to_owned(), Crash::BeforeMark, true)]
    );
    assert_eq!(
        report.end_state,
        format!(
            "{:?}",
            [format!("POST /shops/{SHOP}/products/{PRODUCT_ID}")]
        )
    );
}

#[tokio::test]
async fn a_debounced_product_without_the_clock_moved_is_named_unfinished() {
    let error = product_crash_test(Duration::ZERO)
        .await
        .expect_err("the debounce holds the event back");
    let message = error.to_string();
    eprintln!("the kit says:\n{message}");
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(
        message.contains("step `push_product` (one clean run)"),
        "{message}"
    );
    assert!(message.contains("pending"), "{message}");
    assert!(
        message.contains("CrashTest::advance_after_delivery"),
        "{message}"
    );
}
