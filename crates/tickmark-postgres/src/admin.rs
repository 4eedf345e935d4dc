//! The operator side of the PostgreSQL store (see `store::admin`). A
//! transition is one transaction: lock the event, ask the decision, run the
//! state-filtered `UPDATE` that bumps the fencing token, change the step rows,
//! write the audit row, and (for a re-queue) `NOTIFY` idle workers.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::{admin_sql as sql, record_from_row, sql as engine_sql, PostgresStore};
use tickmark_driver::event::EventState;
use tickmark_driver::flow::TenantWeight;
use tickmark_driver::store::admin::{
    Admin, AuditEntry, AuditNote, Decide, Decision, EventFilter, EventSnapshot, KeySlots,
    PruneBatch, StatusReport, TenantRow, TransitionError,
};
use tickmark_driver::store::privacy::{
    ErasedBatch, RegisteredKey, Reseal, StoredValues, SubjectErase,
};
use tickmark_driver::store::twin;
use tickmark_driver::store::{decode, EventRecord, StoreError};

impl PostgresStore {
    /// Lock event `event_seq` for a transition and read what its decision needs.
    async fn lock_event(
        conn: &mut PgConnection,
        event_seq: i64,
    ) -> Result<EventSnapshot, TransitionError> {
        let row = sqlx::query(sql::ADMIN_EVENT_LOCK)
            .bind(event_seq)
            .fetch_optional(conn)
            .await?
            .ok_or(TransitionError::NotFound { event_seq })?;
        let state: String = row.try_get("state")?;
        let plan: String = row.try_get("plan")?;
        Ok(EventSnapshot {
            seq: event_seq,
            state: decode::state(&state, "event state")?,
            next_step: row.try_get("next_step")?,
            step_count: row.try_get("step_count")?,
            attempt: row.try_get("attempt")?,
            due_at: row.try_get("due_at")?,
            lease_expired: row.try_get("lease_expired")?,
            lease_owner: row.try_get("lease_owner")?,
            last_error: row.try_get("last_error")?,
            finished_at: row.try_get("finished_at")?,
            steps: decode::step_names(&plan)?,
            waiting_until: row.try_get("wait_until")?,
        })
    }

    /// Apply `decision` to the event `found` (locked by this transaction).
    async fn apply(
        conn: &mut PgConnection,
        found: &EventSnapshot,
        decision: &Decision,
    ) -> Result<EventRecord, TransitionError> {
        match decision {
            Decision::Requeue {
                resume_at,
                rerun_done,
                take_over_expired,
            } => {
                let record = twin::changed(
                    sqlx::query(sql::EVENT_RETRY)
                        .bind(found.seq)
                        .bind(*resume_at)
                        .bind(*rerun_done)
                        .bind(*take_over_expired)
                        .fetch_optional(&mut *conn)
                        .await?,
                    found,
                    record_from_row,
                )?;
                sqlx::query(sql::STEPS_FORGET_FROM)
                    .bind(found.seq)
                    .bind(*resume_at)
                    .execute(&mut *conn)
                    .await?;
                Ok(record)
            }
            Decision::EndWait => twin::changed(
                sqlx::query(sql::EVENT_END_WAIT)
                    .bind(found.seq)
                    .fetch_optional(&mut *conn)
                    .await?,
                found,
                record_from_row,
            ),
            Decision::Cancel => twin::changed(
                sqlx::query(sql::EVENT_CANCEL)
                    .bind(found.seq)
                    .fetch_optional(&mut *conn)
                    .await?,
                found,
                record_from_row,
            ),
            Decision::Replan(replan) => twin::changed(
                sqlx::query(sql::EVENT_REPLAN)
                    .bind(found.seq)
                    .bind(&replan.plan_json)
                    .bind(replan.step_count)
                    .bind(replan.resource_key.as_deref())
                    .bind(replan.resource_seq)
                    .bind(replan.limit_key.as_deref())
                    .bind(replan.limit_n)
                    .bind(replan.tenant_key.as_deref())
                    .bind(replan.head_start_ms)
                    .fetch_optional(&mut *conn)
                    .await?,
                found,
                record_from_row,
            ),
            Decision::SettleStep {
                position,
                as_state,
                output,
                last_error,
            } => {
                let name = found
                    .step_name(*position)
                    .ok_or(TransitionError::NotInPlan {
                        event_seq: found.seq,
                        position: *position,
                    })?;
                let record = twin::changed(
                    sqlx::query(sql::EVENT_SETTLE_STEP)
                        .bind(found.seq)
                        .bind(*position)
                        .fetch_optional(&mut *conn)
                        .await?,
                    found,
                    record_from_row,
                )?;
                sqlx::query(sql::STEP_UPSERT_BY_HAND)
                    .bind(found.seq)
                    .bind(*position)
                    .bind(name)
                    .bind(as_state.step_state().as_str())
                    .bind(found.attempt)
                    .bind(record.lease_token)
                    .bind(output.to_string())
                    .bind(last_error.as_deref())
                    .execute(&mut *conn)
                    .await?;
                Ok(record)
            }
        }
    }

