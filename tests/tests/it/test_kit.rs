//! The test kit (`tickmark::testing`, docs/testing.md) on handlers written
//! here as a user writes them: it passes a correct handler, and it finds
//! the double effect of a broken one, naming the step and the fix.

use std::time::Duration;

use axum::body::Body;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::testing::{BoxError, Crash, CrashTest, EffectLedger, Order, TestEngine, TestError};
use tickmark::{
    EventState, Handler, Handlers, NewEvent, Step, StepContext, StepError, StepResult, StepState,
};

const WITHIN: Duration = Duration::from_secs(20);

/// Where the steps post their notices (the ledger, in these tests).
#[derive(Debug, Clone)]
struct NoticeUrl(String);

/// Credits the account in the step's transaction: exactly once.
#[derive(Debug, Serialize, Deserialize)]
struct CreditAccount;

#[typetag::serde(name = "kit_credit_account")]
#[async_trait::async_trait]
impl Step for CreditAccount {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let amount = ctx.event().payload["amount"].as_i64().unwrap_or(0);
        ctx.transaction()?
            .query("UPDATE accounts SET balance = balance + $1 WHERE id = 'acct_1'")
            .bind(amount)
            .execute()
            .await?;
        Ok(json!({ "credited": amount }))
    }
}

/// Posts a notice with the step's idempotency key (or, broken, without one).
#[derive(Debug, Serialize, Deserialize)]
struct PostNotice {
    with_key: bool,
}

#[typetag::serde(name = "kit_post_notice")]
#[async_trait::async_trait]
impl Step for PostNotice {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let url = ctx.resource::<NoticeUrl>()?.0.clone();
        let mut request = axum::http::Request::post(format!("{url}/notices"));
        if self.with_key {
            request = request.header("idempotency-key", ctx.idempotency_key());
        }
        let request = request
            .body(Body::from(ctx.event().id.clone()))
            .map_err(StepError::terminal)?;
        let client: Client<HttpConnector, Body> =
            Client::builder(TokioExecutor::new()).build_http();
        let response = client
            .request(request)
            .await
            .map_err(StepError::retryable)?;
        Ok(json!({ "status": response.status().as_u16() }))
    }
}

/// Broken: counts in a table outside any transaction it is marked with.
#[derive(Debug, Serialize, Deserialize)]
struct CountVisit;

#[typetag::serde(name = "kit_count_visit")]
#[async_trait::async_trait]
impl Step for CountVisit {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let engine = ctx.resource::<tickmark::Engine>()?;
        let mut transaction = engine.transaction().await.map_err(StepError::retryable)?;
        transaction
            .query("UPDATE visits SET n = n + 1")
            .execute()
            .await?;
        transaction.commit().await.map_err(StepError::retryable)?;
        Ok(json!({}))
    }
}

/// How many times a step ran (a resource).
#[derive(Debug, Default)]
struct RunCount(std::sync::atomic::AtomicU32);

/// Snoozes once for an hour of the fake clock, then succeeds.
#[derive(Debug, Serialize, Deserialize)]
struct SnoozeAnHour;

#[typetag::serde(name = "kit_snooze_an_hour")]
#[async_trait::async_trait]
impl Step for SnoozeAnHour {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let runs = ctx.resource::<RunCount>()?;
        if runs.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            return Err(StepError::snooze(
                Duration::from_secs(3600),
                "the payment settles in an hour",
            ));
        }
        Ok(json!({}))
    }
}

/// Never returns.
#[derive(Debug, Serialize, Deserialize)]
struct Hang;

#[typetag::serde(name = "kit_hang")]
#[async_trait::async_trait]
impl Step for Hang {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        std::future::pending().await
    }
}

fn payments(notice_with_key: bool) -> Handlers {
    Handlers::new().on(
        "stripe",
        "invoice.paid",
        Handler::new()
            .named_step("credit_account", CreditAccount)
            .named_step(
                "post_notice",
                PostNotice {
                    with_key: notice_with_key,
                },
            ),
    )
}

fn invoice(id: &str) -> NewEvent {
    NewEvent::with_id("stripe", id, "invoice.paid", json!({ "amount": 250 }))
}

