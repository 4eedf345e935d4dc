//! Reconciling Stripe (docs/reconcile.md): events Stripe gave up on are
//! pulled from the loopback fake of `GET /v1/events` (tests/src/stripe_api,
//! checked against stripe-python) and run once; live and pulled copies are
//! one event; a run stopped mid-way resumes from its cursor; two processes
//! never both pull; 429 and 5xx are waited out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::reconcile_support::*;
use serde_json::json;
use tickmark::reconcile::{
    NoProgress, Progress, ReconcileError, ReconcileSummary, Reconciler, RunLimits, RunRequest,
    StripeApi,
};
use tickmark::Backend;
use tickmark_tests::stripe_api::FakeStripe;
use tokio_util::sync::CancellationToken;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// The fake's API for a reconciler: its address and key, 7 days back on a
/// first run, pages of `page` events.
fn api(fake: &FakeStripe, page: u32) -> StripeApi {
    StripeApi::new(fake.api_key())
        .with_base_url(&fake.base_url())
        .expect("the fake's URL")
        .with_first_lookback(7 * DAY)
        .with_page_size(page)
}

fn invoice(n: usize) -> serde_json::Value {
    json!({ "id": format!("in_{n}"), "object": "invoice", "amount_paid": 100 + n })
}

/// Advance the fake to the real now in steps of `step`, attempting every
/// due delivery at each.
async fn deliver_until_now(fake: &FakeStripe, step: Duration) {
    let now = chrono::Utc::now().timestamp();
    while fake.now() < now {
        fake.advance(step.min(Duration::from_secs((now - fake.now()) as u64)));
        fake.deliver_due().await;
    }
}

/// A reconciler of `engine` named `solo` for the fake's `stripe` source,
/// on the fake's clock, with pages of `page` events.
fn stripe_reconciler(engine: &tickmark::Engine, fake: &FakeStripe, page: u32) -> Reconciler {
    let clock_fake = fake.clone();
    reconciler(engine, "solo")
        .with_clock(clock_of(move || clock_fake.now()))
        .stripe("stripe", api(fake, page))
}

/// One event and a first run, which sets the cursor to it; its id.
async fn set_the_cursor(fake: &FakeStripe, reconciler: &Reconciler) -> String {
    let first = fake.create_event(STRIPE_KIND, invoice(0));
    run(reconciler, &RunRequest::default())
        .await
        .expect("a first run sets the cursor");
    first
}

async fn run(
    reconciler: &Reconciler,
    request: &RunRequest,
) -> Result<ReconcileSummary, ReconcileError> {
    reconciler
        .run("stripe", request, &NoProgress, &CancellationToken::new())
        .await
}

/// Events Stripe gave up on (the receiver answered 503 for 4 days, past
/// Stripe's 3 days of retries) are pulled, recorded once and run once; a
/// second run finds nothing new.
async fn events_stripe_gave_up_on_are_pulled_and_run_once(backend: Backend) {
    let Some((db, engine)) = test_engine(backend).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeStripe::start().await;
    fake.add_endpoint(&receiver.url("stripe"), STRIPE_SECRET, &["*"]);
    fake.set_now(chrono::Utc::now().timestamp() - 4 * 24 * 3600);
    receiver.set_down(true);
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(fake.create_event(STRIPE_KIND, invoice(n)));
        fake.create_event("customer.created", json!({ "id": format!("cus_{n}") }));
        fake.advance(Duration::from_secs(3600));
    }
    deliver_until_now(&fake, Duration::from_secs(1800)).await;
    for id in &ids {
        let state = fake.delivery_state(id).expect("the fake has it");
        assert!(state.given_up && !state.delivered, "{id}: {state:?}");
    }
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        0
    );

    receiver.set_down(false);
    let reconciler = stripe_reconciler(&engine, &fake, 5);
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(
        (
            summary.seen,
            summary.recorded,
            summary.already_had,
            summary.failed
        ),
        (12, 12, 0, 0),
        "{summary:?}"
    );
    assert!(summary.complete);
    // Only the handled kind was asked for (types[]), page by page.
    let lists: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|request| request.path == "/v1/events")
        .collect();
    assert!(
        lists
            .iter()
            .all(|request| request.query.contains("types%5B%5D=invoice.paid")),
        "{lists:?}"
    );
    // 12 events in pages of 5, recorded oldest first: back to the oldest
    // page (3), then forward from it (2; the oldest page is held, not read
    // again).
    assert_eq!(lists.len(), 5, "12 events in pages of 5: {lists:?}");

    drain(&engine).await;
    for id in &ids {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
    let again = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!((again.seen, again.recorded), (0, 0), "{again:?}");
    let cursor = db.store.reconcile_cursors().await.unwrap();
    assert_eq!(cursor[0].cursor.as_deref(), ids.last().map(String::as_str));
}

