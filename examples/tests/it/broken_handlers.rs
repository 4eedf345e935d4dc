//! Four handlers broken as real ones are, each written here as a user
//! writes a step, each caught by the test kit (`tickmark::testing`) with a
//! message that names the step and the fix; and beside each, the same step
//! fixed, which the kit passes. So the kit tells them apart.
//!
//! | broken | caught as | fix named |
//! |---|---|---|
//! | a counter bumped in a non-transactional step | the end state differs after its crash before the mark | make the step transactional |
//! | a receipt POSTed without an `Idempotency-Key` | a double effect without a key | pass ctx.idempotency_key() |
//! | a receipt POSTed with a random key per run | keys that disagree | use ctx.idempotency_key() |
//! | a transactional step writing through the app's own pool (PostgreSQL) | its effect survived the rollback | write through ctx.transaction() |
//! | the same on SQLite | its write waited for the step's own lock ("database is locked") | write through ctx.transaction() |
//!
//! Only the PostgreSQL URL (and its recorded skip) comes from
//! `tickmark_tests`, as for the other tests of this crate.

use std::time::Duration;

use axum::body::Body;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::testing::{
    BoxError, CrashReport, CrashTest, EffectLedger, LedgerViolation, TestEngine, TestError,
};
use tickmark::{Backend, Handler, Handlers, NewEvent, Step, StepContext, StepError, StepResult};

/// How long one run of a handler may take.
const WITHIN: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The steps.

/// The application's own connection pool on the engine's database, as an
/// app that had its pool before it had tickmark keeps it.
#[derive(Debug, Clone)]
enum AppPool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl AppPool {
    async fn connect(kit: &TestEngine) -> Result<Self, sqlx::Error> {
        Ok(match kit.backend() {
            Backend::Sqlite => Self::Sqlite(sqlx::SqlitePool::connect(kit.database_url()).await?),
            Backend::Postgres => Self::Postgres(sqlx::PgPool::connect(kit.database_url()).await?),
        })
    }

    /// `UPDATE visits SET n = n + 1`, committed on its own.
    async fn count_visit(&self) -> Result<(), sqlx::Error> {
        const SQL: &str = "UPDATE visits SET n = n + 1";
        match self {
            Self::Sqlite(pool) => sqlx::query(SQL).execute(pool).await.map(|_| ()),
            Self::Postgres(pool) => sqlx::query(SQL).execute(pool).await.map(|_| ()),
        }
    }
}

/// BROKEN (a): counts the visit through the app's own pool, in a step that
/// is not transactional: a crash after the count, before the step's mark,
/// runs it again and counts twice.
#[derive(Debug, Serialize, Deserialize)]
struct CountVisitOutside;

#[typetag::serde(name = "broken.count_visit_outside")]
#[async_trait::async_trait]
impl Step for CountVisitOutside {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let pool = ctx.resource::<AppPool>()?;
        pool.count_visit().await.map_err(StepError::retryable)?;
        Ok(json!({ "counted": true }))
    }
}

/// BROKEN (d): transactional, but counts through the app's own pool, which
/// commits on its own: the crash rolls back the step's transaction, not
/// the count.
#[derive(Debug, Serialize, Deserialize)]
struct CountVisitBesideTheTransaction;

#[typetag::serde(name = "broken.count_visit_beside_the_transaction")]
#[async_trait::async_trait]
impl Step for CountVisitBesideTheTransaction {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let pool = ctx.resource::<AppPool>()?;
        pool.count_visit().await.map_err(StepError::retryable)?;
        Ok(json!({ "counted": true }))
    }
}

/// FIXED (a) and (d): transactional, and counts in the step's transaction,
/// which commits with the step's mark or not at all.
#[derive(Debug, Serialize, Deserialize)]
struct CountVisit;

#[typetag::serde(name = "broken.count_visit_fixed")]
#[async_trait::async_trait]
impl Step for CountVisit {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        ctx.transaction()?
            .query("UPDATE visits SET n = n + 1")
            .execute()
            .await?;
        Ok(json!({ "counted": true }))
    }
}

/// Where receipts are POSTed (the ledger, here).
#[derive(Debug, Clone)]
struct ReceiptUrl(String);

/// Which `Idempotency-Key` a receipt goes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum ReceiptKey {
    /// BROKEN (b): none.
    Without,
    /// BROKEN (c): a new random one on every run.
    Random,
    /// FIXED: the step's own, the same on every run.
    Steps,
}

/// POSTs a receipt for the event, with `key`.
#[derive(Debug, Serialize, Deserialize)]
struct SendReceipt {
    key: ReceiptKey,
}

