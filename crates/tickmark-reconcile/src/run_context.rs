//! What one run of one source works with, and the few things every
//! provider's run does the same way: keep the lease, move the cursor,
//! record a pulled event through the inbox, ask whether the inbox has one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::api_client::{ApiClient, ApiRequest, ApiResponse, AttemptFailure, RetryLoop};
use super::error::ReconcileError;
use super::progress::Progress;
use super::run_limits::RunLimits;
use tickmark_core::event_limits::{text_problem, MAX_ID_BYTES, MAX_KIND_BYTES};
use tickmark_core::inbox::Accepted;
use tickmark_core::Engine;
use tickmark_driver::event::NewEvent;
use tickmark_driver::store::ReconcileSummary;
use tickmark_driver::store::{ReconcileCursor, ReconcileLease};

/// How many pages a run may read back to find where to start, per page of
/// its page cap.
pub(crate) const SCAN_PAGES_PER_PAGE: u64 = 10;

/// What the caller asks of one run.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// Read this far back (at most the provider's horizon), whatever the
    /// cursor says; `None`: from the cursor, or on a first run the
    /// provider's default look-back.
    pub since: Option<Duration>,
    /// Count what would be recorded or redelivered, change nothing (no
    /// lease, no cursor, no inbox rows).
    pub dry_run: bool,
    /// Take these kinds instead of the handlers' (`Some` of an empty list:
    /// every kind, as a dry run of the generic `tickmark` binary, which has
    /// no handlers, does). A run given kinds leaves the cursor where it is:
    /// the cursor is shared by every kind, and this run did not read the
    /// others.
    pub kinds: Option<Vec<String>>,
}

/// One run's state: the source, its lease and cursor, the counts.
pub(crate) struct RunContext<'a> {
    pub engine: &'a Engine,
    pub client: &'a ApiClient,
    pub source: &'a str,
    /// `None` on a dry run, which changes nothing and so needs no lease.
    pub lease: Option<ReconcileLease>,
    /// The source's row as the run began (`None`: never reconciled).
    pub cursor: Option<ReconcileCursor>,
    pub request: &'a RunRequest,
    pub progress: &'a dyn Progress,
    pub cancel: &'a CancellationToken,
    pub lease_for: Duration,
    pub summary: ReconcileSummary,
    /// Pages read so far, of every kind (the progress shows it).
    pub pages: u64,
    /// Of those, the pages that only found where to start (Stripe's window
    /// and GitHub's log, read down before they are handled oldest first):
    /// they hold nothing for long and record nothing, so they count toward
    /// their own, larger cap, not the page cap.
    pub scan_pages: u64,
    /// The run's caps: pages, time, what a pulled event may hold.
    pub limits: &'a RunLimits,
    /// When the run must end (its time cap), by the real clock.
    pub deadline: tokio::time::Instant,
    /// When the run began, by the reconciler's clock: windows reach back
    /// from it.
    pub now: DateTime<Utc>,
}

