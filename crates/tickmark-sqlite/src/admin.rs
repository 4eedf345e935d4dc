//! The operator side of the SQLite store (see `store::admin`). A transition
//! is one `BEGIN IMMEDIATE` transaction: read the event, ask the decision, run
//! the state-filtered `UPDATE` that bumps the fencing token, change the step
//! rows, write the audit row; a re-queue then wakes this process's idle
//! workers (others poll).

use std::time::Duration;

use chrono::Utc;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::time::{format_time, parse_time, parse_time_opt};
use super::{admin_sql as sql, record_from_row, sql as engine_sql, SqliteStore};
use tickmark_driver::event::EventState;
use tickmark_driver::flow::TenantWeight;
use tickmark_driver::store::admin::{
    Admin, AuditEntry, AuditNote, Decide, Decision, EventFilter, EventSnapshot, KeySlots,
    PruneBatch, StatusReport, TenantRow, TransitionError,
};
use tickmark_driver::store::privacy::{
    ErasedBatch, RegisteredKey, Reseal, StoredValues, SubjectErase,
};
use tickmark_driver::store::tombstone::{key_hash, KeyKind};
use tickmark_driver::store::twin;
use tickmark_driver::store::{decode, EventRecord, StoreError};

impl SqliteStore {
    /// Read event `event_seq` for a transition (the caller holds the write lock).
    async fn read_for_transition(
        conn: &mut SqliteConnection,
        event_seq: i64,
        now: &str,
    ) -> Result<EventSnapshot, TransitionError> {
        let row = sqlx::query(sql::ADMIN_EVENT_READ)
            .bind(event_seq)
            .fetch_optional(conn)
            .await?
            .ok_or(TransitionError::NotFound { event_seq })?;
        let state: String = row.try_get("state")?;
        let plan: String = row.try_get("plan")?;
        let due_at: String = row.try_get("due_at")?;
        Ok(EventSnapshot {
            seq: event_seq,
            state: decode::state(&state, "event state")?,
            next_step: row.try_get("next_step")?,
            step_count: row.try_get("step_count")?,
            attempt: row.try_get("attempt")?,
            // The same text comparison the claim makes.
            lease_expired: due_at.as_str() <= now,
            due_at: parse_time(&due_at)?,
            lease_owner: row.try_get("lease_owner")?,
            last_error: row.try_get("last_error")?,
            finished_at: parse_time_opt(row.try_get("finished_at")?)?,
            steps: decode::step_names(&plan)?,
            waiting_until: parse_time_opt(row.try_get("wait_until")?)?,
        })
    }

    /// Apply `decision` to the event `found` (read in this write transaction).
    async fn apply(
        conn: &mut SqliteConnection,
        found: &EventSnapshot,
        decision: &Decision,
        now: &str,
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
                        .bind(now)
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
                    .bind(now)
                    .fetch_optional(&mut *conn)
                    .await?,
                found,
                record_from_row,
            ),
            Decision::Cancel => twin::changed(
                sqlx::query(sql::EVENT_CANCEL)
                    .bind(found.seq)
                    .bind(now)
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
                    .bind(now)
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
                        .bind(now)
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
                    .bind(now)
                    .bind(output.to_string())
                    .bind(last_error.as_deref())
                    .execute(&mut *conn)
                    .await?;
                Ok(record)
            }
        }
    }

    async fn audit(
        conn: &mut SqliteConnection,
        event_seq: i64,
        now: &str,
        audit: &AuditNote,
    ) -> Result<(), StoreError> {
        sqlx::query(sql::AUDIT_INSERT)
            .bind(event_seq)
            .bind(now)
            .bind(&audit.actor)
            .bind(&audit.action)
            .bind(audit.step.as_deref())
            .bind(audit.reason.as_deref())
            .bind(&audit.detail)
            .execute(conn)
            .await?;
        Ok(())
    }
}

fn audit_from_row(row: &SqliteRow) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        id: row.try_get("id")?,
        event_seq: row.try_get("event_seq")?,
        at: parse_time(&row.try_get::<String, _>("at")?)?,
        actor: row.try_get("actor")?,
        action: row.try_get("action")?,
        step: row.try_get("step")?,
        reason: row.try_get("reason")?,
        detail: row.try_get("detail")?,
    })
}

/// Now minus `duration`, as stored text (the distant past if it overflows).
fn before_now(now: chrono::DateTime<Utc>, duration: Duration) -> String {
    let ago = chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX);
    format_time(
        now.checked_sub_signed(ago)
            .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC),
    )
}

#[async_trait::async_trait]
impl Admin for SqliteStore {
    async fn status(&self, minutes: u32) -> Result<StatusReport, StoreError> {
        let now = self.clock.now();
        let now_text = format_time(now);
        let counts: Vec<(String, String, i64)> = sqlx::query_as(sql::STATUS_COUNTS)
            .fetch_all(&self.pool)
            .await?;
        let counts = decode::sorted_counts(counts)?;
        let oldest: Option<String> = sqlx::query_scalar(engine_sql::EVENT_OLDEST_PENDING)
            .bind(&now_text)
            .fetch_one(&self.pool)
            .await?;
        let stuck: i64 = sqlx::query_scalar(engine_sql::EVENT_COUNT_STUCK)
            .bind(&now_text)
            .fetch_one(&self.pool)
            .await?;
        let window = format_time(now - chrono::Duration::minutes(i64::from(minutes)));
        let buckets: Vec<(i32, i64)> = sqlx::query_as(sql::STATUS_DONE_PER_MINUTE)
            .bind(&now_text)
            .bind(window)
            .fetch_all(&self.pool)
            .await?;
        Ok(StatusReport {
            counts,
            oldest_pending_age: match oldest {
                Some(text) => Some((now - parse_time(&text)?).to_std().unwrap_or_default()),
                None => None,
            },
            stuck,
            done_per_minute: decode::per_minute(minutes, buckets),
        })
    }

