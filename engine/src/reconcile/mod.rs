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
mod shopify;
mod stripe;
mod stripe_account;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use api_client::ClientSettings;
pub use error::ReconcileError;
pub use github::{GitHubApi, GitHubHook, GitHubRecovery, TokenSource, DELIVERIES_HORIZON};
pub use progress::{LogProgress, NoProgress, Progress};
pub use run_context::RunRequest;
pub use shopify::{graphql_topic, ShopifyApi};
pub use stripe::{StripeApi, DEFAULT_FIRST_LOOKBACK, EVENTS_HORIZON};

use crate::engine::Engine;
pub use crate::reconcile_summary::{MissingSubscription, ReconcileSummary};
use crate::store::Clock;
use api_client::ApiClient;
use run_context::RunContext;

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
            now: self.clock.now(),
        };
        let outcome = async {
            match api {
                ProviderApi::Stripe(api) => stripe::pull(api, &mut run).await,
                ProviderApi::GitHub(api) => github::pull(api, &mut run).await,
                ProviderApi::Shopify(api) => shopify::check(api, &mut run).await,
            }
        }
        .instrument(span)
        .await;
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
    /// `shutdown`. A source another process is reconciling is skipped for
    /// that round; a failed run is logged, stored with the source's cursor
    /// (its summary's `error`: `tickmark status`, the dashboard and
    /// `/metrics` show it) and counted in
    /// `tickmark_reconcile_runs_failed_total`, and tried again next round.
    pub async fn run_every(&self, every: Duration, shutdown: CancellationToken) {
        loop {
            for source in self.sources().map(str::to_owned).collect::<Vec<_>>() {
                if shutdown.is_cancelled() {
                    return;
                }
                let request = RunRequest::default();
                match self.run(&source, &request, &LogProgress, &shutdown).await {
                    Ok(summary) => {
                        tracing::info!(source = %source, counts = %summary.line(), "reconcile: run done")
                    }
                    Err(ReconcileError::Busy { .. }) => {
                        tracing::debug!(source = %source, "reconcile: another process holds the lease");
                    }
                    Err(ReconcileError::Cancelled) => return,
                    Err(error) => tracing::warn!(source = %source, %error, "reconcile: run failed"),
                }
            }
            let pause = every.mul_f64(1.0 + crate::jitter::unit() / 10.0);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// [`run_every`](Self::run_every) on a task of its own, beside the
    /// worker.
    pub fn spawn_every(self, every: Duration, shutdown: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move { self.run_every(every, shutdown).await })
    }
}

/// `host:pid:random`: unique per process, readable in `tickmark reconcile --status`.
fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let nonce = (crate::jitter::unit() * 1e9) as u64;
    format!("{host}:{}:{nonce:x}", std::process::id())
}
