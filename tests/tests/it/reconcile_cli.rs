//! `tickmark reconcile` as a real process against the loopback fake of
//! Stripe's events API: a dry run of the generic binary, its refusal to
//! record without handlers, a recording run of an operator binary that
//! links its handlers (`tickmark::cli::main_with`), `--status`, progress on
//! stderr, and exit 4 while another process holds the lease.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tickmark::Backend;
use tickmark_tests::stripe_api::FakeStripe;
use tickmark_tests::TestDb;

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }
}

async fn run(binary: PathBuf, db: &TestDb, fake: &FakeStripe, args: &[&str]) -> Run {
    run_on(binary, &db.url, fake, args).await
}

async fn run_on(binary: PathBuf, url: &str, fake: &FakeStripe, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(binary)
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env("STRIPE_API_KEY", fake.api_key())
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run the binary");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn generic() -> PathBuf {
    tickmark_tests::cargo_bin("tickmark", "tickmark")
}

fn payments_admin() -> PathBuf {
    tickmark_tests::cargo_bin("tickmark-examples", "payments-admin")
}

async fn fake_with_events(n: usize) -> FakeStripe {
    let fake = FakeStripe::start().await;
    for i in 0..n {
        fake.create_event(
            "invoice.payment_succeeded",
            json!({ "id": format!("in_{i}"), "customer": "cus_1", "amount_paid": 100 }),
        );
    }
    fake
}

/// The generic binary: a dry run counts, `--json` is the summary, nothing
/// is written; without `--dry-run` it refuses (exit 2) and says what to do.
#[tokio::test]
async fn the_generic_binary_dry_runs_and_refuses_to_record_without_handlers() {
    let db = TestDb::sqlite().await;
    let fake = fake_with_events(3).await;
    let base = fake.base_url();
    let dry = run(
        generic(),
        &db,
        &fake,
        &[
            "--json",
            "reconcile",
            "--source",
            "stripe",
            "--since",
            "3d",
            "--dry-run",
            "--api-base",
            &base,
        ],
    )
    .await;
    assert_eq!(dry.code, 0, "{dry:?}");
    let summary = dry.json();
    assert_eq!(summary["seen"], 3, "{summary}");
    assert_eq!(summary["recorded"], 3, "{summary}");
    assert_eq!(summary["dry_run"], true, "{summary}");
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        0
    );

    let refused = run(
        generic(),
        &db,
        &fake,
        &["reconcile", "--source", "stripe", "--api-base", &base],
    )
    .await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("main_with"), "{refused:?}");
    assert!(refused.stderr.contains("--dry-run"), "{refused:?}");
}

/// The payments app's operator binary records what Stripe has and the
/// inbox lacks, shows progress on stderr, and `--status` shows the cursor.
#[tokio::test]
async fn an_operator_binary_with_handlers_records_and_shows_status() {
    let db = TestDb::sqlite().await;
    let fake = fake_with_events(4).await;
    let base = fake.base_url();
    let recorded = run(
        payments_admin(),
        &db,
        &fake,
        &[
            "reconcile",
            "--source",
            "stripe",
            "--since",
            "1d",
            "--api-base",
            &base,
            "--progress",
        ],
    )
    .await;
    assert_eq!(recorded.code, 0, "{recorded:?}");
    assert!(
        recorded
            .stdout
            .contains("stripe (stripe): seen 4, already had 0, recorded 4, failed 0"),
        "{recorded:?}"
    );
    assert!(
        recorded.stderr.contains("stripe: page 1: seen 4"),
        "progress: {recorded:?}"
    );
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        4
    );

    let again = run(
        payments_admin(),
        &db,
        &fake,
        &[
            "--json",
            "reconcile",
            "--source",
            "stripe",
            "--api-base",
            &base,
        ],
    )
    .await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.json()["seen"], 0, "from the cursor: nothing newer");

    let status = run(
        payments_admin(),
        &db,
        &fake,
        &["--json", "reconcile", "--status"],
    )
    .await;
    assert_eq!(status.code, 0, "{status:?}");
    let rows = status.json();
    assert_eq!(rows[0]["source"], "stripe", "{rows}");
    assert!(
        rows[0]["cursor"]
            .as_str()
            .is_some_and(|c| c.starts_with("evt_")),
        "{rows}"
    );
    assert_eq!(rows[0]["last_summary"]["seen"], 0, "{rows}");
}