    async fn audit(
        conn: &mut PgConnection,
        event_seq: i64,
        audit: &AuditNote,
    ) -> Result<(), StoreError> {
        sqlx::query(sql::AUDIT_INSERT)
            .bind(event_seq)
            .bind(&audit.actor)
            .bind(&audit.action)
            .bind(audit.step.as_deref())
            .bind(audit.reason.as_deref())
            .bind(&audit.detail)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn notify(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        sqlx::query(sql::NOTIFY)
            .bind(&self.channel)
            .execute(conn)
            .await?;
        Ok(())
    }
}

fn audit_from_row(row: &PgRow) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        id: row.try_get("id")?,
        event_seq: row.try_get("event_seq")?,
        at: row.try_get::<DateTime<Utc>, _>("at")?,
        actor: row.try_get("actor")?,
        action: row.try_get("action")?,
        step: row.try_get("step")?,
        reason: row.try_get("reason")?,
        detail: row.try_get("detail")?,
    })
}

#[async_trait::async_trait]
impl Admin for PostgresStore {
    async fn status(&self, minutes: u32) -> Result<StatusReport, StoreError> {
        let counts: Vec<(String, String, i64)> = sqlx::query_as(sql::STATUS_COUNTS)
            .fetch_all(&self.db)
            .await?;
        let counts = decode::sorted_counts(counts)?;
        let age: Option<f64> = sqlx::query_scalar(engine_sql::EVENT_OLDEST_PENDING_AGE)
            .fetch_one(&self.db)
            .await?;
        let stuck: i64 = sqlx::query_scalar(engine_sql::EVENT_COUNT_STUCK)
            .fetch_one(&self.db)
            .await?;
        let buckets: Vec<(i32, i64)> = sqlx::query_as(sql::STATUS_DONE_PER_MINUTE)
            .bind(i32::try_from(minutes).unwrap_or(i32::MAX))
            .fetch_all(&self.db)
            .await?;
        Ok(StatusReport {
            counts,
            oldest_pending_age: age.map(|s| Duration::from_secs_f64(s.max(0.0))),
            stuck,
            done_per_minute: decode::per_minute(minutes, buckets),
        })
    }

