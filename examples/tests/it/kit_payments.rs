//! The `payments` example's real handlers under the test kit
//! (`tickmark::testing`), as a user of tickmark would test them: its steps,
//! its resources ([`Settings`], [`ReceiptClient`]) and its own tables
//! ([`payments::open`]), with the receipt URL pointed at an
//! [`EffectLedger`]. A crash at every step boundary, ten copies at once and
//! one late, and every non-transactional step run twice all end with the
//! balance credited once, one receipt applied and one invoice file.
//!
//! Only the PostgreSQL URL (and its recorded skip) comes from
//! `tickmark_tests`, as for the other tests of this crate.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tempfile::TempDir;
use tickmark::testing::{BoxError, Crash, CrashReport, CrashTest, EffectLedger, TestEngine};
use tickmark::{Backend, NewEvent};
use tickmark_examples::payments::{
    self, invoice_file_name, AppDatabase, ReceiptClient, Settings, INVOICE_PAID,
};

/// How long one run of the handler may take.
const WITHIN: Duration = Duration::from_secs(30);

/// The customer the invoices are paid by.
const CUSTOMER: &str = "cus_ada";

/// What one invoice pays.
const AMOUNT: i64 = 1200;

/// A Stripe `invoice.payment_succeeded` as the receiver records it: the
/// event id is Stripe's, the payload the whole body.
fn invoice_paid(event_id: &str) -> NewEvent {
    let (source, kind) = INVOICE_PAID;
    NewEvent::with_id(
        source,
        event_id,
        kind,
        json!({
            "id": event_id,
            "object": "event",
            "type": kind,
            "data": {"object": {
                "id": format!("in_{event_id}"),
                "object": "invoice",
                "customer": CUSTOMER,
                "amount_paid": AMOUNT,
                "currency": "usd"
            }}
        }),
    )
}

/// One test engine's surroundings: the receipt service, the app's own
/// tables, the folder the invoices are rendered into.
#[derive(Clone)]
struct App {
    ledger: EffectLedger,
    database: AppDatabase,
    out: Arc<TempDir>,
}

/// The payments handlers on a fresh database of `backend`, set up as the
/// `payments` binary sets itself up: its tables created by
/// [`payments::open`], its settings and client as resources, receipts
/// POSTed to a fresh ledger.
async fn payments_kit(backend: Backend) -> Result<(TestEngine, App), BoxError> {
    let kit = match backend {
        Backend::Sqlite => TestEngine::sqlite(payments::handlers()).await?,
        Backend::Postgres => {
            let url = tickmark_tests::db::postgres_url().ok_or("PostgreSQL skipped")?;
            TestEngine::postgres(&url, payments::handlers()).await?
        }
    };
    let (_store, database) = payments::open(kit.database_url()).await?;
    let ledger = EffectLedger::start().await?;
    let out = Arc::new(tempfile::tempdir()?);
    let settings = Settings {
        receipt_url: Some(format!("{}/receipts", ledger.url()).parse()?),
        out_dir: out.path().to_path_buf(),
        ..Settings::default()
    };
    let kit = kit
        .with_resource(settings)
        .with_resource(ReceiptClient::new())
        .with_ledger(&ledger);
    Ok((
        kit,
        App {
            ledger,
            database,
            out,
        },
    ))
}

/// What the app ended with: the customer's balance, the receipts the
/// service applied, and the invoice file's lines (less `received at`,
/// which is each run's own time).
type EndState = (Option<i64>, usize, Vec<String>);

