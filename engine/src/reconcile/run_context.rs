//! What one run of one source works with, and the few things every
//! provider's run does the same way: keep the lease, move the cursor,
//! record a pulled event through the inbox, ask whether the inbox has one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::api_client::{ApiClient, ApiRequest, ApiResponse, AttemptFailure, RetryLoop};
use super::error::ReconcileError;
use super::progress::Progress;
use crate::engine::Engine;
use crate::event::NewEvent;
use crate::inbox::Accepted;
use crate::reconcile_summary::ReconcileSummary;
use crate::store::{ReconcileCursor, ReconcileLease};

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
    /// no handlers, does).
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
    pub pages: u64,
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

    /// Extend the lease before the next request, so a process whose lease
    /// lapsed (another took it) stops before it pulls again.
    pub async fn keep_lease(&self) -> Result<(), ReconcileError> {
        self.check_cancelled()?;
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
            let (reason, asked) = match self.client.send_once(request, self.cancel).await {
                Ok(response) => return Ok(response),
                Err(AttemptFailure::Stop(error)) => return Err(error),
                Err(AttemptFailure::Retry { reason, wait }) => (reason, wait),
            };
            let wait = retries.after_failure(reason, asked)?;
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(ReconcileError::Cancelled),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Move the cursor to `cursor` (created at `at`), fenced by the lease;
    /// a dry run moves nothing.
    pub async fn advance(
        &self,
        cursor: &str,
        at: Option<DateTime<Utc>>,
    ) -> Result<(), ReconcileError> {
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
        self.now - chrono::Duration::from_std(back).unwrap_or(chrono::Duration::MAX)
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