#[tokio::test]
async fn events_stripe_gave_up_on_are_pulled_and_run_once_sqlite() {
    events_stripe_gave_up_on_are_pulled_and_run_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn events_stripe_gave_up_on_are_pulled_and_run_once_postgres() {
    events_stripe_gave_up_on_are_pulled_and_run_once(Backend::Postgres).await;
}

/// A pulled copy, then Stripe's own retry of it; and a pushed copy, then a
/// pull: each pair is one event, run once.
#[tokio::test]
async fn live_and_pulled_copies_are_one_event() {
    let Some((db, engine)) = test_engine(Backend::Postgres).await else {
        return;
    };
    let receiver = SwitchedReceiver::start(&engine).await;
    let fake = FakeStripe::start().await;
    fake.add_endpoint(&receiver.url("stripe"), STRIPE_SECRET, &[STRIPE_KIND]);
    let reconciler = stripe_reconciler(&engine, &fake, 100);

    // Pulled first: the receiver was down for the first attempt.
    receiver.set_down(true);
    let pulled_first: Vec<String> = (0..4)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    assert_eq!(fake.deliver_due().await.failed, 4);
    receiver.set_down(false);
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(
        (summary.recorded, summary.already_had),
        (4, 0),
        "{summary:?}"
    );
    fake.advance(Duration::from_secs(3600));
    let retried = fake.deliver_due().await;
    assert_eq!(
        retried.delivered, 4,
        "the retries reach a receiver that is up: {retried:?}"
    );

    // Pushed first: delivered live, then listed by the next run.
    let pushed_first: Vec<String> = (4..7)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    assert_eq!(fake.deliver_due().await.delivered, 3);
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(
        (summary.recorded, summary.already_had),
        (0, 3),
        "{summary:?}"
    );

    drain(&engine).await;
    for id in pulled_first.iter().chain(&pushed_first) {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        7
    );
}

/// Adds a fault to the fake after the run's second page: the run stops
/// there, as a killed one would, with the cursor where that page left it.
struct FailAfterSecondPage {
    fake: FakeStripe,
    armed: AtomicBool,
}

impl Progress for FailAfterSecondPage {
    fn page(&self, pages: u64, _summary: &ReconcileSummary) {
        if pages == 2 && self.armed.swap(false, Ordering::SeqCst) {
            // Both attempts of the next request fail (quick_client: 2).
            self.fake.fail_next(2, 503);
        }
    }
}

/// A run stopped after two of its pages resumes from its cursor: the next
/// run starts after the second page, reads each remaining event once, and
/// every event runs once.
#[tokio::test]
async fn a_reconciler_stopped_mid_run_resumes_from_its_cursor() {
    let Some((db, engine)) = test_engine(Backend::Postgres).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let first = set_the_cursor(&fake, &reconciler).await;

    let ids: Vec<String> = (1..=35)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let progress = FailAfterSecondPage {
        fake: fake.clone(),
        armed: AtomicBool::new(true),
    };
    let stopped = reconciler
        .run(
            "stripe",
            &RunRequest::default(),
            &progress,
            &CancellationToken::new(),
        )
        .await;
    assert!(
        matches!(stopped, Err(ReconcileError::Unreachable { .. })),
        "{stopped:?}"
    );
    let cursor = db.store.reconcile_cursors().await.unwrap();
    assert_eq!(
        cursor[0].cursor.as_deref(),
        Some(ids[19].as_str()),
        "two whole pages of ten"
    );
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        21
    );

    let before = fake.requests().len();
    let resumed = run(&reconciler, &RunRequest::default())
        .await
        .expect("the next run");
    let first_request = &fake.requests()[before];
    assert!(
        first_request
            .query
            .contains(&format!("ending_before={}", ids[19])),
        "resumes after the cursor: {first_request:?}"
    );
    assert_eq!(
        (resumed.recorded, resumed.already_had),
        (15, 0),
        "{resumed:?}"
    );
    drain(&engine).await;
    for id in std::iter::once(&first).chain(&ids) {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
}

/// One process holds the source's lease and stalls on a `Retry-After`
/// longer than its lease; another takes the lapsed lease and reconciles.
/// The first wakes, finds its lease gone, and stops before it sends again:
/// the fake saw its two requests and the second process's pages, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_both_pull() {
    let Some((db, engine)) = test_engine(Backend::Postgres).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let ids: Vec<String> = (0..25)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let make = |owner: &str| {
        let clock_fake = fake.clone();
        reconciler(&engine, owner)
            .with_client_settings(tickmark::reconcile::ClientSettings {
                attempts: 3,
                ..quick_client()
            })
            .expect("settings")
            .with_lease(Duration::from_secs(1))
            .with_clock(clock_of(move || clock_fake.now()))
            .stripe("stripe", api(&fake, 10))
    };
    let (first, second) = (make("first"), make("second"));

    // The first's second request is told to wait 3 s: twice its lease.
    struct StallSecondRequest(FakeStripe);
    impl Progress for StallSecondRequest {
        fn page(&self, pages: u64, _summary: &ReconcileSummary) {
            if pages == 1 {
                self.0.rate_limit_next(1, Duration::from_secs(3));
            }
        }
    }
    let stall = Arc::new(StallSecondRequest(fake.clone()));
    let first_run = tokio::spawn({
        let stall = stall.clone();
        async move {
            first
                .run(
                    "stripe",
                    &RunRequest::default(),
                    stall.as_ref(),
                    &CancellationToken::new(),
                )
                .await
        }
    });
    // Wait until the first has been told to wait (its second request answered 429).
    tickmark_tests::wait::until(
        "the first process told to wait (429)",
        Duration::from_secs(30),
        || {
            let fake = fake.clone();
            async move { fake.requests().iter().any(|request| request.status == 429) }
        },
    )
    .await;
    // The second is refused while the first's lease lasts, then takes it.
    let summary = loop {
        match second
            .run(
                "stripe",
                &RunRequest::default(),
                &NoProgress,
                &CancellationToken::new(),
            )
            .await
        {
            Err(ReconcileError::Busy { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => break other.expect("the second's run"),
        }
    };
    assert_eq!(summary.seen, 25, "{summary:?}");
    let lost = first_run.await.expect("the first's task");
    assert!(
        matches!(&lost, Err(error) if error.is_lease_lost()),
        "the first stops on its lost lease: {lost:?}"
    );
    // Two of the first's, five of the second's (25 in tens: back to the
    // oldest page, 3, then forward from it, 2).
    let lists = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/events")
        .count();
    assert_eq!(lists, 2 + 5, "{:#?}", fake.requests());
    drain(&engine).await;
    for id in &ids {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
}

/// A 429 is waited out for its `Retry-After`, a 500 retried, and the run
/// then completes.
#[tokio::test]
async fn rate_limits_and_server_errors_are_waited_out() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    for n in 0..3 {
        fake.create_event(STRIPE_KIND, invoice(n));
    }
    fake.rate_limit_next(1, Duration::from_secs(1));
    fake.fail_next(1, 500);
    let clock_fake = fake.clone();
    let reconciler = reconciler(&engine, "solo")
        .with_client_settings(tickmark::reconcile::ClientSettings {
            attempts: 4,
            ..quick_client()
        })
        .expect("settings")
        .with_clock(clock_of(move || clock_fake.now()))
        .stripe("stripe", api(&fake, 10));
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(summary.recorded, 3);
    let requests = fake.requests();
    let statuses: Vec<u16> = requests.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 500, 200]);
    assert!(
        requests[1].at.duration_since(requests[0].at) >= Duration::from_secs(1),
        "the second request waited out Retry-After: 1"
    );
    drop(db);
}

