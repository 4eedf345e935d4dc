//! Reconciliation's cursors and leases on SQLite (`store/reconcile.rs`):
//! each transition in a write transaction, fenced
//! ([`reconcile_sql`](super::reconcile_sql)), at the store's clock's now.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::time::{format_time, parse_time, parse_time_opt};
use super::{after, reconcile_sql as sql, SqliteStore};
use tickmark_driver::store::reconcile::lease_kept;
use tickmark_driver::store::twin;
use tickmark_driver::store::{ReconcileCursor, ReconcileLease, StoreError};

impl SqliteStore {
    pub(super) async fn take_reconcile_lease(
        &self,
        source: &str,
        owner: &str,
        lease_for: Duration,
    ) -> Result<Option<ReconcileLease>, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let fence: Option<i64> = sqlx::query_scalar(sql::RECONCILE_LEASE_TAKE)
            .bind(source)
            .bind(owner)
            .bind(format_time(after(now, lease_for)))
            .bind(format_time(now))
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
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
        let (_turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let changed = sqlx::query(sql::RECONCILE_CURSOR_ADVANCE)
            .bind(&lease.source)
            .bind(&lease.owner)
            .bind(lease.fence)
            .bind(cursor)
            .bind(cursor_at.map(format_time))
            .bind(format_time(after(now, lease_for)))
            .bind(format_time(now))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        lease_kept(changed, lease)
    }

    pub(super) async fn extend_reconcile_lease(
        &self,
        lease: &ReconcileLease,
        lease_for: Duration,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let changed = sqlx::query(sql::RECONCILE_LEASE_EXTEND)
            .bind(&lease.source)
            .bind(&lease.owner)
            .bind(lease.fence)
            .bind(format_time(after(now, lease_for)))
            .bind(format_time(now))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        lease_kept(changed, lease)
    }

    pub(super) async fn release_reconcile_lease(
        &self,
        lease: &ReconcileLease,
        summary: Option<&str>,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let changed = sqlx::query(sql::RECONCILE_LEASE_RELEASE)
            .bind(&lease.source)
            .bind(&lease.owner)
            .bind(lease.fence)
            .bind(summary)
            .bind(format_time(self.clock.now()))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        lease_kept(changed, lease)
    }

    pub(super) async fn list_reconcile_cursors(&self) -> Result<Vec<ReconcileCursor>, StoreError> {
        twin::reconcile_cursors(&self.pool, sql::RECONCILE_CURSORS, cursor_from_row).await
    }

    pub(super) async fn reset_reconcile_cursor(&self, source: &str) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let changed = sqlx::query(sql::RECONCILE_CURSOR_RESET)
            .bind(source)
            .bind(format_time(self.clock.now()))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        // Nothing changed: a live lease kept the row, or there is no row.
        let reset = changed > 0
            || !sqlx::query_scalar::<_, bool>(sql::RECONCILE_CURSOR_EXISTS)
                .bind(source)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(reset)
    }
}

fn cursor_from_row(row: &SqliteRow) -> Result<ReconcileCursor, StoreError> {
    Ok(ReconcileCursor {
        source: row.try_get("source")?,
        cursor: row.try_get("cursor")?,
        cursor_at: parse_time_opt(row.try_get("cursor_at")?)?,
        lease_owner: row.try_get("lease_owner")?,
        lease_until: parse_time_opt(row.try_get("lease_until")?)?,
        fence: row.try_get("fence")?,
        last_run_started_at: parse_time_opt(row.try_get("last_run_started_at")?)?,
        last_run_finished_at: parse_time_opt(row.try_get("last_run_finished_at")?)?,
        last_summary: row.try_get("last_summary")?,
        updated_at: parse_time(&row.try_get::<String, _>("updated_at")?)?,
    })
}