async fn payments_kit(
    backend: &str,
    notice_with_key: bool,
) -> Result<(TestEngine, EffectLedger), BoxError> {
    let ledger = EffectLedger::start().await?;
    let kit = match backend {
        "sqlite" => TestEngine::sqlite(payments(notice_with_key)).await?,
        _ => {
            let url = tickmark_tests::db::postgres_url().ok_or("PostgreSQL skipped")?;
            TestEngine::postgres(&url, payments(notice_with_key)).await?
        }
    }
    .with_resource(NoticeUrl(ledger.url()))
    .with_ledger(&ledger);
    kit.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)")
        .await?;
    kit.execute("INSERT INTO accounts VALUES ('acct_1', 0)")
        .await?;
    Ok((kit, ledger))
}

/// The balance and the notices the service applied.
async fn balance_and_notices(
    kit: TestEngine,
    ledger: EffectLedger,
) -> Result<(i64, usize), BoxError> {
    let mut transaction = kit.engine().transaction().await?;
    let (balance,): (i64,) = transaction
        .query("SELECT balance FROM accounts WHERE id = 'acct_1'")
        .fetch_one()
        .await?;
    Ok((balance, ledger.effects().len()))
}

async fn crash_test(
    backend: &'static str,
    notice_with_key: bool,
) -> Result<tickmark::testing::CrashReport, TestError> {
    CrashTest::new(
        invoice("in_1"),
        move || async move { Ok(payments_kit(backend, notice_with_key).await?.0) },
        |kit: TestEngine| async move {
            let ledger = kit.ledger().ok_or("no ledger attached")?.clone();
            balance_and_notices(kit, ledger).await
        },
    )
    .within(WITHIN)
    .run()
    .await
}

#[tokio::test]
async fn a_correct_handler_survives_a_crash_at_every_step_boundary_on_sqlite() {
    let report = crash_test("sqlite", true).await.expect("idempotent");
    assert_eq!(
        report.steps,
        vec![
            ("credit_account".to_owned(), true),
            ("post_notice".to_owned(), false)
        ]
    );
    assert_eq!(
        report.runs,
        vec![
            ("credit_account".to_owned(), Crash::BeforeMark, true),
            ("credit_account".to_owned(), Crash::AfterMark, true),
            ("post_notice".to_owned(), Crash::BeforeMark, true),
        ]
    );
    assert_eq!(report.end_state, "(250, 1)");
}

#[tokio::test]
async fn a_correct_handler_survives_a_crash_at_every_step_boundary_on_postgres() {
    if tickmark_tests::db::postgres_url().is_none() {
        return; // recorded as skipped by postgres_url()
    }
    let report = crash_test("postgres", true).await.expect("idempotent");
    assert_eq!(report.runs.len(), 3);
    assert!(
        report.runs.iter().all(|(_, _, crashed)| *crashed),
        "{report:?}"
    );
    assert_eq!(report.end_state, "(250, 1)");
}

#[tokio::test]
async fn a_notice_sent_without_the_key_is_a_double_effect_named_with_its_step_and_fix() {
    let error = crash_test("sqlite", false)
        .await
        .expect_err("not idempotent");
    let message = error.to_string();
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(message.contains("step `post_notice`"), "{message}");
    assert!(message.contains("without an Idempotency-Key"), "{message}");
    assert!(message.contains("pass ctx.idempotency_key()"), "{message}");
    assert!(!message.contains("step `credit_account`"), "{message}");
}

#[tokio::test]
async fn a_counter_outside_the_steps_transaction_is_found_at_its_crash() {
    let handlers = Handlers::new().on(
        "shop",
        "visit",
        Handler::new().named_step("count_visit", CountVisit),
    );
    let error = CrashTest::new(
        NewEvent::with_id("shop", "v_1", "visit", json!({})),
        || async {
            let kit = TestEngine::sqlite(Handlers::new().on(
                "shop",
                "visit",
                Handler::new().named_step("count_visit", CountVisit),
            ))
            .await?;
            let kit = kit.clone().with_resource(kit.engine().clone());
            kit.execute("CREATE TABLE visits (n BIGINT NOT NULL)")
                .await?;
            kit.execute("INSERT INTO visits VALUES (0)").await?;
            Ok(kit)
        },
        |kit: TestEngine| async move {
            let mut transaction = kit.engine().transaction().await?;
            let (n,): (i64,) = transaction
                .query("SELECT n FROM visits")
                .fetch_one()
                .await?;
            Ok::<_, BoxError>(n)
        },
    )
    .within(WITHIN)
    .run()
    .await
    .expect_err("a non-transactional counter is not idempotent");
    drop(handlers);
    let message = error.to_string();
    assert!(message.contains("step `count_visit`"), "{message}");
    assert!(message.contains("the end state is 2, not 1"), "{message}");
    assert!(message.contains("make the step transactional"), "{message}");
}

