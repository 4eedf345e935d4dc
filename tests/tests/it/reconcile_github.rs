//! Reconciling GitHub and checking Shopify (docs/reconcile.md), against the
//! loopback fakes of GitHub's delivery log (tests/src/github_api, checked
//! with octokit) and Shopify's `webhookSubscriptions` (tests/src/shopify_api):
//! failed deliveries are redelivered by GitHub through the receiver and run
//! once; or, configured so, their payloads are fetched and recorded while the
//! receiver is down; the log is paged by its `Link` header from the cursor;
//! a Shopify subscription Shopify removed is reported in the summary, the
//! metric and the dashboard.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::reconcile_support::*;
use serde_json::json;
use tickmark::reconcile::{
    GitHubApi, GitHubHook, GitHubRecovery, NoProgress, ReconcileSummary, RunLimits, RunRequest,
    ShopifyApi,
};
use tickmark::{Backend, Engine, Handler, Handlers};
use tickmark_reconcile::TokenSource;
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
    // 8 deliveries in pages of 3, following the Link header down (3), then
    // back up oldest first (1: the oldest and newest pages are held, not
    // read again).
    let lists = fake
        .requests()
        .iter()
        .filter(|request| request.method == "GET" && request.path.ends_with("/deliveries"))
        .count();
    assert_eq!(lists, 4, "{:#?}", fake.requests());
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
    // The margin behind the cursor (CURSOR_OVERLAP) reads the first run's
    // deliveries again: every event is had, none redelivered.
    let again = run(&reconciler, "github").await;
    assert_eq!(
        (again.seen, again.already_had, again.redelivered),
        (7, 7, 0),
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

    let metrics = tickmark_core::metrics::render(engine.metrics(), db.store.as_ref())
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
    let metrics = tickmark_core::metrics::render(engine.metrics(), db.store.as_ref())
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

// --- Issue 41: the cursor never passes what a run did not read, and a
// broken or hostile API cannot keep a run going.

fn github_reconciler(
    engine: &Engine,
    fake: &FakeGitHub,
    hook_id: u64,
    page: u32,
) -> tickmark::reconcile::Reconciler {
    let clock_fake = fake.clone();
    reconciler(engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .github(
            "github",
            api(fake, hook_id, GitHubRecovery::Redeliver, page),
        )
}

/// `n` deliveries of `GITHUB_KIND` the receiver answers 503, oldest first
/// (issues 100 and on: bodies no other delivery of a test has).
async fn missed(
    fake: &FakeGitHub,
    receiver: &SwitchedReceiver,
    hook: &HookRef,
    n: usize,
) -> Vec<tickmark_tests::github_api::SentDelivery> {
    receiver.set_down(true);
    let mut sent = Vec::new();
    for k in 0..n {
        sent.push(fake.send(hook.clone(), GITHUB_KIND, issue(100 + k)).await);
    }
    receiver.set_down(false);
    sent
}

async fn each_ran_once<'a>(
    db: &TestDb,
    engine: &Engine,
    fake: &FakeGitHub,
    guids: impl IntoIterator<Item = &'a String>,
) {
    fake.wait_idle().await;
    drain(engine).await;
    for guid in guids {
        assert_eq!(runs(db, guid).await, 1, "{guid} ran once");
    }
}

/// GitHub lists a delivery when its attempt ends (it waits up to 10 s for
/// a receiver), so one can appear after a newer one a run already read; the
/// cursor stopped the next run before it. Runs now read a margin behind the
/// cursor, and find it.
#[tokio::test]
async fn a_delivery_listed_after_a_newer_one_is_still_recovered() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);
    let reconciler = github_reconciler(&engine, &fake, hook_id, 100);
    let early = fake.send(hook.clone(), GITHUB_KIND, issue(0)).await;
    run(&reconciler, "github").await;

    let slow = fake.begin_send(hook.clone(), GITHUB_KIND, issue(1));
    let newer = missed(&fake, &receiver, &hook, 1).await.remove(0);
    assert!(slow.id() < newer.id);
    let first = run(&reconciler, "github").await;
    assert_eq!(first.redelivered, 1, "{first:?}");
    fake.wait_idle().await;
    receiver.set_down(true);
    let late = slow.finish().await;
    receiver.set_down(false);
    assert_eq!(late.status_code, 503, "{late:?}");

    let second = run(&reconciler, "github").await;
    assert_eq!(second.redelivered, 1, "the late one: {second:?}");
    each_ran_once(&db, &engine, &fake, [&early.guid, &newer.guid, &late.guid]).await;
}

