//! Reconciliation's cursors and leases on PostgreSQL (`store/reconcile.rs`):
//! each transition one statement, fenced ([`reconcile_sql`](super::reconcile_sql)).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{reconcile_sql as sql, seconds, PostgresStore};
use tickmark_driver::store::reconcile::lease_kept;
use tickmark_driver::store::twin;
use tickmark_driver::store::{ReconcileCursor, ReconcileLease, StoreError};

impl PostgresStore {
    pub(super) async fn take_reconcile_lease(
        &self,
        source: &str,
        owner: &str,
        lease_for: Duration,
    ) -> Result<Option<ReconcileLease>, StoreError> {
        let fence: Option<i64> = sqlx::query_scalar(sql::RECONCILE_LEASE_TAKE)
            .bind(source)
            .bind(owner)
            .bind(seconds(lease_for))
            .fetch_optional(&self.db)
            .await?;
        Ok(fence.map(|fence| ReconcileLease {
            source: source.to_owned(),
            owner: owner.to_owned(),
            fence,
        }))
    }

    pub(super) async fn advance_reconcile_cursor(
        &self,
        lease: &ReconcileLease,
        cursor: &str,
        cursor_at: Option<DateTime<Utc>>,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(sql::RECONCILE_CURSOR_ADVANCE)
            .bind(&lease.source)
            .bind(&lease.owner)
            .bind(lease.fence)
            .bind(cursor)
            .bind(cursor_at)
            .bind(seconds(lease_for))
            .execute(&self.db)
            .await?;
        lease_kept(result.rows_affected(), lease)
    }

    pub(super) async fn extend_reconcile_lease(
        &self,
        lease: &ReconcileLease,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(sql::RECONCILE_LEASE_EXTEND)
            .bind(&lease.source)
            .bind(&lease.owner)
            .bind(lease.fence)
            .bind(seconds(lease_for))
            .execute(&self.db)
            .await?;
        lease_kept(result.rows_affected(), lease)
    }

    pub(super) async fn release_reconcile_lease(
        &self,
        lease: &ReconcileLease,
        summary: Option<&str>,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(sql::RECONCILE_LEASE_RELEASE)
            .bind(&lease.source)
            .bind(&lease.owner)
            .bind(lease.fence)
            .bind(summary)
            .execute(&self.db)
            .await?;
        lease_kept(result.rows_affected(), lease)
    }

    pub(super) async fn list_reconcile_cursors(&self) -> Result<Vec<ReconcileCursor>, StoreError> {
        twin::reconcile_cursors(&self.db, sql::RECONCILE_CURSORS, cursor_from_row).await
    }

    pub(super) async fn reset_reconcile_cursor(&self, source: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(sql::RECONCILE_CURSOR_RESET)
            .bind(source)
            .fetch_one(&self.db)
            .await?)
    }
}

fn cursor_from_row(row: &PgRow) -> Result<ReconcileCursor, StoreError> {
    Ok(ReconcileCursor {
        source: row.try_get("source")?,
        cursor: row.try_get("cursor")?,
        cursor_at: row.try_get("cursor_at")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_until: row.try_get("lease_until")?,
        fence: row.try_get("fence")?,
        last_run_started_at: row.try_get("last_run_started_at")?,
        last_run_finished_at: row.try_get("last_run_finished_at")?,
        last_summary: row.try_get("last_summary")?,
        updated_at: row.try_get("updated_at")?,
    })
}