#[tokio::test]
async fn always_replay_runs_each_non_transactional_step_twice() {
    let (kit, ledger) = payments_kit("sqlite", true).await.unwrap();
    let kit = kit.always_replay(true);
    kit.deliver(invoice("in_2")).await.unwrap();
    let report = kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_done("stripe", "in_2").await.unwrap();
    assert_eq!(report.crashes, 1);
    assert_eq!(kit.runs_of("stripe", "in_2", "credit_account"), 1);
    assert_eq!(kit.runs_of("stripe", "in_2", "post_notice"), 2);
    // Two calls, one key: the second was replayed by the service.
    assert_eq!(ledger.calls().len(), 2);
    assert_eq!(ledger.effects().len(), 1);
    kit.check_ledger().unwrap();
}

#[tokio::test]
async fn ten_copies_at_once_and_one_late_run_the_handler_once() {
    let (kit, ledger) = payments_kit("sqlite", true).await.unwrap();
    let deliveries = kit
        .deliver_like_a_provider(invoice("in_3"), 10, WITHIN)
        .await
        .unwrap();
    assert_eq!((deliveries.new, deliveries.duplicates), (1, 10));
    assert_eq!(kit.runs_of("stripe", "in_3", "credit_account"), 1);
    assert_eq!(ledger.effects().len(), 1);
    let (balance, _) = balance_and_notices(kit, ledger).await.unwrap();
    assert_eq!(balance, 250);
}

#[tokio::test]
async fn a_snooze_waits_for_the_fake_clock() {
    let handlers = Handlers::new().on(
        "stripe",
        "charge.pending",
        Handler::new().named_step("settle", SnoozeAnHour),
    );
    let kit = TestEngine::sqlite(handlers)
        .await
        .unwrap()
        .with_resource(RunCount::default());
    kit.deliver(NewEvent::with_id(
        "stripe",
        "ch_1",
        "charge.pending",
        json!({}),
    ))
    .await
    .unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_event("stripe", "ch_1", EventState::Pending)
        .await
        .unwrap();
    kit.advance(Duration::from_secs(3599)).unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    assert_eq!(kit.runs_of("stripe", "ch_1", "settle"), 1, "not due yet");
    kit.advance(Duration::from_secs(1)).unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_step("stripe", "ch_1", "settle", StepState::Done)
        .await
        .unwrap();
    assert_eq!(kit.runs_of("stripe", "ch_1", "settle"), 2);
}

#[tokio::test]
async fn a_step_that_never_returns_fails_the_run_at_its_deadline() {
    let handlers = Handlers::new().on("shop", "x", Handler::new().named_step("hang", Hang));
    let kit = TestEngine::sqlite(handlers).await.unwrap();
    kit.deliver(NewEvent::with_id("shop", "x_1", "x", json!({})))
        .await
        .unwrap();
    let error = kit
        .run_until_idle_within(Duration::from_millis(500))
        .await
        .expect_err("not idle");
    assert!(
        matches!(error, TestError::NotIdle { active: 1, .. }),
        "{error}"
    );
}

/// Stores the product's latest title in the step's transaction.
#[derive(Debug, Serialize, Deserialize)]
struct SaveTitle;

#[typetag::serde(name = "kit_save_title")]
#[async_trait::async_trait]
impl Step for SaveTitle {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let title = ctx.event().payload["title"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        ctx.transaction()?
            .query("UPDATE products SET title = $1 WHERE id = 'p_1'")
            .bind(title)
            .execute()
            .await?;
        Ok(json!({}))
    }
}

async fn products_kit() -> TestEngine {
    let handlers = Handlers::new().on(
        "shopify",
        "products/update",
        Handler::new()
            .skip_stale("/id", "/version")
            .named_step("save_title", SaveTitle),
    );
    let kit = TestEngine::sqlite(handlers).await.unwrap();
    kit.execute("CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT NOT NULL)")
        .await
        .unwrap();
    kit.execute("INSERT INTO products VALUES ('p_1', '')")
        .await
        .unwrap();
    kit
}

async fn title(kit: &TestEngine) -> String {
    let mut transaction = kit.engine().transaction().await.unwrap();
    let (title,): (String,) = transaction
        .query("SELECT title FROM products WHERE id = 'p_1'")
        .fetch_one()
        .await
        .unwrap();
    title
}

