//! What a reconcile run refuses, and how a failed run shows, against the
//! loopback fake of Stripe's API (tests/src/stripe_api), which serves each
//! event's `livemode` and `account` and `GET /v1/account`:
//!
//! - a failed scheduled run (`Reconciler::spawn_every`) is stored with the
//!   source's cursor and shown by `tickmark status`, the dashboard and
//!   `/metrics`, and the next scheduled run still runs;
//! - a key of the other mode, or of another account, is refused before any
//!   of its events is recorded, whether the run starts from a cursor (which
//!   that account does not know) or reads a window;
//! - with `StripeApi::for_account`, another account's key is refused before
//!   any event is read; a Connect event of another account is refused.

use std::time::Duration;

use crate::reconcile_support::*;
use serde_json::json;
use tickmark::reconcile::{
    NoProgress, ReconcileError, ReconcileSummary, Reconciler, RunRequest, StripeApi,
};
use tickmark::{Backend, Engine};
use tickmark_tests::http_client::{oneshot, Outgoing};
use tickmark_tests::stripe_api::{FakeAccount, FakeStripe};
use tickmark_tests::TestDb;
use tokio_util::sync::CancellationToken;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn api(fake: &FakeStripe) -> StripeApi {
    StripeApi::new(fake.api_key())
        .with_base_url(&fake.base_url())
        .expect("the fake's URL")
        .with_first_lookback(7 * DAY)
        .with_page_size(10)
}

fn invoice(n: usize) -> serde_json::Value {
    json!({ "id": format!("in_{n}"), "object": "invoice", "amount_paid": 100 + n })
}