impl RunContext<'_> {
    /// Stop here when the run was told to.
    pub fn check_cancelled(&self) -> Result<(), ReconcileError> {
        if self.cancel.is_cancelled() {
            return Err(ReconcileError::Cancelled);
        }
        Ok(())
    }

    /// Stop here when the run's time is up.
    pub fn check_deadline(&self) -> Result<(), ReconcileError> {
        if tokio::time::Instant::now() >= self.deadline {
            return Err(self.time_cap());
        }
        Ok(())
    }

    fn time_cap(&self) -> ReconcileError {
        ReconcileError::CapReached {
            cap: format!(
                "time cap ({})",
                humantime::format_duration(self.limits.max_duration)
            ),
        }
    }

    /// Before each page that records or recovers: stop when the run has
    /// handled as many pages as it may.
    pub fn check_page_cap(&self) -> Result<(), ReconcileError> {
        if self.pages - self.scan_pages >= self.limits.max_pages {
            return Err(ReconcileError::CapReached {
                cap: format!("page cap ({} pages)", self.limits.max_pages),
            });
        }
        Ok(())
    }

    /// Before each page that only finds where to start: stop when the way
    /// down is longer than [`SCAN_PAGES_PER_PAGE`] times the page cap. Unlike
    /// the page cap this is an error: the next run would not get further.
    pub fn check_scan_cap(&self, what: &str) -> Result<(), ReconcileError> {
        let most = self.limits.max_pages.saturating_mul(SCAN_PAGES_PER_PAGE);
        if self.scan_pages >= most {
            return Err(ReconcileError::NoProgress {
                what: what.to_owned(),
                reason: format!(
                    "{most} pages read back without reaching the cursor or the window's start; \
                     raise RunLimits::max_pages, or give a shorter --since"
                ),
            });
        }
        Ok(())
    }

    /// A page that only found where to start was read.
    pub fn scan_page_done(&mut self) {
        self.scan_pages += 1;
        self.page_done();
    }

    /// Extend the lease before the next request, so a process whose lease
    /// lapsed (another took it) stops before it pulls again.
    pub async fn keep_lease(&self) -> Result<(), ReconcileError> {
        self.check_cancelled()?;
        self.check_deadline()?;
        if let Some(lease) = &self.lease {
            let store = self.engine.store();
            store.reconcile_lease_extend(lease, self.lease_for).await?;
        }
        Ok(())
    }

    /// Send `request` to the provider, retrying what is worth retrying,
    /// and extend the lease before **every** attempt: a process whose lease
    /// lapsed while it waited out a `Retry-After` stops before it sends
    /// again, so two processes never both pull.
    pub async fn send(&self, request: &ApiRequest) -> Result<ApiResponse, ReconcileError> {
        let mut retries = RetryLoop::new(self.client.settings(), request);
        loop {
            self.keep_lease().await?;
            // The time cap cuts an attempt short too: a provider that never
            // answers holds the run no longer than the cap.
            let attempt = tokio::select! {
                biased;
                () = tokio::time::sleep_until(self.deadline) => return Err(self.time_cap()),
                attempt = self.client.send_once(request, self.cancel) => attempt,
            };
            let (reason, asked) = match attempt {
                Ok(response) => return Ok(response),
                Err(AttemptFailure::Stop(error)) => return Err(error),
                Err(AttemptFailure::Retry { reason, wait }) => (reason, wait),
            };
            let wait = retries.after_failure(reason, asked)?;
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(ReconcileError::Cancelled),
                () = tokio::time::sleep_until(self.deadline) => return Err(self.time_cap()),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Whether this run may move the source's cursor: not a dry run, and
    /// not a run filtered to some kinds (`--type`), which did not read the
    /// others the cursor also stands for.
    pub fn moves_cursor(&self) -> bool {
        self.lease.is_some() && self.request.kinds.is_none()
    }

    /// Move the cursor to `cursor` (created at `at`), fenced by the lease;
    /// a dry run, or one filtered to some kinds, moves nothing.
    pub async fn advance(
        &self,
        cursor: &str,
        at: Option<DateTime<Utc>>,
    ) -> Result<(), ReconcileError> {
        if !self.moves_cursor() {
            return Ok(());
        }
        if let Some(lease) = &self.lease {
            let store = self.engine.store();
            store
                .reconcile_cursor_advance(lease, cursor, at, self.lease_for)
                .await?;
        }
        Ok(())
    }

    /// The start of a window reaching `back` from the run's start.
    pub fn window_start(&self, back: Duration) -> DateTime<Utc> {
        chrono::Duration::from_std(back)
            .ok()
            .and_then(|back| self.now.checked_sub_signed(back))
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The cursor the run began from.
    pub fn cursor_id(&self) -> Option<&str> {
        self.cursor.as_ref()?.cursor.as_deref()
    }

    /// When the object the cursor names was created at the provider.
    pub fn cursor_at(&self) -> Option<DateTime<Utc>> {
        self.cursor.as_ref()?.cursor_at
    }

    /// Whether the inbox has the event `id` of this source.
    pub async fn inbox_has(&self, id: &str) -> Result<bool, ReconcileError> {
        Ok(self
            .engine
            .store()
            .event_find(self.source, id)
            .await?
            .is_some())
    }

    /// Record a pulled event exactly as the receiver records a pushed one
    /// (same source, id and kind, so the two copies are one event), and
    /// count it; a dry run only asks whether the inbox has it.
    pub async fn record(
        &mut self,
        id: &str,
        kind: &str,
        payload: serde_json::Value,
    ) -> Result<(), ReconcileError> {
        self.record_event(NewEvent::with_id(self.source, id, kind, payload))
            .await
    }

    /// [`record`](Self::record) an event made here: one fetched with the
    /// replay key its pushed copy would have.
    pub async fn record_event(&mut self, event: NewEvent) -> Result<(), ReconcileError> {
        let id = event.dedup_key.clone();
        let kind = event.kind.clone();
        self.summary.seen += 1;
        if let Some(reason) = self.refusal(&id, &kind, &event.payload) {
            self.refuse(&id, &reason);
            return Ok(());
        }
        if self.request.dry_run {
            if self.inbox_has(&id).await? {
                self.summary.already_had += 1;
            } else {
                self.summary.recorded += 1;
            }
            return Ok(());
        }
        match self.engine.accept(event).await {
            Ok(Accepted::Duplicate) => self.summary.already_had += 1,
            Ok(Accepted::New { .. } | Accepted::Ignored { .. }) => {
                self.summary.recorded += 1;
                self.engine
                    .metrics()
                    .event_reconciled(self.source, "recorded");
                tracing::info!(source = %self.source, event_id = %id, kind, "reconcile: recorded a missed event");
            }
            Err(error) => {
                self.summary.failed += 1;
                return Err(error.into());
            }
        }
        Ok(())
    }

    /// Why the receiver would refuse this event, if it would: an id or kind
    /// it does not accept, or a body over its limit.
    fn refusal(&self, id: &str, kind: &str, payload: &serde_json::Value) -> Option<String> {
        if let Some(problem) = text_problem(id, MAX_ID_BYTES) {
            return Some(format!(
                "its id is {problem} (1 to {MAX_ID_BYTES} bytes, no control characters)"
            ));
        }
        if let Some(problem) = text_problem(kind, MAX_KIND_BYTES) {
            return Some(format!(
                "its kind is {problem} (1 to {MAX_KIND_BYTES} bytes, no control characters)"
            ));
        }
        let bytes = serde_json::to_vec(payload).map_or(usize::MAX, |body| body.len());
        (bytes > self.limits.max_event_bytes).then(|| {
            format!(
                "it holds {bytes} bytes, over the {} the receiver takes",
                self.limits.max_event_bytes
            )
        })
    }

    /// Count and log an event that is not recorded because the receiver
    /// would refuse it; the first few are noted in the summary too.
    fn refuse(&mut self, id: &str, reason: &str) {
        const NOTED: u64 = 5;
        self.summary.refused += 1;
        let shown: String = id.chars().filter(|c| !c.is_control()).take(80).collect();
        tracing::warn!(source = %self.source, event_id = %shown, %reason, "reconcile: a pulled event is not recorded");
        if self.summary.refused <= NOTED {
            self.summary.notes.push(format!(
                "event {shown} not recorded: {reason}; the receiver refuses such an event too"
            ));
        }
    }

    /// Tell the progress the counts now, on the same page (a page held
    /// from the way back, now handled).
    pub fn report_progress(&self) {
        self.progress.page(self.pages, &self.summary);
    }

    /// A page was read and handled: tell the progress.
    pub fn page_done(&mut self) {
        self.pages += 1;
        self.progress.page(self.pages, &self.summary);
    }

    /// A note for the operator, in the summary and the log.
    pub fn note(&mut self, note: String) {
        tracing::warn!(source = %self.source, "reconcile: {note}");
        self.summary.notes.push(note);
    }
}