/// While another process holds the source's lease, a run is refused with
/// exit 4 and the fake sees no request.
#[tokio::test]
async fn a_run_while_another_holds_the_lease_exits_4() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let fake = fake_with_events(2).await;
    let held = db
        .store
        .reconcile_lease_take("stripe", "elsewhere", Duration::from_secs(300))
        .await
        .unwrap();
    assert!(held.is_some());
    let refused = run(
        payments_admin(),
        &db,
        &fake,
        &[
            "reconcile",
            "--source",
            "stripe",
            "--api-base",
            &fake.base_url(),
        ],
    )
    .await;
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("another process is reconciling `stripe`"),
        "{refused:?}"
    );
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
}

/// A missing Shopify subscription, as the last reconcile run found it, is
/// warned of by `tickmark status` and `tickmark reconcile --status`.
#[tokio::test]
async fn status_warns_of_a_subscription_shopify_removed() {
    let db = TestDb::sqlite().await;
    let fake = fake_with_events(0).await;
    let lease = db
        .store
        .reconcile_lease_take("shopify", "a-test", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("a free source");
    let summary = json!({
        "source": "shopify", "provider": "shopify", "dry_run": false, "seen": 2,
        "already_had": 1, "recorded": 0, "redelivered": 0, "failed": 0, "not_handled": 0,
        "complete": true, "notes": [],
        "missing_subscriptions": [
            { "topic": "orders/create", "callback_url": "https://hooks.example.test/hooks/shopify" }
        ]
    });
    db.store
        .reconcile_lease_release(&lease, Some(&summary.to_string()))
        .await
        .unwrap();
    let status = run(generic(), &db, &fake, &["status"]).await;
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status.stdout.contains(
            "warning: shopify: the provider has no webhook subscription for orders/create to https://hooks.example.test/hooks/shopify"
        ),
        "{status:?}"
    );
    let listed = run(generic(), &db, &fake, &["reconcile", "--status"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(
        listed.stdout.contains("missing subscriptions 1"),
        "{listed:?}"
    );
    assert!(
        listed
            .stdout
            .contains("warning: shopify: Shopify has no subscription for orders/create"),
        "{listed:?}"
    );
}

/// `reconcile --status` and `--dry-run` only read: on a database without
/// tickmark's schema (an empty SQLite file, a new PostgreSQL schema) or with
/// an older one, they create nothing, no table and no `tickmark_migrations`
/// row, and refuse (exit 4) saying to migrate first.
#[tokio::test]
async fn read_only_reconcile_commands_leave_an_unmigrated_database_as_it_is() {
    let fake = fake_with_events(1).await;
    let base = fake.base_url();
    let commands: [&[&str]; 2] = [
        &["reconcile", "--status"],
        &[
            "reconcile",
            "--source",
            "stripe",
            "--dry-run",
            "--api-base",
            &base,
        ],
    ];
    let refused = |out: &Run| {
        assert_eq!(out.code, 4, "{out:?}");
        assert!(out.stderr.contains("only reads"), "{out:?}");
        assert!(out.stderr.contains("tickmark migrate"), "{out:?}");
    };

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::File::create(&path).unwrap();
    let url = format!("sqlite://{}", path.display());
    for args in commands {
        refused(&run_on(generic(), &url, &fake, args).await);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "the file is untouched after {args:?}"
        );
    }

    // An older schema: the newest migration not applied yet (its history
    // row removed, as a database an older tickmark migrated has it).
    let db = TestDb::sqlite().await;
    let newest = db
        .probe
        .scalar("SELECT max(version) FROM tickmark_migrations")
        .await;
    db.probe
        .execute(&format!(
            "DELETE FROM tickmark_migrations WHERE version = {newest}"
        ))
        .await;
    for args in commands {
        let out = run(generic(), &db, &fake, args).await;
        refused(&out);
        assert!(
            out.stderr.contains(&format!("up to {}", newest - 1)),
            "{out:?}"
        );
        assert_eq!(
            db.probe
                .scalar(&format!(
                    "SELECT count(*) FROM tickmark_migrations WHERE version = {newest}"
                ))
                .await,
            0,
            "the newest migration is not applied by {args:?}"
        );
    }

    let Some(schema) = tickmark_tests::db::EmptySchema::new().await else {
        return;
    };
    for args in commands {
        refused(&run_on(generic(), &schema.url, &fake, args).await);
    }
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&schema.url)
        .await
        .unwrap();
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(tables, 0, "no table made, tickmark_migrations included");
}
