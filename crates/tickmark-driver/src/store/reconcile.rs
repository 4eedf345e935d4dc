//! Reconciliation's storage: one durable cursor per receiver source, and
//! the lease that lets one process in a fleet reconcile that source at a
//! time.
//!
//! A reconciler pulls the deliveries a provider's API still lists (Stripe's
//! events, GitHub's hook deliveries) and accepts the ones the receiver never
//! got. Its run takes the source's lease
//! ([`Store::reconcile_lease_take`](super::Store::reconcile_lease_take)),
//! which bumps the row's fencing token; every later write of the run (moving
//! the cursor, extending the lease, giving it back) filters on that token,
//! so a run whose lease expired and was taken by another process changes
//! nothing ([`StoreError::ReconcileLeaseLost`](super::StoreError::ReconcileLeaseLost)),
//! exactly as an event's lease fences its worker.
//!
//! "Now" is the one event leases use: PostgreSQL's `now()`, and on SQLite
//! the store's [`Clock`](super::Clock).
//!
//! What a run found ([`ReconcileSummary`]) is stored with the cursor
//! (`tickmark_reconcile_cursors.last_summary`); the command line, the
//! dashboard and `/metrics` read it back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A source's reconcile lease: who holds it and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileLease {
    /// The receiver source being reconciled (`stripe`).
    pub source: String,
    /// Who holds the lease (a process's name).
    pub owner: String,
    /// The fencing token of the take that granted it; every later write
    /// of the run filters on it.
    pub fence: i64,
}

/// One source's row, for the CLI, the dashboard and the reconciler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileCursor {
    /// The receiver source.
    pub source: String,
    /// The provider's id of the newest object fully handled; `None` before
    /// the first one, or after an operator's reset.
    pub cursor: Option<String>,
    /// That object's creation time at the provider, when known.
    pub cursor_at: Option<DateTime<Utc>>,
    /// Who holds (or last held, if it expired) the lease; `None` once given back.
    pub lease_owner: Option<String>,
    /// Until when the lease holds; `None` once given back. A time in the
    /// past is an expired lease that anyone may take.
    pub lease_until: Option<DateTime<Utc>>,
    /// The fencing token of the latest take (0 before any).
    pub fence: i64,
    /// When the latest run took the lease.
    pub last_run_started_at: Option<DateTime<Utc>>,
    /// When the latest run that gave its lease back did so.
    pub last_run_finished_at: Option<DateTime<Utc>>,
    /// What that run reported, as JSON text (the reconciler's own shape).
    pub last_summary: Option<String>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
}

/// A fenced write of a reconcile run that changed no row lost its lease.
pub fn lease_kept(rows_affected: u64, lease: &ReconcileLease) -> Result<(), super::StoreError> {
    if rows_affected == 0 {
        Err(super::StoreError::ReconcileLeaseLost {
            source_name: lease.source.clone(),
        })
    } else {
        Ok(())
    }
}

/// The counts of one run over one source, and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileSummary {
    /// The receiver's source name the run reconciled.
    pub source: String,
    /// Which provider's API it read: `stripe`, `github` or `shopify`.
    pub provider: String,
    /// Nothing was recorded or redelivered; the counts say what would have been.
    pub dry_run: bool,
    /// Events (Stripe) or deliveries by GUID (GitHub) of a kind the handlers take.
    pub seen: u64,
    /// Of those, the ones the inbox already had (pushed earlier, or pulled by an earlier run).
    pub already_had: u64,
    /// Recorded into the inbox by this run (or, dry, that would have been).
    pub recorded: u64,
    /// GitHub: failed deliveries this run asked GitHub to send again (or,
    /// dry, would have); they arrive through the receiver.
    pub redelivered: u64,
    /// Events or deliveries this run could not record or redeliver.
    pub failed: u64,
    /// Listed by the provider, but of a kind no handler takes: not recorded.
    pub not_handled: u64,
    /// Pulled, but not recorded because the receiver would refuse it too
    /// (an id or kind it does not accept, a body over its limit); logged,
    /// and the first few named in `notes`.
    #[serde(default)]
    pub refused: u64,
    /// Every page up to the newest was read (the cursor moved, unless dry).
    pub complete: bool,
    /// Shopify: the webhook subscriptions the handlers need that Shopify does
    /// not have (removed after failed deliveries, or never made).
    pub missing_subscriptions: Vec<MissingSubscription>,
    /// What an operator should know about this run (a cursor past the
    /// provider's horizon, a page that failed), in words.
    pub notes: Vec<String>,
    /// Why the run failed, in words, when it did (the provider's API
    /// unreachable or refusing, a key of another account): the run ended
    /// there, the cursor kept what was done, and the next run resumes from
    /// it. The failure's time is the row's `last_run_finished_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A webhook subscription the handlers need and the provider does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingSubscription {
    /// The topic as the handlers name it (`orders/create`).
    pub topic: String,
    /// Where deliveries of it should go: the receiver's URL for the source.
    pub callback_url: String,
}

impl ReconcileSummary {
    /// The summary as stored with a source's cursor
    /// (`ReconcileCursor::last_summary`); `None` for none stored, or one
    /// this build cannot read.
    pub fn from_stored(text: Option<&str>) -> Option<Self> {
        serde_json::from_str(text?).ok()
    }

    /// An empty summary of a run over `source` through `provider`'s API.
    pub fn new(source: &str, provider: &str, dry_run: bool) -> Self {
        Self {
            source: source.to_owned(),
            provider: provider.to_owned(),
            dry_run,
            ..Self::default()
        }
    }

    /// One line for people: `seen 12, already had 9, recorded 3, failed 0`
    /// (`would record 3` when dry).
    pub fn line(&self) -> String {
        let (record, redeliver) = if self.dry_run {
            ("would record", "would redeliver")
        } else {
            ("recorded", "redelivered")
        };
        let mut parts = vec![
            format!("seen {}", self.seen),
            format!("already had {}", self.already_had),
            format!("{record} {}", self.recorded),
        ];
        if self.provider == "github" {
            parts.push(format!("{redeliver} {}", self.redelivered));
        }
        parts.push(format!("failed {}", self.failed));
        if self.not_handled > 0 {
            parts.push(format!("not handled {}", self.not_handled));
        }
        if self.refused > 0 {
            parts.push(format!("refused {}", self.refused));
        }
        if !self.missing_subscriptions.is_empty() {
            parts.push(format!(
                "missing subscriptions {}",
                self.missing_subscriptions.len()
            ));
        }
        parts.join(", ")
    }
}
