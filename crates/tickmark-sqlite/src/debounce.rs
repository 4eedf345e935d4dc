//! Accepting a debounced event (docs/flow_control.md), in one `BEGIN
//! IMMEDIATE` transaction: the write lock makes accepts of a key take turns
//! and keeps claims out until the burst is decided.

use super::time::{format_time, parse_time_opt};
use super::{sql, SqliteStore};
use tickmark_driver::store::debounce::{coalesce, superseded_note, Waiting};
use tickmark_driver::store::{DebounceInsert, EventInsert, InsertOutcome, StoreError};
use tickmark_driver::trace_context::TraceContext;

impl SqliteStore {
    pub(super) async fn insert_debounced(
        &self,
        event: &EventInsert<'_>,
        debounce: &DebounceInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let keys = (event.source, event.dedup_key, event.replay_key);
        if super::tombstoned(&mut tx, keys).await? {
            return Ok(InsertOutcome::Duplicate);
        }
        let inserted: Option<i64> = sqlx::query_scalar(sql::DEBOUNCE_INSERT)
            .bind(event.source)
            .bind(event.dedup_key)
            .bind(event.kind)
            .bind(event.payload_json)
            .bind(event.plan_json)
            .bind(event.step_count)
            .bind(format_time(now))
            .bind(event.resource_key)
            .bind(event.resource_seq)
            .bind(event.replay_key)
            .bind(event.limit_key)
            .bind(event.limit_n)
            .bind(debounce.key)
            .bind(event.tenant_key)
            .bind(event.head_start_ms)
            .bind(event.trace.map(TraceContext::traceparent))
            .bind(event.trace.and_then(TraceContext::tracestate))
            .bind(event.subjects)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(seq) = inserted else {
            return Ok(InsertOutcome::Duplicate);
        };
        let rows: Vec<(i64, Option<i64>, Option<String>)> = sqlx::query_as(sql::DEBOUNCE_WAITING)
            .bind(debounce.key)
            .bind(seq)
            .fetch_all(&mut *tx)
            .await?;
        let mut waiting = Vec::with_capacity(rows.len());
        for (seq, resource_seq, burst_started_at) in rows {
            waiting.push(Waiting {
                seq,
                resource_seq,
                burst_started_at: parse_time_opt(burst_started_at)?,
            });
        }
        let new = Waiting {
            seq,
            resource_seq: event.resource_seq,
            burst_started_at: None,
        };
        let decided = coalesce(new, &waiting, now, debounce, event.not_before);
        if !decided.superseded.is_empty() {
            let superseded = serde_json::to_string(&decided.superseded)
                .map_err(|e| StoreError::Corrupt(format!("superseded list: {e}")))?;
            sqlx::query(sql::DEBOUNCE_SUPERSEDE)
                .bind(superseded)
                .bind(decided.survivor)
                .bind(superseded_note(decided.survivor, debounce.key))
                .bind(format_time(now))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(sql::DEBOUNCE_SCHEDULE)
            .bind(decided.survivor)
            .bind(format_time(decided.due_at))
            .bind(format_time(decided.burst_started_at))
            .execute(&mut *tx)
            .await?;
        super::wait::record_match_keys(&mut tx, seq, event.match_keys, now).await?;
        tx.commit().await?;
        self.wake_workers();
        Ok(InsertOutcome::New(seq))
    }
}