#[tokio::test]
async fn updates_of_one_resource_out_of_order_end_as_in_order() {
    let updates: Vec<NewEvent> = (1..=3)
        .map(|version| {
            NewEvent::with_id(
                "shopify",
                format!("upd_{version}"),
                "products/update",
                json!({ "id": "p_1", "version": version, "title": format!("v{version}") }),
            )
        })
        .collect();
    let mut titles = Vec::new();
    for order in [Order::AsGiven, Order::Reversed, Order::Shuffled { seed: 7 }] {
        let kit = products_kit().await;
        kit.deliver_in(updates.clone(), order).await.unwrap();
        kit.run_until_idle_within(WITHIN).await.unwrap();
        kit.assert_done("shopify", "upd_3").await.unwrap();
        titles.push(title(&kit).await);
        if order == Order::Reversed {
            // The newest came first: the older two are stale, never run.
            for older in ["upd_1", "upd_2"] {
                kit.assert_event("shopify", older, EventState::Stale)
                    .await
                    .unwrap();
                assert_eq!(kit.runs_of("shopify", older, "save_title"), 0);
            }
        }
    }
    assert_eq!(titles, ["v3", "v3", "v3"]);
}

#[tokio::test]
async fn a_sleep_step_waits_for_the_fake_clock() {
    let handlers = Handlers::new().on(
        "stripe",
        "customer.created",
        Handler::new()
            .named_step("welcome", SaveTitle)
            .sleep("a_day_later", Duration::from_secs(24 * 3600))
            .named_step("follow_up", SaveTitle),
    );
    let kit = TestEngine::sqlite(handlers).await.unwrap();
    kit.execute("CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT NOT NULL)")
        .await
        .unwrap();
    kit.deliver(NewEvent::with_id(
        "stripe",
        "cus_1",
        "customer.created",
        json!({ "title": "hello" }),
    ))
    .await
    .unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_step("stripe", "cus_1", "welcome", StepState::Done)
        .await
        .unwrap();
    assert_eq!(kit.runs_of("stripe", "cus_1", "follow_up"), 0);
    kit.advance(Duration::from_secs(24 * 3600)).unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_done("stripe", "cus_1").await.unwrap();
    assert_eq!(kit.runs_of("stripe", "cus_1", "follow_up"), 1);
}

// ---------------------------------------------------------------------------
// Handlers the kit has never seen: a step that re-does an earlier step's
// call, a transactional step that writes through a second connection on
// SQLite, and an end state read from what `setup` made for its own run.

/// Where the hold steps post (the ledger, in these tests).
#[derive(Debug, Clone)]
struct HoldsUrl(String);

/// POSTs `path` on the holds service with `key`; the answer's status, its
/// `Idempotent-Replayed` header and its JSON body.
async fn post_hold_service(
    ctx: &StepContext<'_>,
    path: &str,
    key: &str,
) -> Result<(bool, serde_json::Value), StepError> {
    let url = ctx.resource::<HoldsUrl>()?.0.clone();
    let request = axum::http::Request::post(format!("{url}{path}"))
        .header("idempotency-key", key)
        .body(Body::from(ctx.event().id.clone()))
        .map_err(StepError::terminal)?;
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .map_err(StepError::retryable)?;
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(StepError::retryable)?
        .to_bytes();
    let body = serde_json::from_slice(&body).map_err(StepError::retryable)?;
    Ok((replayed, body))
}

/// Places a hold with its own key (right), but on a replayed answer
/// reports nothing ("done already"): its output then lacks the hold.
#[derive(Debug, Serialize, Deserialize)]
struct PlaceHold;

#[typetag::serde(name = "kit_place_hold")]
#[async_trait::async_trait]
impl Step for PlaceHold {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let key = ctx.idempotency_key().to_owned();
        let (replayed, body) = post_hold_service(ctx, "/holds", &key).await?;
        if replayed {
            return Ok(json!({}));
        }
        Ok(json!({ "hold": body["id"] }))
    }
}

/// Confirms the hold; when the hold step's output has none, places the
/// hold again itself (with a key made from the hold step's), so the
/// service applies a second hold.
#[derive(Debug, Serialize, Deserialize)]
struct ConfirmHold;

#[typetag::serde(name = "kit_confirm_hold")]
#[async_trait::async_trait]
impl Step for ConfirmHold {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let event = ctx.event();
        let hold_key = tickmark::idempotency_key(&event.source, &event.id, "place_hold");
        let hold = match ctx.output("place_hold").map(|output| &output["hold"]) {
            Some(hold) if !hold.is_null() => hold.clone(),
            _ => {
                let again = format!("{hold_key}-again");
                post_hold_service(ctx, "/holds", &again).await?.1["id"].clone()
            }
        };
        let key = ctx.idempotency_key().to_owned();
        post_hold_service(ctx, "/confirmations", &key).await?;
        Ok(json!({ "confirmed": hold }))
    }
}