/// A reconciler of `engine` for source `stripe` through `api`, on `fake`'s clock.
fn stripe_reconciler(engine: &Engine, fake: &FakeStripe, api: StripeApi) -> Reconciler {
    let clock_fake = fake.clone();
    reconciler(engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .stripe("stripe", api)
}

async fn run(
    reconciler: &Reconciler,
    request: &RunRequest,
) -> Result<ReconcileSummary, ReconcileError> {
    reconciler
        .run("stripe", request, &NoProgress, &CancellationToken::new())
        .await
}

/// The source's last stored run, if any.
async fn last_summary(db: &TestDb) -> Option<ReconcileSummary> {
    let rows = db.store.reconcile_cursors().await.expect("the cursors");
    let row = rows.into_iter().find(|row| row.source == "stripe")?;
    serde_json::from_str(row.last_summary.as_deref()?).ok()
}

async fn events(db: &TestDb) -> i64 {
    db.probe
        .scalar("SELECT count(*) FROM tickmark_events")
        .await
}

/// The dashboard's overview page, as an operator's script reads it.
async fn dashboard_overview(engine: &Engine) -> String {
    const TOKEN: &str = "reconcile-test-dashboard-token-0123456789";
    let router = tickmark::dashboard::Dashboard::new(engine.clone())
        .token(TOKEN)
        .router();
    let reply = oneshot(
        &router,
        &Outgoing::get("/").header("authorization", format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(reply.status, 200);
    String::from_utf8_lossy(&reply.body).into_owned()
}

/// `tickmark status --json`, the generic binary on `db`.
async fn status_json(db: &TestDb) -> serde_json::Value {
    let output = tokio::process::Command::new(tickmark_tests::cargo_bin("tickmark", "tickmark"))
        .args(["--database-url", &db.url, "--json", "status"])
        .output()
        .await
        .expect("run tickmark status");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("one JSON document")
}

/// Stripe answers 503 to everything: each scheduled run fails, and the
/// failure is stored with the cursor (the summary's `error`, its time the
/// run's end) and shown by `tickmark status`, the dashboard and `/metrics`.
/// Stripe healthy again, a later scheduled run records the events and the
/// failure is gone from the gauge.
#[tokio::test]
async fn a_failed_scheduled_run_is_shown_and_the_next_run_still_runs() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    for n in 0..2 {
        fake.create_event(STRIPE_KIND, invoice(n));
    }
    fake.fail_next(100_000, 503);
    let shutdown = CancellationToken::new();
    let scheduled = stripe_reconciler(&engine, &fake, api(&fake))
        .spawn_every(Duration::from_millis(20), shutdown.clone());

    tickmark_tests::wait::until("a failed run stored", Duration::from_secs(60), || {
        let db = &db;
        async move { last_summary(db).await.is_some_and(|s| s.error.is_some()) }
    })
    .await;
    let failed = last_summary(&db).await.expect("a stored run");
    let error = failed.error.clone().expect("its error");
    assert!(error.contains("503"), "{failed:?}");

    let metrics = tickmark_core::metrics::render(engine.metrics(), db.store.as_ref())
        .await
        .expect("metrics");
    assert!(
        metrics.contains("tickmark_reconcile_last_run_failed{source=\"stripe\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("tickmark_reconcile_runs_failed_total{source=\"stripe\"}")),
        "{metrics}"
    );
    let dashboard = dashboard_overview(&engine).await;
    assert!(dashboard.contains("Reconcile run failed"), "{dashboard}");
    assert!(dashboard.contains("503"), "{dashboard}");
    let status = status_json(&db).await;
    let failures = status["reconcile_failures"].as_array().expect("a list");
    assert_eq!(failures.len(), 1, "{status}");
    assert_eq!(failures[0]["source"], "stripe", "{status}");
    assert!(
        failures[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{status}"
    );
    assert!(failures[0]["at"].is_string(), "its time: {status}");
    assert_eq!(events(&db).await, 0);

    fake.heal();
    tickmark_tests::wait::until(
        "a later scheduled run records both events",
        Duration::from_secs(60),
        || {
            let db = &db;
            async move {
                events(db).await == 2 && last_summary(db).await.is_some_and(|s| s.error.is_none())
            }
        },
    )
    .await;
    shutdown.cancel();
    scheduled.await.expect("the schedule ends on shutdown");
    let metrics = tickmark_core::metrics::render(engine.metrics(), db.store.as_ref())
        .await
        .expect("metrics");
    assert!(
        metrics.contains("tickmark_reconcile_last_run_failed{source=\"stripe\"} 0"),
        "{metrics}"
    );
    let status = status_json(&db).await;
    assert_eq!(status["reconcile_failures"], json!([]), "{status}");
}

/// A live source reconciled with its live key; then the key of a test-mode
/// account (`sk_test_…`): from the cursor (which that account does not
/// know, though it is days old, not 30) and over a window, the run is
/// refused with what to fix, and none of the test-mode events is recorded;
/// the cursor stays.
#[tokio::test]
async fn a_key_of_the_other_mode_records_nothing() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let live = FakeStripe::start_as(FakeAccount {
        api_key: "sk_live_fake_51LiveAccountKey0000".to_owned(),
        id: "acct_1LiveAccount".to_owned(),
        livemode: true,
    })
    .await;
    for n in 0..2 {
        live.create_event(STRIPE_KIND, invoice(n));
    }
    let summary = run(
        &stripe_reconciler(&engine, &live, api(&live)),
        &RunRequest::default(),
    )
    .await
    .expect("the live key's run");
    assert_eq!(summary.recorded, 2, "{summary:?}");
    let cursor = db.store.reconcile_cursors().await.unwrap()[0]
        .cursor
        .clone();

    let sandbox = FakeStripe::start().await;
    sandbox.set_now(live.now());
    for n in 10..13 {
        sandbox.create_event(STRIPE_KIND, invoice(n));
    }
    let wrong = stripe_reconciler(&engine, &sandbox, api(&sandbox));
    let from_cursor = run(&wrong, &RunRequest::default())
        .await
        .expect_err("refused");
    assert!(
        matches!(from_cursor, ReconcileError::ForeignAccount { .. }),
        "{from_cursor}"
    );
    let said = from_cursor.to_string();
    assert!(said.contains("does not know the cursor's event"), "{said}");
    assert!(said.contains("--from-scratch"), "{said}");
    let window = RunRequest {
        since: Some(3 * DAY),
        ..RunRequest::default()
    };
    let over_window = run(&wrong, &window).await.expect_err("refused");
    let said = over_window.to_string();
    assert!(
        said.contains("a test-mode event") && said.contains("the source's events are live-mode"),
        "{said}"
    );
    assert!(said.contains("sk_live_"), "what to give instead: {said}");
    let dry = run(
        &wrong,
        &RunRequest {
            dry_run: true,
            ..window.clone()
        },
    )
    .await
    .expect_err("a dry run is refused too");
    assert!(
        matches!(dry, ReconcileError::ForeignAccount { .. }),
        "{dry}"
    );

    assert_eq!(events(&db).await, 2, "no test-mode event recorded");
    assert_eq!(
        db.store.reconcile_cursors().await.unwrap()[0].cursor,
        cursor,
        "the cursor stays"
    );
    let stored = last_summary(&db).await.expect("the refused run is stored");
    assert!(
        stored
            .error
            .is_some_and(|e| e.contains("another account or mode")),
        "the refusal is what `tickmark status` shows"
    );
}

/// `StripeApi::for_account`: another account's key is refused before any
/// event is read (`GET /v1/account` only); the account's own key reads. A
/// configured mode is held to on a first run, with an empty inbox. A
/// Connect event of another account is refused, not recorded.
#[tokio::test]
async fn a_configured_account_and_mode_are_held_to() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    fake.create_event(STRIPE_KIND, invoice(0));

    let other = api(&fake).for_account("acct_1SomeoneElse");
    let refused = run(
        &stripe_reconciler(&engine, &fake, other),
        &RunRequest::default(),
    )
    .await
    .expect_err("refused");
    assert!(
        refused.to_string().contains("acct_1FakeTestAccount"),
        "{refused}"
    );
    let paths: Vec<String> = fake.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/account"], "no event read");

    let live_only = api(&fake).livemode(true);
    let refused = run(
        &stripe_reconciler(&engine, &fake, live_only),
        &RunRequest::default(),
    )
    .await
    .expect_err("refused");
    assert!(refused.to_string().contains("as configured"), "{refused}");
    assert_eq!(events(&db).await, 0);

    let own = api(&fake)
        .for_account("acct_1FakeTestAccount")
        .livemode(false);
    let reconciler = stripe_reconciler(&engine, &fake, own);
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("its own account's key reads");
    assert_eq!(summary.recorded, 1, "{summary:?}");

    let connect = fake.create_connect_event(STRIPE_KIND, invoice(1), "acct_1Connected");
    let refused = run(&reconciler, &RunRequest::default())
        .await
        .expect_err("refused");
    assert!(refused.to_string().contains("acct_1Connected"), "{refused}");
    let recorded = db
        .store
        .event_find("stripe", &connect)
        .await
        .expect("the inbox");
    assert!(recorded.is_none(), "the Connect event is not recorded");
}
