//! Reconciliation: recover the deliveries a provider gave up on, from the
//! provider's own API, through the same inbox as the receiver.
//!
//! A receiver that was down, or answered 503 while its database failed over,
//! can lose events for good: GitHub never retries a failed delivery and
//! Stripe stops after 3 days. A [`Reconciler`] reads what the provider still
//! has and brings in what the inbox lacks:
//!
//! | provider | reads | recovers by | how far back |
//! |---|---|---|---|
//! | Stripe ([`StripeApi`]) | `GET /v1/events` | recording each event (its `id` is the dedup key) | 30 days |
//! | GitHub ([`GitHubApi`]) | the hook's delivery log | asking GitHub to redeliver (or fetching the payload) | 3 days |
//! | Shopify ([`ShopifyApi`]) | the shop's webhook subscriptions | nothing: it reports the ones Shopify removed | — |
//!
//! A pulled copy and a pushed copy of one event are one event: the same
//! source, id and kind go through [`Engine::accept`], whose insert is the
//! dedup decision. Each source keeps a durable cursor, and only one process
//! in a fleet reconciles a source at a time: a run takes the source's
//! lease, fenced by a token, and every cursor move filters on it. A run
//! that dies resumes from the cursor; a process whose lease lapsed stops
//! before its next request.
//!
//! ```no_run
//! # async fn start(engine: tickmark::Engine) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tickmark::reconcile::{Reconciler, StripeApi};
//!
//! let reconciler = Reconciler::new(engine)?
//!     .stripe("stripe", StripeApi::new(std::env::var("STRIPE_API_KEY")?));
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! // Beside the worker: every 10 minutes, one process of the fleet at a time.
//! let handle = reconciler.spawn_every(Duration::from_secs(600), shutdown.clone());
//! # shutdown.cancel(); handle.await?;
//! # Ok(()) }
//! ```
//!
//! docs/reconcile.md has the provider table and the operator's side
//! (`tickmark reconcile`).

mod api_client;
mod base_url;
mod error;
mod github;
mod kind_filter;
mod link_header;
mod progress;
mod run_context;
mod run_limits;
mod shopify;
mod stripe;
mod stripe_account;
mod stripe_api;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use api_client::ClientSettings;
pub use error::ReconcileError;
pub use github::{GitHubApi, GitHubHook, GitHubRecovery, TokenSource, DELIVERIES_HORIZON};
pub use progress::{LogProgress, NoProgress, Progress};
pub use run_context::RunRequest;
pub use run_limits::{RunLimits, DEFAULT_MAX_DURATION, DEFAULT_MAX_PAGES};
pub use shopify::{graphql_topic, ShopifyApi};
pub use stripe_api::{StripeApi, DEFAULT_FIRST_LOOKBACK, EVENTS_HORIZON};

use api_client::ApiClient;
use run_context::RunContext;
use tickmark_core::Engine;
use tickmark_driver::store::Clock;
pub use tickmark_driver::store::{MissingSubscription, ReconcileSummary};

/// How long a run's lease lasts without a page: each request extends it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(120);

/// Which provider's API a source is reconciled from.
#[derive(Debug, Clone)]
enum ProviderApi {
    Stripe(StripeApi),
    GitHub(GitHubApi),
    Shopify(ShopifyApi),
}

impl ProviderApi {
    fn name(&self) -> &'static str {
        match self {
            ProviderApi::Stripe(_) => "stripe",
            ProviderApi::GitHub(_) => "github",
            ProviderApi::Shopify(_) => "shopify",
        }
    }
}

/// Reconciles an engine's sources from their providers' APIs. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Reconciler {
    engine: Engine,
    sources: Vec<(String, ProviderApi)>,
    client: Arc<ApiClient>,
    owner: String,
    lease_for: Duration,
    clock: Clock,
    limits: RunLimits,
}

impl Reconciler {
    /// A reconciler for `engine`'s sources, with no source yet.
    pub fn new(engine: Engine) -> Result<Self, ReconcileError> {
        Ok(Self {
            engine,
            sources: Vec::new(),
            client: Arc::new(ApiClient::new(ClientSettings::default())?),
            owner: default_owner(),
            lease_for: DEFAULT_LEASE,
            clock: Clock::system(),
            limits: RunLimits::default(),
        })
    }

    /// Reconcile the receiver's source `source` from Stripe's events.
    pub fn stripe(self, source: impl Into<String>, api: StripeApi) -> Self {
        self.with_source(source.into(), ProviderApi::Stripe(api))
    }

    /// Reconcile `source` from a GitHub hook's delivery log.
    pub fn github(self, source: impl Into<String>, api: GitHubApi) -> Self {
        self.with_source(source.into(), ProviderApi::GitHub(api))
    }