#[typetag::serde(name = "broken.send_receipt")]
#[async_trait::async_trait]
impl Step for SendReceipt {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let url = ctx.resource::<ReceiptUrl>()?.0.clone();
        let mut request = axum::http::Request::post(format!("{url}/receipts"))
            .header("content-type", "application/json");
        match self.key {
            ReceiptKey::Without => {}
            ReceiptKey::Random => {
                let key = format!("rcpt_{:016x}", rand::random::<u64>());
                request = request.header("idempotency-key", key);
            }
            ReceiptKey::Steps => request = request.header("idempotency-key", ctx.idempotency_key()),
        }
        let body = json!({ "charge": ctx.event().id }).to_string();
        let request = request
            .body(Body::from(body))
            .map_err(StepError::terminal)?;
        let client: Client<HttpConnector, Body> =
            Client::builder(TokioExecutor::new()).build_http();
        let response = client
            .request(request)
            .await
            .map_err(StepError::retryable)?;
        if !response.status().is_success() {
            return Err(StepError::retryable(format!(
                "the receipt service answered {}",
                response.status()
            )));
        }
        Ok(json!({ "sent": true }))
    }
}

// ---------------------------------------------------------------------------
// The tests' set-ups.

fn visit() -> NewEvent {
    NewEvent::with_id("shop", "visit_1", "visit", json!({}))
}

fn charge() -> NewEvent {
    NewEvent::with_id(
        "stripe",
        "ch_1",
        "charge.succeeded",
        json!({ "amount": 500 }),
    )
}

