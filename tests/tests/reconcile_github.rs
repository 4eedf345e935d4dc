//! Reconciling GitHub and checking Shopify (docs/reconcile.md), against the
//! loopback fakes of GitHub's delivery log (tests/src/github_api, checked
//! with octokit) and Shopify's `webhookSubscriptions` (tests/src/shopify_api):
//! failed deliveries are redelivered by GitHub through the receiver and run
//! once; or, configured so, their payloads are fetched and recorded while the
//! receiver is down; the log is paged by its `Link` header from the cursor;
//! a Shopify subscription Shopify removed is reported in the summary, the
//! metric and the dashboard.

mod reconcile_support;

use std::time::Duration;

use reconcile_support::*;
use serde_json::json;
use tickmark::reconcile::{
    GitHubApi, GitHubHook, GitHubRecovery, NoProgress, ReconcileSummary, RunRequest, ShopifyApi,
};
use tickmark::{Backend, Engine, Handler, Handlers};
use tickmark_tests::conformance::engine;
use tickmark_tests::github_api::{FakeGitHub, HookRef};
use tickmark_tests::http_client::{oneshot, Outgoing};
use tickmark_tests::shopify_api::FakeShopify;
use tickmark_tests::test_steps::Record;
use tickmark_tests::TestDb;
use tokio_util::sync::CancellationToken;

fn api(fake: &FakeGitHub, hook_id: u64, recovery: GitHubRecovery, page: u32) -> GitHubApi {
    GitHubApi::new(
        fake.token(),
        GitHubHook::Repository {
            owner: "acme".into(),
            repo: "shop".into(),
            hook_id,
        },
    )
    .with_base_url(&fake.base_url())
    .expect("the fake's URL")
    .with_recovery(recovery)
    .with_page_size(page)
}

async fn run(reconciler: &tickmark::reconcile::Reconciler, source: &str) -> ReconcileSummary {
    reconciler
        .run(
            source,
            &RunRequest::default(),
            &NoProgress,
            &CancellationToken::new(),
        )
        .await
        .expect("a run")
}

fn issue(n: usize) -> serde_json::Value {
    json!({ "action": "opened", "issue": { "number": n } })
}

/// Deliveries the receiver answered 503 are redelivered by GitHub (same
/// GUID) and run once; those it took, and kinds no handler takes, are left
/// alone; the next run, from the cursor, finds the redeliveries delivered.
#[tokio::test]
async fn failed_deliveries_are_redelivered_through_the_receiver_and_run_once() {
    let Some((db, engine)) = test_engine(Backend::Postgres).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);

    receiver.set_down(true);
    let mut missed = Vec::new();
    for n in 0..5 {
        let sent = fake.send(hook.clone(), GITHUB_KIND, issue(n)).await;
        assert_eq!(sent.status_code, 503, "{sent:?}");
        missed.push(sent.guid);
    }
    fake.send(hook.clone(), "push", json!({ "ref": "refs/heads/main" }))
        .await;
    receiver.set_down(false);
    let mut taken = Vec::new();
    for n in 5..7 {
        let sent = fake.send(hook.clone(), GITHUB_KIND, issue(n)).await;
        assert_eq!(sent.status_code, 200, "{sent:?}");
        taken.push(sent.guid);
    }

    let clock_fake = fake.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .github("github", api(&fake, hook_id, GitHubRecovery::Redeliver, 3));
    let summary = run(&reconciler, "github").await;
    assert_eq!(
        (
            summary.seen,
            summary.already_had,
            summary.redelivered,
            summary.not_handled,
            summary.failed
        ),
        (7, 2, 5, 1, 0),
        "{summary:?}"
    );
    // 8 deliveries in pages of 3, following the Link header.
    let lists = fake
        .requests()
        .iter()
        .filter(|request| request.method == "GET" && request.path.ends_with("/deliveries"))
        .count();
    assert_eq!(lists, 3, "{:#?}", fake.requests());
    fake.wait_idle().await;
    let redelivered: Vec<_> = fake
        .deliveries(hook.clone())
        .into_iter()
        .filter(|delivery| delivery.redelivery)
        .collect();
    assert_eq!(redelivered.len(), 5);
    assert!(redelivered
        .iter()
        .all(|d| d.status_code == 200 && missed.contains(&d.guid)));

    drain(&engine).await;
    for guid in missed.iter().chain(&taken) {
        assert_eq!(runs(&db, guid).await, 1, "{guid} ran once");
    }
    let again = run(&reconciler, "github").await;
    assert_eq!(
        (again.seen, again.already_had, again.redelivered),
        (5, 5, 0),
        "the redeliveries, newer than the cursor, are delivered: {again:?}"
    );
}