/// A dry run counts and changes nothing: no lease, no cursor, no events.
#[tokio::test]
async fn a_dry_run_counts_and_changes_nothing() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    for n in 0..4 {
        fake.create_event(STRIPE_KIND, invoice(n));
    }
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let request = RunRequest {
        dry_run: true,
        since: Some(DAY),
        ..RunRequest::default()
    };
    let summary = run(&reconciler, &request).await.expect("a dry run");
    assert_eq!(
        (summary.seen, summary.recorded, summary.dry_run),
        (4, 4, true)
    );
    assert!(db.store.reconcile_cursors().await.unwrap().is_empty());
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        0
    );
}

/// A run that dies in the middle of a page (its inbox write fails at the
/// third event of the third page, by a trigger of the test's) leaves the
/// cursor at the second page; the next run reads the third page again:
/// the two events recorded before the failure are duplicates, the rest are
/// recorded, and each runs once.
#[tokio::test]
async fn a_run_that_dies_mid_page_reads_that_page_again() {
    let Some((db, engine)) = test_engine(Backend::Postgres).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let first = set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=25)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();

    db.probe
        .execute(&format!(
            "CREATE FUNCTION test_fail_on_key() RETURNS trigger AS $$ BEGIN \
             IF NEW.dedup_key = '{}' THEN RAISE EXCEPTION 'injected: the process dies here'; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql",
            ids[22]
        ))
        .await;
    db.probe
        .execute(
            "CREATE TRIGGER test_fail BEFORE INSERT ON tickmark_events \
             FOR EACH ROW EXECUTE FUNCTION test_fail_on_key()",
        )
        .await;
    let died = run(&reconciler, &RunRequest::default()).await;
    assert!(matches!(died, Err(ReconcileError::Store(_))), "{died:?}");
    let cursor = db.store.reconcile_cursors().await.unwrap();
    assert_eq!(
        cursor[0].cursor.as_deref(),
        Some(ids[19].as_str()),
        "two whole pages"
    );
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        1 + 22,
        "the third page's first two events were recorded before the failure"
    );

    db.probe
        .execute("DROP TRIGGER test_fail ON tickmark_events")
        .await;
    let resumed = run(&reconciler, &RunRequest::default())
        .await
        .expect("the next run");
    assert_eq!(
        (resumed.already_had, resumed.recorded),
        (2, 3),
        "{resumed:?}"
    );
    drain(&engine).await;
    for id in std::iter::once(&first).chain(&ids) {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
}