    async fn event_list(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let rows = sqlx::query(sql::EVENT_LIST)
            .bind(filter.state.map(EventState::as_str))
            .bind(filter.source.as_deref())
            .bind(filter.kind.as_deref())
            .bind(
                filter
                    .since
                    .map(|since| before_now(self.clock.now(), since)),
            )
            .bind(i64::from(filter.limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn event_lookup(
        &self,
        id: &str,
        source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        twin::event_lookup(
            &self.pool,
            engine_sql::EVENT_GET,
            sql::EVENT_BY_DEDUP_KEY,
            id,
            source,
            record_from_row,
        )
        .await
    }

    async fn audit_list(&self, event_seq: i64) -> Result<Vec<AuditEntry>, StoreError> {
        twin::event_rows(&self.pool, sql::AUDIT_LIST, event_seq, audit_from_row).await
    }

    async fn event_plan(&self, event_seq: i64) -> Result<Option<serde_json::Value>, StoreError> {
        twin::event_plan(&self.pool, sql::EVENT_PLAN, event_seq).await
    }

    async fn event_key_slots(&self, event_seq: i64) -> Result<Option<KeySlots>, StoreError> {
        let key: Option<(String, i32)> = sqlx::query_as(sql::EVENT_KEY)
            .bind(event_seq)
            .fetch_optional(&self.pool)
            .await?;
        let Some((key, limit)) = key else {
            return Ok(None);
        };
        let holders: Vec<(i64, String)> = sqlx::query_as(sql::KEY_HOLDERS)
            .bind(&key)
            .bind(format_time(self.clock.now()))
            .fetch_all(&self.pool)
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
        let (turn, mut tx) = self.begin_write().await?;
        let now = format_time(self.clock.now());
        let found = Self::read_for_transition(&mut tx, event_seq, &now).await?;
        let verdict = decide(&found).map_err(TransitionError::Declined)?;
        let record = Self::apply(&mut tx, &found, &verdict.decision, &now).await?;
        Self::audit(&mut tx, event_seq, &now, &verdict.audit).await?;
        tx.commit().await?;
        drop(turn);
        if record.state == EventState::Pending {
            self.wake_workers();
        }
        Ok(record)
    }

    async fn event_prune(&self, prune: &PruneBatch) -> Result<u64, StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let picked: Vec<(i64, String, String, Option<String>, String)> =
            sqlx::query_as(sql::EVENT_PRUNE_PICK)
                .bind(before_now(now, prune.older_than))
                .bind(prune.include_dead)
                .bind(i64::from(prune.batch))
                .fetch_all(&mut *tx)
                .await?;
        // SQLite has no SHA-256: the tombstones' hashes are computed here,
        // in the batch's transaction.
        let window_start = before_now(now, prune.dedup_window);
        for (_, source, dedup_key, replay_key, received_at) in &picked {
            if *received_at < window_start {
                continue;
            }
            let keys = [
                Some((KeyKind::Dedup, dedup_key.as_str())),
                replay_key.as_deref().map(|key| (KeyKind::Replay, key)),
            ];
            for (kind, key) in keys.into_iter().flatten() {
                sqlx::query(sql::TOMBSTONE_KEEP)
                    .bind(source)
                    .bind(&key_hash(kind, key)[..])
                    .bind(received_at)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        let ids: Vec<i64> = picked.iter().map(|(id, ..)| *id).collect();
        let ids = serde_json::to_string(&ids)
            .map_err(|e| StoreError::Corrupt(format!("pruned row numbers: {e}")))?;
        let deleted = sqlx::query(sql::EVENT_PRUNE)
            .bind(ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        drop(turn);
        Ok(deleted)
    }

    async fn tombstone_prune(&self, dedup_window: Duration, batch: u32) -> Result<u64, StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        let deleted = sqlx::query(sql::TOMBSTONE_PRUNE)
            .bind(before_now(self.clock.now(), dedup_window))
            .bind(i64::from(batch))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        drop(turn);
        Ok(deleted)
    }

    async fn sources(&self) -> Result<Vec<String>, StoreError> {
        twin::sources(&self.pool, sql::SOURCES).await
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
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn tenant_weight_set(
        &self,
        tenant: &str,
        weight: TenantWeight,
    ) -> Result<(), StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        sqlx::query(sql::TENANT_WEIGHT_SET)
            .bind(tenant)
            .bind(weight.get())
            .bind(format_time(self.clock.now()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        drop(turn);
        Ok(())
    }

    async fn tenants(&self, limit: u32) -> Result<Vec<TenantRow>, StoreError> {
        let rows: Vec<(String, f64, i64, i64, Option<String>)> = sqlx::query_as(sql::TENANTS)
            .bind(format_time(self.clock.now()))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|(tenant, weight, pending, running, oldest_due_at)| {
                Ok(TenantRow {
                    tenant,
                    weight,
                    pending,
                    running,
                    oldest_due_at: parse_time_opt(oldest_due_at)?,
                })
            })
            .collect()
    }
}
