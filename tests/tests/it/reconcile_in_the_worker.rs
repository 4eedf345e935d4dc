//! The scheduled reconciler, beside the worker: the payments example app
//! (a receiver and a worker in one process) started with `STRIPE_API_KEY`
//! pulls what Stripe has and its receiver never got, every
//! `--reconcile-every`, and its worker runs each event once. Two such
//! processes on one PostgreSQL database share one lease: every event is
//! recorded and run once.

use std::time::Duration;

use serde_json::json;
use tickmark::Backend;
use tickmark_tests::stripe_api::FakeStripe;
use tickmark_tests::TestDb;
use tokio::process::{Child, Command};

async fn start_payments(db: &TestDb, fake: &FakeStripe, dir: &std::path::Path) -> Child {
    let mut child = Command::new(tickmark_tests::cargo_bin("tickmark-examples", "payments"))
        .current_dir(dir)
        .args(["--database-url", &db.url, "--listen", "127.0.0.1:0"])
        .args([
            "--reconcile-every",
            "0.2",
            "--stripe-api-base",
            &fake.base_url(),
        ])
        .env("STRIPE_API_KEY", fake.api_key())
        .env("STRIPE_WEBHOOK_SECRET", "whsec_unused_here")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "info,sqlx=warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the payments binary");
    let mut lines = tickmark_tests::announced::stdout_lines(&mut child);
    tickmark_tests::announced::line_starting_with(&mut lines, "payments: listening on")
        .await
        .expect("payments starts");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// Two payments processes, each with its scheduled reconciler, on one
/// database: the events Stripe has are each recorded once and each credit
/// their customer once (the app's `accounts` table).
#[tokio::test]
async fn two_app_processes_reconcile_each_event_once() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeStripe::start().await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(fake.create_event(
            "invoice.payment_succeeded",
            json!({ "id": format!("in_{n}"), "customer": "cus_reconciled", "amount_paid": 100, "currency": "usd" }),
        ));
    }
    let first = start_payments(&db, &fake, dir.path()).await;
    let second = start_payments(&db, &fake, dir.path()).await;
    // Events that arrive at Stripe while the processes run are found too.
    for n in 6..9 {
        ids.push(fake.create_event(
            "invoice.payment_succeeded",
            json!({ "id": format!("in_{n}"), "customer": "cus_reconciled", "amount_paid": 100, "currency": "usd" }),
        ));
    }
    tickmark_tests::wait::until("every event credited", Duration::from_secs(60), || {
        let probe = db.probe.clone();
        async move {
            probe
                .scalar("SELECT count(*) FROM tickmark_steps WHERE name = 'credit_account' AND state = 'done'")
                .await
                == 9
        }
    })
    .await;
    let balance = db
        .probe
        .scalar("SELECT balance FROM accounts WHERE customer = 'cus_reconciled'")
        .await;
    assert_eq!(balance, 900, "each of the 9 invoices credited once");
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE source = 'stripe'")
            .await,
        9
    );
    let rows = db.store.reconcile_cursors().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].cursor.as_deref(), ids.last().map(String::as_str));
    drop((first, second));
}