    /// Check `source`'s Shopify webhook subscriptions.
    pub fn shopify(self, source: impl Into<String>, api: ShopifyApi) -> Self {
        self.with_source(source.into(), ProviderApi::Shopify(api))
    }

    fn with_source(mut self, source: String, api: ProviderApi) -> Self {
        self.sources.retain(|(name, _)| *name != source);
        self.sources.push((source, api));
        self
    }

    /// Pace, time limits and retries of the API client.
    pub fn with_client_settings(
        mut self,
        settings: ClientSettings,
    ) -> Result<Self, ReconcileError> {
        self.client = Arc::new(ApiClient::new(settings)?);
        Ok(self)
    }

    /// Who this process is, in the lease (default `host:pid:random`).
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// How long a lease lasts between two requests (default [`DEFAULT_LEASE`]).
    pub fn with_lease(mut self, lease_for: Duration) -> Self {
        self.lease_for = lease_for;
        self
    }

    /// Each run's caps: pages, time, and what a pulled event may hold
    /// (default [`RunLimits::default`]: 500 pages, 10 minutes, 1 MiB). A run
    /// always gets at least one page and one second, so that it can make
    /// progress.
    pub fn with_run_limits(mut self, limits: RunLimits) -> Self {
        self.limits = RunLimits {
            max_pages: limits.max_pages.max(1),
            max_duration: limits.max_duration.max(Duration::from_secs(1)),
            ..limits
        };
        self
    }