fn holds() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.placed",
        Handler::new()
            .named_step("place_hold", PlaceHold)
            .named_step("confirm_hold", ConfirmHold),
    )
}

#[tokio::test]
async fn a_step_that_re_does_an_earlier_steps_call_is_blamed_not_the_earlier_step() {
    let error = CrashTest::new(
        NewEvent::with_id("shop", "ord_1", "order.placed", json!({})),
        || async {
            let ledger = EffectLedger::start().await?;
            let kit = TestEngine::sqlite(holds())
                .await?
                .with_resource(HoldsUrl(ledger.url()))
                .with_ledger(&ledger);
            Ok((kit, ledger))
        },
        // The end state: the effects this run's own ledger applied, by path.
        |(_kit, ledger): (TestEngine, EffectLedger)| async move {
            let mut paths: Vec<String> = ledger.effects().into_iter().map(|c| c.path).collect();
            paths.sort();
            Ok::<_, BoxError>(paths)
        },
    )
    .within(WITHIN)
    .run()
    .await
    .expect_err("the hold is placed twice after place_hold's crash");
    let message = error.to_string();
    eprintln!("the kit says:\n{message}");
    let TestError::NotIdempotent(findings) = &error else {
        panic!("{message}");
    };
    let blamed: Vec<&str> = findings.findings.iter().map(|f| f.step.as_str()).collect();
    assert_eq!(blamed, ["confirm_hold"], "{message}");
    assert!(
        message.contains("step `confirm_hold` (after step `place_hold`'s crash after its effect, before its mark)"),
        "{message}"
    );
    assert!(
        message.contains("it sent POST /holds once more than in the clean run"),
        "{message}"
    );
    assert!(
        message.contains("do not re-do step `place_hold`'s call"),
        "{message}"
    );
    assert!(message.contains("ctx.output(\"place_hold\")"), "{message}");
    assert!(
        message.contains("step `place_hold`'s stored output was {} after the crash"),
        "{message}"
    );
    assert!(
        !message.contains("make the step transactional"),
        "{message}"
    );
}

/// The application's own SQLite pool on the test database, as an app that
/// had its pool before tickmark keeps it: waits half a second for a lock.
#[derive(Debug, Clone)]
struct OrdersPool(sqlx::SqlitePool);

/// Broken: transactional, but saves the order through the app's own pool:
/// on SQLite that connection waits for the write lock the step's own
/// transaction holds, until its busy timeout, and fails.
#[derive(Debug, Serialize, Deserialize)]
struct SaveOrderThroughTheAppsPool;

#[typetag::serde(name = "kit_save_order_through_the_apps_pool")]
#[async_trait::async_trait]
impl Step for SaveOrderThroughTheAppsPool {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let pool = ctx.resource::<OrdersPool>()?.0.clone();
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(ctx.event().id.clone())
            .execute(&pool)
            .await
            .map_err(StepError::retryable)?;
        Ok(json!({}))
    }
}

#[tokio::test]
async fn a_transactional_step_writing_through_a_second_sqlite_connection_is_told_of_the_lock() {
    use std::str::FromStr;
    let error = CrashTest::new(
        NewEvent::with_id("shop", "ord_2", "order.placed", json!({})),
        || async {
            let handlers = Handlers::new().on(
                "shop",
                "order.placed",
                Handler::new().named_step("save_order", SaveOrderThroughTheAppsPool),
            );
            let kit = TestEngine::sqlite(handlers).await?;
            kit.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                .await?;
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(kit.database_url())?
                .busy_timeout(Duration::from_millis(500));
            let pool = sqlx::SqlitePool::connect_with(options).await?;
            Ok(kit.with_resource(OrdersPool(pool)))
        },
        |kit: TestEngine| async move {
            let mut transaction = kit.engine().transaction().await?;
            let (orders,): (i64,) = transaction
                .query("SELECT count(*) FROM orders")
                .fetch_one()
                .await?;
            Ok::<_, BoxError>(orders)
        },
    )
    .within(WITHIN)
    .run()
    .await
    .expect_err("the step never gets the lock its own transaction holds");
    let message = error.to_string();
    eprintln!("the kit says:\n{message}");
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(
        message.contains("step `save_order` (one clean run)"),
        "{message}"
    );
    assert!(message.contains("database is locked"), "{message}");
    assert!(
        message.contains("write through ctx.transaction(), the step's own transaction"),
        "{message}"
    );
    assert!(!message.contains("debounce"), "{message}");
}

