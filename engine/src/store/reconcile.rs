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

use chrono::{DateTime, Utc};
use serde::Serialize;

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
pub(crate) fn lease_kept(
    rows_affected: u64,
    lease: &ReconcileLease,
) -> Result<(), super::StoreError> {
    if rows_affected == 0 {
        Err(super::StoreError::ReconcileLeaseLost {
            source_name: lease.source.clone(),
        })
    } else {
        Ok(())
    }
}
