//! Shared by the `reconcile_*` tests: an engine whose handlers record each
//! run, a real receiver on a loopback socket that can be "down" (it answers
//! 503 to every delivery, as a receiver does while its database fails
//! over), and reconcilers whose clock is the provider fake's, so a window
//! reaches back in the fake's simulated time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use tickmark::receiver::providers::{GitHub, Stripe};
use tickmark::reconcile::{
    ClientSettings, Progress, ReconcileError, ReconcileSummary, Reconciler, RunRequest,
};
use tickmark::{Backend, Engine, Handler, Handlers, Receiver};
use tickmark_driver::store::Clock;
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::LoopbackServer;
use tickmark_tests::test_steps::Record;
use tickmark_tests::TestDb;
use tokio_util::sync::CancellationToken;

/// The Stripe endpoint's signing secret, known to the fake and the receiver.
pub const STRIPE_SECRET: &str = "whsec_reconcile_test_secret";
/// The GitHub hook's secret.
pub const GITHUB_SECRET: &str = "reconcile-test-github-secret";
/// The kind of Stripe event the handlers take.
pub const STRIPE_KIND: &str = "invoice.paid";
/// The kind of GitHub event the handlers take.
pub const GITHUB_KIND: &str = "issues";
/// The one step every handler has.
pub const STEP: &str = "credit";

/// Handlers: `invoice.paid` from `stripe` and `issues` from `github`, one
/// recording step each.
pub fn handlers() -> Handlers {
    Handlers::new()
        .on(
            "stripe",
            STRIPE_KIND,
            Handler::new().named_step(STEP, Record::default()),
        )
        .on(
            "github",
            GITHUB_KIND,
            Handler::new().named_step(STEP, Record::default()),
        )
}

/// A receiver for `stripe` and `github` on a loopback socket, with a switch
/// that makes it answer 503 to everything.
pub struct SwitchedReceiver {
    pub server: LoopbackServer,
    down: Arc<AtomicBool>,
}

impl SwitchedReceiver {
    /// Serve `engine`'s receiver, up.
    pub async fn start(engine: &Engine) -> SwitchedReceiver {
        let down = Arc::new(AtomicBool::new(false));
        let router = Receiver::new(engine.clone())
            .source("stripe", Stripe::new([STRIPE_SECRET]).expect("secret"))
            .expect("source")
            .source("github", GitHub::new([GITHUB_SECRET]).expect("secret"))
            .expect("source")
            .standalone_router()
            .layer(middleware::from_fn_with_state(down.clone(), switch));
        SwitchedReceiver {
            server: LoopbackServer::start(router).await,
            down,
        }
    }

    /// The URL a provider delivers `source`'s events to.
    pub fn url(&self, source: &str) -> String {
        format!("http://{}/hooks/{source}", self.server.addr)
    }

    /// Answer 503 to every delivery (`true`), or receive again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

async fn switch(State(down): State<Arc<AtomicBool>>, request: Request, next: Next) -> Response {
    if down.load(Ordering::SeqCst) {
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    next.run(request).await
}

/// A test engine with [`handlers`] on a fresh database of `backend`
/// (`None` when PostgreSQL tests are skipped).
pub async fn test_engine(backend: Backend) -> Option<(TestDb, Engine)> {
    let db = TestDb::new(backend).await?;
    let engine = engine(&db, handlers());
    Some((db, engine))
}

/// Quick retries for tests: two attempts a request, 10 ms apart, no pace.
pub fn quick_client() -> ClientSettings {
    ClientSettings {
        pace: Duration::ZERO,
        attempts: 2,
        first_backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(10),
        ..ClientSettings::default()
    }
}

/// A clock that reads a fake provider's simulated now (Unix seconds).
pub fn clock_of(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
    Clock::from_fn(move || DateTime::<Utc>::from_timestamp(now(), 0).unwrap_or_else(Utc::now))
}

/// A reconciler for `engine` named `owner`, with quick retries.
pub fn reconciler(engine: &Engine, owner: &str) -> Reconciler {
    Reconciler::new(engine.clone())
        .expect("a reconciler")
        .with_client_settings(quick_client())
        .expect("client settings")
        .with_owner(owner)
}

/// Run workers until nothing is left to do.
pub async fn drain(engine: &Engine) {
    engine
        .worker(quick_worker("reconcile-test"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .expect("worker");
}

/// How often `event_id`'s step ran.
pub async fn runs(db: &TestDb, event_id: &str) -> i64 {
    db.probe.runs(event_id, STEP).await
}

/// Calls `inject` once, after the run's `after`-th page: what the fake
/// answers next is the test's.
pub struct AfterPage {
    after: u64,
    armed: AtomicBool,
    inject: Box<dyn Fn() + Send + Sync>,
}

/// An [`AfterPage`] that calls `inject` after page `after`.
pub fn after_page(after: u64, inject: impl Fn() + Send + Sync + 'static) -> AfterPage {
    AfterPage {
        after,
        armed: AtomicBool::new(true),
        inject: Box::new(inject),
    }
}

/// Run `source` once with `request`, `progress` putting the provider's
/// fault in, and expect the run to end with `NoProgress` (a page that
/// repeats, goes backward, or is empty and claims more).
pub async fn ends_without_progress(
    reconciler: &Reconciler,
    source: &str,
    request: &RunRequest,
    progress: &AfterPage,
) {
    let stuck = reconciler
        .run(source, request, progress, &CancellationToken::new())
        .await;
    assert!(
        matches!(stuck, Err(ReconcileError::NoProgress { .. })),
        "{stuck:?}"
    );
}

impl Progress for AfterPage {
    fn page(&self, pages: u64, _summary: &ReconcileSummary) {
        if pages == self.after && self.armed.swap(false, Ordering::SeqCst) {
            (self.inject)();
        }
    }
}