/// Where the invoices are written (a resource).
#[derive(Debug, Clone)]
struct InvoiceDir(std::path::PathBuf);

/// Writes the event's invoice file, under a name of its own: a re-run
/// writes the same file again.
#[derive(Debug, Serialize, Deserialize)]
struct WriteInvoice;

#[typetag::serde(name = "kit_write_invoice")]
#[async_trait::async_trait]
impl Step for WriteInvoice {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let dir = ctx.resource::<InvoiceDir>()?.0.clone();
        let file = dir.join(format!("{}.txt", ctx.event().id));
        tokio::fs::write(&file, b"paid")
            .await
            .map_err(StepError::retryable)?;
        Ok(json!({ "file": file.display().to_string() }))
    }
}

#[tokio::test]
async fn end_state_reads_what_its_own_runs_setup_made() {
    let report = CrashTest::new(
        invoice("in_9"),
        || async {
            let dir = tempfile::tempdir()?;
            let handlers = Handlers::new().on(
                "stripe",
                "invoice.paid",
                Handler::new()
                    .named_step("write_invoice", WriteInvoice)
                    .named_step("post_notice", PostNotice { with_key: true }),
            );
            let ledger = EffectLedger::start().await?;
            let kit = TestEngine::sqlite(handlers)
                .await?
                .with_resource(InvoiceDir(dir.path().to_owned()))
                .with_resource(NoticeUrl(ledger.url()))
                .with_ledger(&ledger);
            Ok((kit, (dir, ledger)))
        },
        |(_kit, (dir, ledger)): (TestEngine, (tempfile::TempDir, EffectLedger))| async move {
            let files = std::fs::read_dir(dir.path())?.count();
            Ok::<_, BoxError>((files, ledger.effects().len()))
        },
    )
    .within(WITHIN)
    .run()
    .await
    .expect("a file under a fixed name and a keyed notice are idempotent");
    assert_eq!(report.end_state, "(1, 1)");
    assert_eq!(report.runs.len(), 3);
}

/// Broken: transactional, but saves the order in a transaction of the
/// engine's own (a second connection), which on SQLite waits for the
/// write lock the step's transaction holds, for 30 s.
#[derive(Debug, Serialize, Deserialize)]
struct SaveOrderInAnotherTransaction;

#[typetag::serde(name = "kit_save_order_in_another_transaction")]
#[async_trait::async_trait]
impl Step for SaveOrderInAnotherTransaction {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let engine = ctx.resource::<tickmark::Engine>()?.clone();
        let mut transaction = engine.transaction().await.map_err(StepError::retryable)?;
        transaction
            .query("INSERT INTO orders (id) VALUES ($1)")
            .bind(ctx.event().id.clone())
            .execute()
            .await?;
        transaction.commit().await.map_err(StepError::retryable)?;
        Ok(json!({}))
    }
}

/// The engine's busy timeout (30 s) outlasts the run (10 s): the step is
/// still waiting when the time runs out, and is told why it may be.
#[tokio::test]
async fn a_transactional_step_still_waiting_on_sqlite_at_the_deadline_is_told_of_the_lock() {
    let error = CrashTest::new(
        NewEvent::with_id("shop", "ord_3", "order.placed", json!({})),
        || async {
            let handlers = Handlers::new().on(
                "shop",
                "order.placed",
                Handler::new().named_step("save_order", SaveOrderInAnotherTransaction),
            );
            let kit = TestEngine::sqlite(handlers).await?;
            kit.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                .await?;
            Ok(kit.clone().with_resource(kit.engine().clone()))
        },
        |_kit: TestEngine| async move { Ok::<_, BoxError>(()) },
    )
    .within(Duration::from_secs(10))
    .run()
    .await
    .expect_err("the step waits for the lock its own transaction holds");
    let message = error.to_string();
    eprintln!("the kit says:\n{message}");
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(
        message.contains("step `save_order` (one clean run)"),
        "{message}"
    );
    assert!(
        message.contains("it did not return within 10.0 s"),
        "{message}"
    );
    assert!(
        message.contains("write through ctx.transaction(), the step's own transaction"),
        "{message}"
    );
}