/// An empty page with a `next` link ended the run "complete" and moved the
/// cursor past the older deliveries it never read; now it is `NoProgress`,
/// the cursor stays, and the next run recovers every one.
#[tokio::test]
async fn an_empty_page_with_a_next_link_ends_the_run() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);
    let sent = missed(&fake, &receiver, &hook, 6).await;
    let reconciler = github_reconciler(&engine, &fake, hook_id, 3);
    let link = format!(
        "<{}{}?per_page=3&cursor=v1_{}>; rel=\"next\"",
        fake.base_url(),
        hook.deliveries_path(),
        sent[2].id
    );
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || {
        stuck_fake.answer_next_with(1, json!([]), Some(link.clone()))
    });
    ends_without_progress(&reconciler, "github", &RunRequest::default(), &progress).await;
    let healthy = run(&reconciler, "github").await;
    assert!(healthy.complete, "{healthy:?}");
    each_ran_once(&db, &engine, &fake, sent.iter().map(|s| &s.guid)).await;
}

/// The same page again and again with a `next` link: `NoProgress` on the
/// first repeat.
#[tokio::test]
async fn a_page_that_repeats_ends_the_run() {
    let Some((_db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);
    let sent = missed(&fake, &receiver, &hook, 6).await;
    let newest: Vec<serde_json::Value> = fake
        .deliveries(hook.clone())
        .iter()
        .take(3)
        .map(|delivery| delivery.item_json())
        .collect();
    let link = format!(
        "<{}{}?per_page=3&cursor=v1_{}>; rel=\"next\"",
        fake.base_url(),
        hook.deliveries_path(),
        sent[2].id
    );
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || {
        stuck_fake.answer_next_with(100, json!(newest), Some(link.clone()))
    });
    let reconciler = github_reconciler(&engine, &fake, hook_id, 3);
    ends_without_progress(&reconciler, "github", &RunRequest::default(), &progress).await;
    let lists = fake
        .requests()
        .iter()
        .filter(|request| request.method == "GET" && request.path.ends_with("/deliveries"))
        .count();
    assert_eq!(lists, 2, "stopped at the first repeat");
}

/// At its page cap a run ends cleanly with the cursor at the last page it
/// handled (oldest first); the next run continues, and every missed
/// delivery is recovered once.
#[tokio::test]
async fn a_run_at_its_page_cap_ends_cleanly_and_the_next_continues() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);
    let sent = missed(&fake, &receiver, &hook, 7).await;
    let reconciler = github_reconciler(&engine, &fake, hook_id, 3).with_run_limits(RunLimits {
        max_pages: 2,
        ..RunLimits::default()
    });
    let capped = run(&reconciler, "github").await;
    assert!(!capped.complete, "{capped:?}");
    assert_eq!(capped.redelivered, 4, "the two oldest pages: {capped:?}");
    let cursor = db.store.reconcile_cursors().await.unwrap()[0]
        .cursor
        .clone();
    assert_eq!(cursor, Some(sent[3].id.to_string()));
    fake.wait_idle().await;
    let next = run(&reconciler, "github").await;
    assert_eq!(next.redelivered, 3, "{next:?}");
    each_ran_once(&db, &engine, &fake, sent.iter().map(|s| &s.guid)).await;
}