/// While the receiver is down, a reconciler configured to fetch payloads
/// records the missed events itself; GitHub's redelivery of one later is a
/// duplicate. Each runs once.
#[tokio::test]
async fn payloads_are_fetched_and_recorded_while_the_receiver_is_down() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    receiver.set_down(true);
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);
    let mut missed = Vec::new();
    for n in 0..4 {
        missed.push(fake.send(hook.clone(), GITHUB_KIND, issue(n)).await);
    }
    let clock_fake = fake.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .github(
            "github",
            api(&fake, hook_id, GitHubRecovery::FetchPayload, 100),
        );
    let summary = run(&reconciler, "github").await;
    assert_eq!((summary.seen, summary.recorded), (4, 4), "{summary:?}");
    let record = db.record_of("github", &missed[0].guid).await;
    assert_eq!(record.event.kind, GITHUB_KIND);
    assert_eq!(
        record.event.payload["issue"]["number"], 0,
        "the delivery's own payload"
    );

    // Back up: GitHub's redelivery of the first is a duplicate.
    receiver.set_down(false);
    // And so is the second's signed body pushed under a new delivery id (a
    // replay): the fetched event has the replay key its pushed copy has.
    let body = serde_json::to_vec(&issue(1)).expect("JSON");
    let replayed = tickmark_tests::http_client::HttpClient::new()
        .send(
            receiver.server.addr,
            &Outgoing::post("/hooks/github", body.clone())
                .header("content-type", "application/json")
                .header("x-github-delivery", "a-guid-github-never-sent")
                .header("x-github-event", GITHUB_KIND)
                .header(
                    "x-hub-signature-256",
                    tickmark_tests::github_api::sender::signature_256(GITHUB_SECRET, &body),
                ),
        )
        .await
        .expect("the receiver answers");
    assert_eq!(
        (replayed.status, replayed.json()["status"].as_str()),
        (200, Some("duplicate")),
        "{:?}",
        replayed.json()
    );
    let redelivered = tickmark_tests::http_client::HttpClient::new()
        .send(
            fake.addr(),
            &tickmark_tests::http_client::Outgoing::post(
                format!(
                    "/repos/acme/shop/hooks/{hook_id}/deliveries/{}/attempts",
                    missed[0].id
                ),
                Vec::new(),
            )
            .header("authorization", format!("Bearer {}", fake.token())),
        )
        .await
        .expect("the fake answers");
    assert_eq!(redelivered.status, 202);
    fake.wait_idle().await;
    drain(&engine).await;
    for sent in &missed {
        assert_eq!(runs(&db, &sent.guid).await, 1, "{} ran once", sent.guid);
    }
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        4
    );
}

/// An engine whose handlers take two Shopify topics.
fn shopify_engine(db: &TestDb) -> Engine {
    let handlers = Handlers::new()
        .on(
            "shopify",
            "orders/create",
            Handler::new().named_step(STEP, Record::default()),
        )
        .on(
            "shopify",
            "app/uninstalled",
            Handler::new().named_step(STEP, Record::default()),
        );
    engine(db, handlers)
}