/// A window (`--since`) that does not reach back to the cursor leaves the
/// cursor where it was: the next run from the cursor still finds what lies
/// between.
#[tokio::test]
async fn a_short_window_never_moves_the_cursor_past_a_gap() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    fake.set_now(chrono::Utc::now().timestamp() - 2 * 24 * 3600);
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let old = fake.create_event(STRIPE_KIND, invoice(0));
    run(&reconciler, &RunRequest::default())
        .await
        .expect("a first run");
    fake.advance(DAY);
    let between = fake.create_event(STRIPE_KIND, invoice(1));
    fake.advance(DAY);
    let recent = fake.create_event(STRIPE_KIND, invoice(2));

    let window = RunRequest {
        since: Some(Duration::from_secs(3600)),
        ..RunRequest::default()
    };
    let short = run(&reconciler, &window).await.expect("a short window");
    assert_eq!(short.recorded, 1, "only the last hour: {short:?}");
    let cursor = db.store.reconcile_cursors().await.unwrap();
    assert_eq!(
        cursor[0].cursor.as_deref(),
        Some(old.as_str()),
        "not past the gap"
    );

    let from_cursor = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(
        (from_cursor.recorded, from_cursor.already_had),
        (1, 1),
        "{from_cursor:?}"
    );
    drain(&engine).await;
    for id in [&old, &between, &recent] {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
}