/// A run that panics (here its token source, once) ended the scheduled
/// reconciler's task for good, silently; the loop now logs it and runs
/// again next round.
#[tokio::test]
async fn the_scheduled_reconciler_runs_again_after_a_run_panicked() {
    let Some((_db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", "http://127.0.0.1:9/hooks", GITHUB_SECRET);
    let calls = Arc::new(AtomicUsize::new(0));
    let token = fake.token();
    let source: TokenSource = Arc::new(move || {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a token source that panics once (on purpose)");
        }
        Ok(token.clone())
    });
    let clock_fake = fake.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .github(
            "github",
            api(&fake, hook_id, GitHubRecovery::Redeliver, 100).with_token_source(source),
        );
    let shutdown = CancellationToken::new();
    let handle = reconciler.spawn_every(Duration::from_millis(100), shutdown.clone());
    tickmark_tests::wait::until(
        "a scheduled run after the one that panicked",
        Duration::from_secs(60),
        || {
            let fake = fake.clone();
            async move { !fake.requests().is_empty() }
        },
    )
    .await;
    assert!(!handle.is_finished(), "the loop lives on");
    shutdown.cancel();
    handle
        .await
        .expect("the loop ends at shutdown, not by a panic");
}

/// One source whose API keeps the run waiting (a 60 s `Retry-After`) held
/// every other source back; its run is now cut at its time cap (1 s here)
/// and the scheduled loop moves on to the next source.
#[tokio::test]
async fn a_stuck_source_does_not_starve_the_others() {
    let Some((_db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let stuck = FakeGitHub::start().await;
    let healthy = FakeGitHub::start().await;
    let stuck_hook = stuck.add_repo_hook("acme", "shop", "http://127.0.0.1:9/hooks", GITHUB_SECRET);
    let healthy_hook =
        healthy.add_repo_hook("acme", "shop", "http://127.0.0.1:9/hooks", GITHUB_SECRET);
    stuck.rate_limit_next(1, Duration::from_secs(60));
    let clock_fake = healthy.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .with_run_limits(RunLimits {
            max_duration: Duration::from_secs(1),
            ..RunLimits::default()
        })
        .github(
            "github-stuck",
            api(&stuck, stuck_hook, GitHubRecovery::Redeliver, 100),
        )
        .github(
            "github",
            api(&healthy, healthy_hook, GitHubRecovery::Redeliver, 100),
        );
    let shutdown = CancellationToken::new();
    let handle = reconciler.spawn_every(Duration::from_secs(3600), shutdown.clone());
    // Well within the stuck source's 60 s, well past its 1 s cap.
    tickmark_tests::wait::until(
        "the healthy source reconciled",
        Duration::from_secs(30),
        || {
            let healthy = healthy.clone();
            async move { !healthy.requests().is_empty() }
        },
    )
    .await;
    shutdown.cancel();
    handle.await.expect("the loop");
}

/// Fetched payloads are recorded oldest first across the log's pages, read
/// page by page back up from the oldest.
#[tokio::test]
async fn fetched_payloads_are_recorded_oldest_first_across_pages() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeGitHub::start().await;
    let hook_id = fake.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
    let hook = HookRef::repo("acme", "shop", hook_id);
    let sent = missed(&fake, &receiver, &hook, 8).await;
    let clock_fake = fake.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .github(
            "github",
            api(&fake, hook_id, GitHubRecovery::FetchPayload, 3),
        );
    let summary = run(&reconciler, "github").await;
    assert_eq!(summary.recorded, 8, "{summary:?}");
    let mut rows = Vec::new();
    for delivery in &sent {
        rows.push(
            db.probe
                .scalar(&format!(
                    "SELECT id FROM tickmark_events WHERE dedup_key = '{}'",
                    delivery.guid
                ))
                .await,
        );
    }
    assert!(
        rows.windows(2).all(|pair| pair[0] < pair[1]),
        "recorded in the order they were sent: {rows:?}"
    );
}