    async fn event_list(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let rows = sqlx::query(sql::EVENT_LIST)
            .bind(filter.state.map(EventState::as_str))
            .bind(filter.source.as_deref())
            .bind(filter.kind.as_deref())
            .bind(filter.since.map(|since| since.as_secs_f64()))
            .bind(i64::from(filter.limit))
            .fetch_all(&self.db)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn event_lookup(
        &self,
        id: &str,
        source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        twin::event_lookup(
            &self.db,
            engine_sql::EVENT_GET,
            sql::EVENT_BY_DEDUP_KEY,
            id,
            source,
            record_from_row,
        )
        .await
    }

    async fn audit_list(&self, event_seq: i64) -> Result<Vec<AuditEntry>, StoreError> {
        twin::event_rows(&self.db, sql::AUDIT_LIST, event_seq, audit_from_row).await
    }

    async fn event_plan(&self, event_seq: i64) -> Result<Option<serde_json::Value>, StoreError> {
        twin::event_plan(&self.db, sql::EVENT_PLAN, event_seq).await
    }

    async fn event_key_slots(&self, event_seq: i64) -> Result<Option<KeySlots>, StoreError> {
        let key: Option<(String, i32)> = sqlx::query_as(sql::EVENT_KEY)
            .bind(event_seq)
            .fetch_optional(&self.db)
            .await?;
        let Some((key, limit)) = key else {
            return Ok(None);
        };
        let holders: Vec<(i64, String)> = sqlx::query_as(sql::KEY_HOLDERS)
            .bind(&key)
            .fetch_all(&self.db)
            .await?;
        Ok(Some(KeySlots {
            key,
            limit,
            holders,
        }))
    }

    async fn event_transition(
        &self,
        event_seq: i64,
        decide: &Decide<'_>,
    ) -> Result<EventRecord, TransitionError> {
        let mut tx = self.db.begin().await?;
        let found = Self::lock_event(&mut tx, event_seq).await?;
        let verdict = decide(&found).map_err(TransitionError::Declined)?;
        let record = Self::apply(&mut tx, &found, &verdict.decision).await?;
        Self::audit(&mut tx, event_seq, &verdict.audit).await?;
        if record.state == EventState::Pending {
            self.notify(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(record)
    }

    async fn event_prune(&self, prune: &PruneBatch) -> Result<u64, StoreError> {
        let pruned: i64 = sqlx::query_scalar(sql::EVENT_PRUNE)
            .bind(prune.older_than.as_secs_f64())
            .bind(prune.include_dead)
            .bind(i64::from(prune.batch))
            .bind(prune.dedup_window.as_secs_f64())
            .fetch_one(&self.db)
            .await?;
        Ok(u64::try_from(pruned).unwrap_or(0))
    }

    async fn tombstone_prune(&self, dedup_window: Duration, batch: u32) -> Result<u64, StoreError> {
        let pruned: i64 = sqlx::query_scalar(sql::TOMBSTONE_PRUNE)
            .bind(dedup_window.as_secs_f64())
            .bind(i64::from(batch))
            .fetch_one(&self.db)
            .await?;
        Ok(u64::try_from(pruned).unwrap_or(0))
    }

    async fn sources(&self) -> Result<Vec<String>, StoreError> {
        twin::sources(&self.db, sql::SOURCES).await
    }

    async fn keys_registered(&self) -> Result<Vec<RegisteredKey>, StoreError> {
        self.registered_keys().await
    }

    async fn key_register(&self, key_id: &str, key_check: &str) -> Result<String, StoreError> {
        self.register_key(key_id, key_check).await
    }

    async fn key_retire(&self, key_id: &str) -> Result<(), StoreError> {
        self.retire_key(key_id).await
    }

    async fn values_page(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredValues>, StoreError> {
        self.stored_values_page(after_seq, limit).await
    }

    async fn values_reseal(&self, reseals: &[Reseal<'_>]) -> Result<u64, StoreError> {
        self.reseal_values(reseals).await
    }

    async fn subject_erase(&self, erase: &SubjectErase<'_>) -> Result<ErasedBatch, StoreError> {
        self.erase_subject(erase).await
    }

    async fn subject_events(
        &self,
        subject_hash: &str,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let rows = sqlx::query(sql::SUBJECT_EVENTS)
            .bind(subject_hash)
            .bind(i64::from(limit))
            .fetch_all(&self.db)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn tenant_weight_set(
        &self,
        tenant: &str,
        weight: TenantWeight,
    ) -> Result<(), StoreError> {
        sqlx::query(sql::TENANT_WEIGHT_SET)
            .bind(tenant)
            .bind(weight.get())
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn tenants(&self, limit: u32) -> Result<Vec<TenantRow>, StoreError> {
        let rows: Vec<(String, f64, i64, i64, Option<DateTime<Utc>>)> =
            sqlx::query_as(sql::TENANTS)
                .bind(i64::from(limit))
                .fetch_all(&self.db)
                .await?;
        Ok(rows
            .into_iter()
            .map(
                |(tenant, weight, pending, running, oldest_due_at)| TenantRow {
                    tenant,
                    weight,
                    pending,
                    running,
                    oldest_due_at,
                },
            )
            .collect())
    }
}