/// A subscription Shopify removed is found by the check, and warned of in
/// the summary, `/metrics` and the dashboard; re-created, the warning goes.
#[tokio::test]
async fn a_subscription_shopify_removed_is_reported_in_the_summary_metric_and_dashboard() {
    let db = TestDb::sqlite().await;
    let engine = shopify_engine(&db);
    let fake = FakeShopify::start().await;
    let callback = "https://hooks.example.test/hooks/shopify";
    fake.add_subscription("ORDERS_CREATE", callback);
    let uninstalled = fake.add_subscription("APP_UNINSTALLED", callback);
    fake.add_subscription("PRODUCTS_UPDATE", "https://elsewhere.example.test/x");
    assert!(
        fake.remove_subscription(uninstalled),
        "as Shopify does after failed deliveries"
    );

    let shopify = ShopifyApi::new(&fake.base_url(), fake.token(), callback).expect("shop");
    let reconciler = reconciler(&engine, "solo").shopify("shopify", shopify.clone());
    let summary = run(&reconciler, "shopify").await;
    assert_eq!(summary.missing_subscriptions.len(), 1, "{summary:?}");
    assert_eq!(summary.missing_subscriptions[0].topic, "app/uninstalled");
    assert_eq!((summary.seen, summary.already_had), (2, 1), "{summary:?}");

    let metrics = tickmark::metrics::render(engine.metrics(), db.store.as_ref())
        .await
        .expect("metrics");
    assert!(
        metrics.contains("tickmark_webhook_subscriptions_missing{source=\"shopify\"} 1"),
        "{metrics}"
    );
    let dashboard = dashboard_overview(&engine).await;
    assert!(dashboard.contains("Subscription missing"), "{dashboard}");
    assert!(dashboard.contains("app/uninstalled"), "{dashboard}");
    assert!(dashboard.contains("<h2>Reconciliation</h2>"), "{dashboard}");
    assert!(
        dashboard.contains("seen 2, already had 1"),
        "the last run's counts: {dashboard}"
    );

    fake.add_subscription("APP_UNINSTALLED", callback);
    let fixed = run(&reconciler, "shopify").await;
    assert!(fixed.missing_subscriptions.is_empty(), "{fixed:?}");
    let metrics = tickmark::metrics::render(engine.metrics(), db.store.as_ref())
        .await
        .expect("metrics");
    assert!(
        metrics.contains("tickmark_webhook_subscriptions_missing{source=\"shopify\"} 0"),
        "{metrics}"
    );
    assert!(!dashboard_overview(&engine)
        .await
        .contains("Subscription missing"));
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

/// An organisation's hook and the App's hook are read at their own paths,
/// and GitHub's rate limits (a secondary limit's 403 with `Retry-After`, a
/// primary limit used up until `x-ratelimit-reset`) are waited out.
#[tokio::test]
async fn organisation_and_app_hooks_are_reconciled_through_rate_limits() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let org_hook = fake.add_org_hook("acme", &receiver.url("github"), GITHUB_SECRET);
    fake.set_app_hook(&receiver.url("github"), GITHUB_SECRET);
    receiver.set_down(true);
    let org_missed = fake
        .send(HookRef::org("acme", org_hook), GITHUB_KIND, issue(1))
        .await;
    let app_missed = fake.send(HookRef::App, GITHUB_KIND, issue(2)).await;
    receiver.set_down(false);

    let hook_api = |hook: GitHubHook| {
        GitHubApi::new(fake.token(), hook)
            .with_base_url(&fake.base_url())
            .expect("the fake's URL")
    };
    let clock_fake = fake.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_client_settings(tickmark::reconcile::ClientSettings {
            attempts: 3,
            ..quick_client()
        })
        .expect("settings")
        .with_clock(clock_of(move || clock_fake.now()))
        .github(
            "github",
            hook_api(GitHubHook::Organization {
                org: "acme".into(),
                hook_id: org_hook,
            }),
        )
        .github("github-app", hook_api(GitHubHook::App));
    fake.secondary_rate_limit_next(1, Duration::from_secs(1));
    let org = run(&reconciler, "github").await;
    assert_eq!(org.redelivered, 1, "{org:?}");
    fake.primary_rate_limit_next(1, Duration::from_secs(1));
    // The App's deliveries are another source's here: the receiver takes
    // them as `github`, so the handlers' kinds are given by hand.
    let app = reconciler
        .run(
            "github-app",
            &RunRequest {
                kinds: Some(vec![GITHUB_KIND.to_owned()]),
                ..RunRequest::default()
            },
            &NoProgress,
            &CancellationToken::new(),
        )
        .await
        .expect("the App's run");
    assert_eq!(app.redelivered, 1, "{app:?}");
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 403).count(),
        2,
        "{statuses:?}"
    );
    fake.wait_idle().await;
    drain(&engine).await;
    for guid in [&org_missed.guid, &app_missed.guid] {
        assert_eq!(runs(&db, guid).await, 1, "{guid} ran once");
    }
}