/// A cursor whose event Stripe no longer has (answered 404
/// `resource_missing`) is said in the summary; the run reads the whole 30
/// days instead and moves the cursor on, so the next run pages forward again.
#[tokio::test]
async fn a_cursor_stripe_no_longer_has_falls_back_to_its_thirty_days() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let lease = db
        .store
        .reconcile_lease_take("stripe", "before", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("a free source");
    db.store
        .reconcile_cursor_advance(
            &lease,
            "evt_gone_long_ago",
            Some(chrono::Utc::now() - chrono::Duration::days(40)),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    db.store
        .reconcile_lease_release(&lease, None)
        .await
        .unwrap();
    let ids: Vec<String> = (0..3)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();

    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(summary.recorded, 3, "{summary:?}");
    assert!(
        summary
            .notes
            .iter()
            .any(|note| note.contains("no longer lists the cursor's event")),
        "{summary:?}"
    );
    let cursor = db.store.reconcile_cursors().await.unwrap();
    assert_eq!(
        cursor[0].cursor.as_deref(),
        ids.last().map(String::as_str),
        "moved on"
    );
    let next = fake.create_event(STRIPE_KIND, invoice(3));
    let again = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(
        (again.recorded, again.notes.len()),
        (1, 0),
        "forward again: {again:?}"
    );
    let last = fake.requests().pop().expect("a request");
    assert!(
        last.query.contains(&format!("ending_before={}", ids[2])),
        "{last:?}"
    );
    drain(&engine).await;
    for id in ids.iter().chain([&next]) {
        assert_eq!(runs(&db, id).await, 1, "{id} ran once");
    }
}

// --- Issue 41: the cursor never passes what a run did not read, and a
// broken or hostile API cannot keep a run going.

/// An empty page that says there is more.
fn empty_page_claiming_more() -> serde_json::Value {
    json!({ "object": "list", "url": "/v1/events", "has_more": true, "data": [] })
}

async fn cursor_of(db: &tickmark_tests::TestDb) -> Option<String> {
    db.store.reconcile_cursors().await.unwrap()[0]
        .cursor
        .clone()
}

/// List requests the fake answered from the `from`-th request on.
fn lists_since(fake: &FakeStripe, from: usize) -> usize {
    fake.requests()[from..]
        .iter()
        .filter(|request| request.path == "/v1/events")
        .count()
}

/// Every event of `ids` ran exactly once.
async fn each_ran_once(db: &tickmark_tests::TestDb, engine: &tickmark::Engine, ids: &[String]) {
    drain(engine).await;
    for id in ids {
        assert_eq!(runs(db, id).await, 1, "{id} ran once");
    }
}

/// `--since` pages back from now; a provider that answers an empty page
/// with `has_more: true` ended the run "complete" and moved the cursor past
/// the 40 events it never read. Now the run ends with `NoProgress`, the
/// cursor stays, and the next healthy run records every event.
#[tokio::test]
async fn a_window_run_given_an_empty_page_claiming_more_keeps_the_cursor() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let first = set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=50)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || {
        stuck_fake.answer_next_with(1, empty_page_claiming_more())
    });
    let window = RunRequest {
        since: Some(DAY),
        ..RunRequest::default()
    };
    ends_without_progress(&reconciler, "stripe", &window, &progress).await;
    assert_eq!(cursor_of(&db).await, Some(first), "the cursor stays");
    run(&reconciler, &RunRequest::default())
        .await
        .expect("a healthy run");
    each_ran_once(&db, &engine, &ids).await;
}

/// The same, paging forward from the cursor: the empty page claiming more
/// ends the run with `NoProgress`, the cursor where the last whole page
/// left it.
#[tokio::test]
async fn a_forward_run_given_an_empty_page_claiming_more_ends_with_an_error() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=30)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || {
        stuck_fake.answer_next_with(1, empty_page_claiming_more())
    });
    ends_without_progress(&reconciler, "stripe", &RunRequest::default(), &progress).await;
    assert_eq!(cursor_of(&db).await.as_deref(), Some(ids[9].as_str()));
    let healthy = run(&reconciler, &RunRequest::default())
        .await
        .expect("a healthy run");
    assert_eq!(healthy.recorded, 20, "{healthy:?}");
    each_ran_once(&db, &engine, &ids).await;
}

/// A provider that answers the same page again and again with
/// `has_more: true` (it ran for 2,396 requests until killed): the run ends
/// with `NoProgress` on the first repeat, paging forward.
#[tokio::test]
async fn a_page_that_repeats_ends_a_forward_run() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=30)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let first_page: Vec<String> = ids[..10].iter().rev().cloned().collect();
    let repeat = fake.list_page(&first_page, true);
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || stuck_fake.answer_next_with(100, repeat.clone()));
    let before = fake.requests().len();
    ends_without_progress(&reconciler, "stripe", &RunRequest::default(), &progress).await;
    assert_eq!(lists_since(&fake, before), 2, "stopped at the first repeat");
    assert_eq!(cursor_of(&db).await.as_deref(), Some(ids[9].as_str()));
}