async fn end_state(app: &App, event_id: &str) -> Result<EndState, BoxError> {
    let balance = app.database.balance(CUSTOMER).await?;
    let receipts = app.ledger.effects().len();
    let path = app.out.path().join(invoice_file_name(event_id));
    let invoice = std::fs::read_to_string(&path)
        .map(|text| {
            text.lines()
                .filter(|line| !line.starts_with("received at:"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok((balance, receipts, invoice))
}

/// The end state of one paid invoice, credited once, receipted once.
fn expected(event_id: &str) -> EndState {
    let invoice = [
        "INVOICE".to_owned(),
        format!("event:        {event_id}"),
        format!("invoice:      in_{event_id}"),
        format!("customer:     {CUSTOMER}"),
        format!("amount paid:  {AMOUNT} usd"),
        format!("balance now:  {AMOUNT}"),
        "receipt:      sent".to_owned(),
        format!("rendered by:  stripe:{event_id}:render_invoice"),
    ];
    (Some(AMOUNT), 1, invoice.to_vec())
}

async fn crash_test(backend: Backend, event_id: &'static str) -> CrashReport {
    // Each run's surroundings (the context), for the end-state query of
    // the same run.
    CrashTest::new(
        invoice_paid(event_id),
        move || payments_kit(backend),
        move |(_kit, app): (TestEngine, App)| async move { end_state(&app, event_id).await },
    )
    .within(WITHIN)
    .run()
    .await
    .unwrap_or_else(|error| panic!("the payments handler is idempotent: {error}"))
}

/// Every boundary of the three steps, each crashed at.
fn every_boundary() -> Vec<(String, Crash, bool)> {
    [
        ("credit_account", Crash::BeforeMark),
        ("credit_account", Crash::AfterMark),
        ("send_receipt", Crash::BeforeMark),
        ("send_receipt", Crash::AfterMark),
        ("render_invoice", Crash::BeforeMark),
    ]
    .into_iter()
    .map(|(step, crash)| (step.to_owned(), crash, true))
    .collect()
}

fn assert_crash_report(report: &CrashReport, event_id: &str) {
    assert_eq!(
        report.steps,
        vec![
            ("credit_account".to_owned(), true),
            ("send_receipt".to_owned(), false),
            ("render_invoice".to_owned(), false),
        ]
    );
    assert_eq!(report.runs, every_boundary());
    assert_eq!(report.end_state, format!("{:?}", expected(event_id)));
}

#[tokio::test]
async fn payments_survives_a_crash_at_every_step_boundary_on_sqlite() {
    let report = crash_test(Backend::Sqlite, "evt_kit_crash_lite").await;
    assert_crash_report(&report, "evt_kit_crash_lite");
}

#[tokio::test]
async fn payments_survives_a_crash_at_every_step_boundary_on_postgres() {
    if tickmark_tests::db::postgres_url().is_none() {
        return; // recorded as skipped by postgres_url()
    }
    let report = crash_test(Backend::Postgres, "evt_kit_crash_pg").await;
    assert_crash_report(&report, "evt_kit_crash_pg");
}

#[tokio::test]
async fn ten_copies_at_once_and_one_late_credit_and_receipt_once() {
    let (kit, app) = payments_kit(Backend::Sqlite).await.unwrap();
    let event_id = "evt_kit_copies";
    let deliveries = kit
        .deliver_like_a_provider(invoice_paid(event_id), 10, WITHIN)
        .await
        .unwrap();
    assert_eq!((deliveries.new, deliveries.duplicates), (1, 10));
    for step in ["credit_account", "send_receipt", "render_invoice"] {
        assert_eq!(kit.runs_of("stripe", event_id, step), 1, "{step}");
    }
    assert_eq!(end_state(&app, event_id).await.unwrap(), expected(event_id));
    let receipt = &app.ledger.effects()[0];
    assert_eq!(receipt.path, "/receipts");
    assert_eq!(
        receipt.idempotency_key.as_deref(),
        Some("stripe:evt_kit_copies:send_receipt")
    );
    kit.check_ledger().unwrap();
}

#[tokio::test]
async fn every_non_transactional_step_run_twice_leaves_one_receipt_and_one_invoice() {
    let (kit, app) = payments_kit(Backend::Sqlite).await.unwrap();
    let kit = kit.always_replay(true);
    let event_id = "evt_kit_replay";
    kit.deliver(invoice_paid(event_id)).await.unwrap();
    let report = kit.run_until_idle_within(WITHIN).await.unwrap();
    kit.assert_done("stripe", event_id).await.unwrap();
    // send_receipt and render_invoice are each stopped once after their
    // effect; credit_account is transactional and runs once.
    assert_eq!(report.crashes, 2);
    assert_eq!(kit.runs_of("stripe", event_id, "credit_account"), 1);
    assert_eq!(kit.runs_of("stripe", event_id, "send_receipt"), 2);
    assert_eq!(kit.runs_of("stripe", event_id, "render_invoice"), 2);
    // Two receipt calls with one key: the second one was replayed.
    let calls = app.ledger.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].replayed, "{calls:?}");
    assert_eq!(calls[0].idempotency_key, calls[1].idempotency_key);
    assert_eq!(end_state(&app, event_id).await.unwrap(), expected(event_id));
    kit.check_ledger().unwrap();
}