    /// Where windows (`since`, a first run's look-back) reach back from:
    /// the system clock unless a simulation gives its own.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The configured sources, in the order they were added.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.sources.iter().map(|(name, _)| name.as_str())
    }

    /// Reconcile `source` once: take its lease (unless dry), read from the
    /// cursor (or `request.since`), record what the inbox lacks, move the
    /// cursor page by page, give the lease back with the summary.
    /// [`ReconcileError::Busy`] when another process holds the lease.
    pub async fn run(
        &self,
        source: &str,
        request: &RunRequest,
        progress: &dyn Progress,
        cancel: &CancellationToken,
    ) -> Result<ReconcileSummary, ReconcileError> {
        let api = self.api_of(source)?;
        let store = self.engine.store();
        let lease = if request.dry_run {
            None
        } else {
            let taken = store
                .reconcile_lease_take(source, &self.owner, self.lease_for)
                .await?;
            Some(taken.ok_or_else(|| ReconcileError::Busy {
                source_name: source.to_owned(),
            })?)
        };
        let cursor = store
            .reconcile_cursors()
            .await?
            .into_iter()
            .find(|row| row.source == source);
        let span = tracing::info_span!("reconcile", source = %source, provider = api.name());
        let mut run = RunContext {
            engine: &self.engine,
            client: &self.client,
            source,
            lease,
            cursor,
            request,
            progress,
            cancel,
            lease_for: self.lease_for,
            summary: ReconcileSummary::new(source, api.name(), request.dry_run),
            pages: 0,
            scan_pages: 0,
            limits: &self.limits,
            deadline: deadline_after(self.limits.max_duration),
            now: self.clock.now(),
        };
        // A panic in a run (a provider's answer no one foresaw, a token
        // source of the user's) ends that run like an error: the lease is
        // given back with the summary, and the schedule goes on.
        let outcome = AssertUnwindSafe(async {
            match api {
                ProviderApi::Stripe(api) => stripe::pull(api, &mut run).await,
                ProviderApi::GitHub(api) => github::pull(api, &mut run).await,
                ProviderApi::Shopify(api) => shopify::check(api, &mut run).await,
            }
        })
        .catch_unwind()
        .instrument(span)
        .await
        .unwrap_or_else(|panic| {
            Err(ReconcileError::Panicked {
                message: panic_message(panic.as_ref()),
            })
        });
        // A cap ends the run cleanly: the cursor is at what was fully read,
        // and the next run continues from it.
        let outcome = match outcome {
            Err(cap @ ReconcileError::CapReached { .. }) => {
                run.summary.complete = false;
                run.note(cap.to_string());
                Ok(())
            }
            other => other,
        };
        match &outcome {
            Ok(()) => {}
            // Told to stop (shutdown): not a failure of the run.
            Err(ReconcileError::Cancelled) => run
                .summary
                .notes
                .push(ReconcileError::Cancelled.to_string()),
            // Another process goes on from the cursor: not this one's to report.
            Err(error) if error.is_lease_lost() => {}
            Err(error) => {
                self.engine.metrics().reconcile_run_failed(source);
                run.summary.error = Some(error.to_string());
            }
        }
        if request.kinds.is_some() && !request.dry_run {
            run.summary.notes.push(
                "a run filtered to some kinds leaves the cursor where it was: it did not read the others"
                    .to_owned(),
            );
        }
        self.finish(&run, &outcome).await?;
        outcome.map(|()| run.summary)
    }

    /// Give the lease back with the summary; a lost lease is left alone
    /// (its new holder goes on).
    async fn finish(
        &self,
        run: &RunContext<'_>,
        outcome: &Result<(), ReconcileError>,
    ) -> Result<(), ReconcileError> {
        let Some(lease) = &run.lease else {
            return Ok(());
        };
        if outcome.as_ref().is_err_and(ReconcileError::is_lease_lost) {
            return Ok(());
        }
        let summary = serde_json::to_string(&run.summary).ok();
        match self
            .engine
            .store()
            .reconcile_lease_release(lease, summary.as_deref())
            .await
        {
            Ok(()) => Ok(()),
            // The run's own error says more than the release's.
            Err(_) if outcome.is_err() => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    fn api_of(&self, source: &str) -> Result<&ProviderApi, ReconcileError> {
        self.sources
            .iter()
            .find(|(name, _)| name == source)
            .map(|(_, api)| api)
            .ok_or_else(|| ReconcileError::UnknownSource {
                source_name: source.to_owned(),
                configured: self.sources().collect::<Vec<_>>().join(", "),
            })
    }

    /// Reconcile every source now, then again every `every` (with up to a
    /// tenth more, at random, so a fleet's processes do not line up), until
    /// `shutdown`. Each source's run is on a task of its own and bounded by
    /// the run's caps ([`RunLimits`]), so a stuck source holds the others
    /// back no longer than its time cap. A source another process is
    /// reconciling is skipped for that round; a failed run, or one that
    /// panicked, is logged, stored with the source's cursor (its summary's
    /// `error`: `tickmark status`, the dashboard and `/metrics` show it) and
    /// counted in `tickmark_reconcile_runs_failed_total`, and tried again
    /// next round.
    pub async fn run_every(&self, every: Duration, shutdown: CancellationToken) {
        loop {
            for source in self.sources().map(str::to_owned).collect::<Vec<_>>() {
                if shutdown.is_cancelled() {
                    return;
                }
                if self.run_scheduled(&source, &shutdown).await.is_break() {
                    return;
                }
            }
            let pause = jittered(every);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One scheduled run of `source`, on a task of its own so that a panic
    /// in it ends that run, not the schedule. `Break` on shutdown.
    async fn run_scheduled(
        &self,
        source: &str,
        shutdown: &CancellationToken,
    ) -> std::ops::ControlFlow<()> {
        let reconciler = self.clone();
        let task_source = source.to_owned();
        let cancel = shutdown.clone();
        let task = tokio::spawn(async move {
            let request = RunRequest::default();
            reconciler
                .run(&task_source, &request, &LogProgress, &cancel)
                .await
        });
        match task.await {
            Ok(Ok(summary)) => {
                tracing::info!(source = %source, counts = %summary.line(), "reconcile: run done");
            }
            Ok(Err(ReconcileError::Busy { .. })) => {
                tracing::debug!(source = %source, "reconcile: another process holds the lease");
            }
            Ok(Err(ReconcileError::Cancelled)) => return std::ops::ControlFlow::Break(()),
            Ok(Err(error)) => {
                tracing::warn!(source = %source, %error, "reconcile: run failed; it runs again next round");
            }
            Err(panicked) => {
                tracing::error!(source = %source, error = %panicked, "reconcile: the run panicked; it runs again next round (its lease lapses)");
            }
        }
        std::ops::ControlFlow::Continue(())
    }

    /// [`run_every`](Self::run_every) on a task of its own, beside the
    /// worker.
    pub fn spawn_every(self, every: Duration, shutdown: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move { self.run_every(every, shutdown).await })
    }
}

/// What a panic said, when it said it in words.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// When a run that starts now must end; a cap too large for the clock is
/// no cap.
fn deadline_after(max: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(max)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// `every` and up to a tenth more, at random; never panics, whatever
/// `every` is.
fn jittered(every: Duration) -> Duration {
    let factor = 1.0 + tickmark_driver::jitter::unit() / 10.0;
    Duration::try_from_secs_f64(every.as_secs_f64() * factor).unwrap_or(every)
}

/// `host:pid:random`: unique per process, readable in `tickmark reconcile --status`.
fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let nonce = (tickmark_driver::jitter::unit() * 1e9) as u64;
    format!("{host}:{}:{nonce:x}", std::process::id())
}