/// A forward page older than the cursor (the cursor would go backward):
/// `NoProgress`, and the cursor is not moved back.
#[tokio::test]
async fn a_page_that_goes_backward_ends_a_forward_run() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=30)
        .map(|n| {
            fake.advance(Duration::from_secs(1));
            fake.create_event(STRIPE_KIND, invoice(n))
        })
        .collect();
    let older = fake.list_page(&[ids[4].clone(), ids[3].clone()], true);
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || stuck_fake.answer_next_with(100, older.clone()));
    ends_without_progress(&reconciler, "stripe", &RunRequest::default(), &progress).await;
    assert_eq!(
        cursor_of(&db).await.as_deref(),
        Some(ids[9].as_str()),
        "not moved back"
    );
}

/// Paging back (a window), the same page again: `NoProgress` at once.
#[tokio::test]
async fn a_page_that_repeats_ends_a_window_run() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let first = set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=30)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let newest_page: Vec<String> = ids[20..].iter().rev().cloned().collect();
    let repeat = fake.list_page(&newest_page, true);
    let stuck_fake = fake.clone();
    let progress = after_page(1, move || stuck_fake.answer_next_with(100, repeat.clone()));
    let before = fake.requests().len();
    let window = RunRequest {
        since: Some(DAY),
        ..RunRequest::default()
    };
    ends_without_progress(&reconciler, "stripe", &window, &progress).await;
    assert_eq!(lists_since(&fake, before), 2, "stopped at the first repeat");
    assert_eq!(cursor_of(&db).await, Some(first));
}

/// At its page cap a run ends cleanly (not complete, a note), the cursor
/// at the last whole page; the next run continues from there.
#[tokio::test]
async fn a_run_at_its_page_cap_ends_cleanly_and_the_next_continues() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10).with_run_limits(RunLimits {
        max_pages: 2,
        ..RunLimits::default()
    });
    let first = set_the_cursor(&fake, &reconciler).await;
    let ids: Vec<String> = (1..=35)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    let capped = run(&reconciler, &RunRequest::default())
        .await
        .expect("a capped run ends cleanly");
    assert!(!capped.complete, "{capped:?}");
    assert_eq!(capped.recorded, 20, "{capped:?}");
    assert!(
        capped.notes.iter().any(|note| note.contains("page cap")),
        "{capped:?}"
    );
    assert_eq!(cursor_of(&db).await.as_deref(), Some(ids[19].as_str()));
    let next = run(&reconciler, &RunRequest::default())
        .await
        .expect("the next run");
    assert!(next.complete && next.recorded == 15, "{next:?}");
    each_ran_once(&db, &engine, &[vec![first], ids].concat()).await;
}