/// `step` as the one step `count_visit` of `shop`/`visit`, crashed at every
/// boundary on `backend`; the end state is the counter.
async fn counter_crash_test<S>(backend: Backend, step: fn() -> S) -> Result<CrashReport, TestError>
where
    S: Step + 'static,
{
    let handlers = move || {
        Handlers::new().on(
            "shop",
            "visit",
            Handler::new().named_step("count_visit", step()),
        )
    };
    CrashTest::new(
        visit(),
        move || async move {
            let kit = match backend {
                Backend::Sqlite => TestEngine::sqlite(handlers()).await?,
                Backend::Postgres => {
                    let url = tickmark_tests::db::postgres_url().ok_or("PostgreSQL skipped")?;
                    TestEngine::postgres(&url, handlers()).await?
                }
            };
            kit.execute("CREATE TABLE visits (n BIGINT NOT NULL)")
                .await?;
            kit.execute("INSERT INTO visits VALUES (0)").await?;
            let pool = AppPool::connect(&kit).await?;
            Ok(kit.with_resource(pool))
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
}

async fn receipt_kit(key: ReceiptKey) -> Result<(TestEngine, EffectLedger), BoxError> {
    let handlers = Handlers::new().on(
        "stripe",
        "charge.succeeded",
        Handler::new().named_step("send_receipt", SendReceipt { key }),
    );
    let ledger = EffectLedger::start().await?;
    let kit = TestEngine::sqlite(handlers)
        .await?
        .with_resource(ReceiptUrl(ledger.url()))
        .with_ledger(&ledger);
    Ok((kit, ledger))
}

/// `send_receipt` with `key`, crashed at every boundary; the end state is
/// the receipts the service applied.
async fn receipt_crash_test(key: ReceiptKey) -> Result<CrashReport, TestError> {
    CrashTest::new(
        charge(),
        move || receipt_kit(key),
        |(_kit, ledger): (TestEngine, EffectLedger)| async move {
            Ok::<_, BoxError>(ledger.effects().len())
        },
    )
    .within(WITHIN)
    .run()
    .await
}

/// The message of a kit failure, shown in the test's output (so it can be
/// read as a user reads it).
fn message_of(error: &TestError) -> String {
    let message = error.to_string();
    eprintln!("the kit says:\n{message}");
    message
}

// ---------------------------------------------------------------------------
// (a) A counter outside any transaction.

#[tokio::test]
async fn a_a_counter_in_a_non_transactional_step_is_counted_twice_at_its_crash() {
    let error = counter_crash_test(Backend::Sqlite, || CountVisitOutside)
        .await
        .expect_err("a non-transactional counter is not idempotent");
    let message = message_of(&error);
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(message.contains("step `count_visit`"), "{message}");
    assert!(
        message.contains("(a crash after its effect, before its mark)"),
        "{message}"
    );
    assert!(message.contains("it is not transactional"), "{message}");
    assert!(message.contains("the end state is 2, not 1"), "{message}");
    assert!(message.contains("make the step transactional"), "{message}");

    let report = counter_crash_test(Backend::Sqlite, || CountVisit)
        .await
        .expect("counted in the step's transaction, the counter is idempotent");
    assert_eq!(report.end_state, "1");
    assert_eq!(report.steps, vec![("count_visit".to_owned(), true)]);
    assert!(report.runs.iter().all(|(_, _, crashed)| *crashed));
}

// ---------------------------------------------------------------------------
// (b) A receipt without its key.

#[tokio::test]
async fn b_a_receipt_without_the_idempotency_key_is_a_double_effect() {
    let error = receipt_crash_test(ReceiptKey::Without)
        .await
        .expect_err("a receipt without a key is sent twice");
    let message = message_of(&error);
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(message.contains("step `send_receipt`"), "{message}");
    assert!(
        message.contains("sent POST /receipts 2 times as a new request, at least once without an Idempotency-Key"),
        "{message}"
    );
    assert!(message.contains("pass ctx.idempotency_key()"), "{message}");
    // One finding, the ledger's: not the general fix for a write.
    assert!(
        !message.contains("make the step transactional"),
        "{message}"
    );

    // The ledger's own verdict, run twice by always_replay.
    let (kit, ledger) = receipt_kit(ReceiptKey::Without).await.unwrap();
    let kit = kit.always_replay(true);
    kit.deliver(charge()).await.unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    assert_eq!(ledger.effects().len(), 2);
    let violations = ledger.check().expect_err("a double effect");
    assert!(
        matches!(
            &violations[..],
            [LedgerViolation::DoubleEffectWithoutKey { step, times: 2, .. }] if step == "send_receipt"
        ),
        "{violations:?}"
    );

    let report = receipt_crash_test(ReceiptKey::Steps)
        .await
        .expect("a receipt with the step's key is sent once");
    assert_eq!(report.end_state, "1");
}

// ---------------------------------------------------------------------------
// (c) A receipt with a random key per run.

#[tokio::test]
async fn c_a_random_idempotency_key_per_run_is_keys_that_disagree() {
    let error = receipt_crash_test(ReceiptKey::Random)
        .await
        .expect_err("a random key is a new request on every run");
    let message = message_of(&error);
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(message.contains("step `send_receipt`"), "{message}");
    assert!(
        message.contains("sent POST /receipts with 2 different Idempotency-Keys (rcpt_"),
        "{message}"
    );
    assert!(message.contains("use ctx.idempotency_key()"), "{message}");
    assert!(
        !message.contains("make the step transactional"),
        "{message}"
    );

    let (kit, ledger) = receipt_kit(ReceiptKey::Random).await.unwrap();
    let kit = kit.always_replay(true);
    kit.deliver(charge()).await.unwrap();
    kit.run_until_idle_within(WITHIN).await.unwrap();
    let violations = ledger.check().expect_err("keys that disagree");
    assert!(
        matches!(
            &violations[..],
            [LedgerViolation::KeysDisagree { step, keys, .. }] if step == "send_receipt" && keys.len() == 2
        ),
        "{violations:?}"
    );

    receipt_crash_test(ReceiptKey::Steps)
        .await
        .expect("a receipt with the step's key is sent once");
}

// ---------------------------------------------------------------------------
// (d) A transactional step writing beside its transaction.

/// On PostgreSQL the write commits beside the step's transaction and
/// survives its rollback. (On SQLite it cannot: see the test after this.)
#[tokio::test]
async fn d_a_transactional_step_writing_through_the_apps_own_pool_survives_the_rollback() {
    if tickmark_tests::db::postgres_url().is_none() {
        return; // recorded as skipped by postgres_url()
    }
    let error = counter_crash_test(Backend::Postgres, || CountVisitBesideTheTransaction)
        .await
        .expect_err("a write beside the step's transaction is not rolled back");
    let message = message_of(&error);
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(message.contains("step `count_visit`"), "{message}");
    assert!(
        message.contains("it is transactional, but its effect survived the rollback"),
        "{message}"
    );
    assert!(message.contains("the end state is 2, not 1"), "{message}");
    assert!(
        message.contains("write through ctx.transaction()"),
        "{message}"
    );

    let report = counter_crash_test(Backend::Postgres, || CountVisit)
        .await
        .expect("counted in the step's transaction, the counter is idempotent");
    assert_eq!(report.end_state, "1");
}

/// On SQLite the step's open transaction holds the file's write lock, so
/// the app's second pool waits on it until its busy timeout (sqlx's 5 s)
/// and fails: the kit says so and names the fix, not a debounce window.
#[tokio::test]
async fn d_on_sqlite_a_transactional_step_writing_through_the_apps_own_pool_waits_for_its_own_lock()
{
    let error = counter_crash_test(Backend::Sqlite, || CountVisitBesideTheTransaction)
        .await
        .expect_err("the app's pool waits for the step's own lock");
    let message = message_of(&error);
    assert!(matches!(error, TestError::NotIdempotent(_)), "{message}");
    assert!(
        message.contains("step `count_visit` (one clean run)"),
        "{message}"
    );
    assert!(message.contains("database is locked"), "{message}");
    assert!(
        message.contains("write through ctx.transaction(), the step's own transaction"),
        "{message}"
    );
    assert!(!message.contains("debounce"), "{message}");

    let report = counter_crash_test(Backend::Sqlite, || CountVisit)
        .await
        .expect("counted in the step's transaction, the counter is idempotent");
    assert_eq!(report.end_state, "1");
}