/// A provider that keeps a run waiting (a 30 s `Retry-After`) is cut at the
/// run's time cap (1 s here): the run ends cleanly, not complete.
#[tokio::test]
async fn a_run_is_cut_at_its_time_cap() {
    let Some((_db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    fake.create_event(STRIPE_KIND, invoice(0));
    let reconciler = stripe_reconciler(&engine, &fake, 10).with_run_limits(RunLimits {
        max_duration: Duration::from_secs(1),
        ..RunLimits::default()
    });
    fake.rate_limit_next(1, Duration::from_secs(30));
    let cut = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run cut at its time cap ends cleanly");
    assert!(!cut.complete, "{cut:?}");
    assert!(
        cut.notes.iter().any(|note| note.contains("time cap")),
        "{cut:?}"
    );
}

/// `Retry-After: 1e20` panicked the run (`Duration::from_secs_f64`); now the
/// wait is capped at a day, over what a run waits: the run ends with
/// `RateLimited`, and the next resumes.
#[tokio::test]
async fn a_huge_retry_after_ends_the_run_without_a_panic() {
    let Some((_db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    fake.create_event(STRIPE_KIND, invoice(0));
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    fake.rate_limit_next_saying(1, "1e20");
    let limited = run(&reconciler, &RunRequest::default()).await;
    assert!(
        matches!(
            &limited,
            Err(ReconcileError::RateLimited { wait, .. }) if *wait == Duration::from_secs(24 * 3600)
        ),
        "{limited:?}"
    );
    let next = run(&reconciler, &RunRequest::default())
        .await
        .expect("the next run");
    assert_eq!(next.recorded, 1, "{next:?}");
}

/// A pulled event the receiver would refuse (a body over its 1 MiB, an id
/// with a control character, an id over 255 bytes) is counted as refused
/// and never recorded; the others are.
#[tokio::test]
async fn pulled_events_over_the_receivers_limits_are_refused_not_recorded() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let fine = fake.create_event(STRIPE_KIND, invoice(0));
    let big = fake.create_event(
        STRIPE_KIND,
        json!({ "id": "in_big", "lines": "x".repeat(2 * 1024 * 1024) }),
    );
    let mut page = fake.list_page(&[big, fine.clone()], false);
    let made_up = |id: String| {
        json!({
            "id": id, "object": "event", "type": STRIPE_KIND, "created": fake.now(),
            "livemode": false, "data": { "object": invoice(9) },
        })
    };
    let data = page["data"].as_array_mut().expect("a list");
    data.insert(0, made_up("evt_bell\u{7}".to_owned()));
    data.insert(0, made_up(format!("evt_{}", "9".repeat(300))));
    fake.answer_next_with(1, page);
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a run");
    assert_eq!(
        (summary.seen, summary.recorded, summary.refused),
        (4, 1, 3),
        "{summary:?}"
    );
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        1
    );
    each_ran_once(&db, &engine, &[fine]).await;
}

/// `--type` asks Stripe for one kind (`types[]`): such a run moved the
/// shared cursor past every other kind's events. It now leaves the cursor,
/// and the next run records them.
#[tokio::test]
async fn a_run_filtered_to_some_kinds_leaves_the_cursor() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let first = set_the_cursor(&fake, &reconciler).await;
    let invoices: Vec<String> = (1..=3)
        .map(|n| fake.create_event(STRIPE_KIND, invoice(n)))
        .collect();
    for n in 0..2 {
        fake.create_event("customer.created", json!({ "id": format!("cus_{n}") }));
    }
    let filtered = RunRequest {
        kinds: Some(vec!["customer.created".to_owned()]),
        ..RunRequest::default()
    };
    let summary = run(&reconciler, &filtered).await.expect("a filtered run");
    assert_eq!(summary.seen, 2, "{summary:?}");
    assert_eq!(cursor_of(&db).await, Some(first), "the cursor stays");
    let next = run(&reconciler, &RunRequest::default())
        .await
        .expect("the next run");
    assert_eq!(next.recorded, 3, "{next:?}");
    each_ran_once(&db, &engine, &invoices).await;
}

/// A window (a first run, `--since`, a lost cursor) recorded newest first,
/// so a handler ordered per resource met an older `subscription.updated`
/// after a newer one. Each event is now recorded after every older one.
#[tokio::test]
async fn a_window_records_oldest_first() {
    let Some((db, engine)) = test_engine(Backend::Sqlite).await else {
        return;
    };
    let fake = FakeStripe::start().await;
    let ids: Vec<String> = (0..25)
        .map(|n| {
            fake.advance(Duration::from_secs(1));
            fake.create_event(STRIPE_KIND, invoice(n))
        })
        .collect();
    let reconciler = stripe_reconciler(&engine, &fake, 10);
    let summary = run(&reconciler, &RunRequest::default())
        .await
        .expect("a first run");
    assert_eq!(summary.recorded, 25, "{summary:?}");
    let mut seqs = Vec::new();
    for id in &ids {
        seqs.push(
            db.probe
                .scalar(&format!(
                    "SELECT id FROM tickmark_events WHERE dedup_key = '{id}'"
                ))
                .await,
        );
    }
    assert!(
        seqs.windows(2).all(|pair| pair[0] < pair[1]),
        "recorded in the order they were made: {seqs:?}"
    );
    assert_eq!(
        cursor_of(&db).await.as_deref(),
        ids.last().map(String::as_str)
    );
}
