//! Accepting a debounced event (docs/flow_control.md): one transaction that
//! locks the key, inserts the event, locks the key's waiting events and
//! leaves one of them (or the new one) to run for the whole burst.

use chrono::{DateTime, Utc};

use super::{accept_lock, sql, PostgresStore};
use tickmark_driver::store::debounce::{coalesce, superseded_note, Waiting};
use tickmark_driver::store::{DebounceInsert, EventInsert, InsertOutcome, StoreError};
use tickmark_driver::trace_context::TraceContext;

impl PostgresStore {
    pub(super) async fn insert_debounced(
        &self,
        event: &EventInsert<'_>,
        debounce: &DebounceInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.db.begin().await?;
        // Never wait for an open caller's transaction (`accept_lock.rs`):
        // holding the debounce lock, that would hold up the key's other
        // accepts too.
        accept_lock::refuse_if_held(&mut tx, event).await?;
        // Accepts of one key take turns; claims never wait on this lock.
        sqlx::query(sql::DEBOUNCE_LOCK)
            .bind(debounce.key)
            .execute(&mut *tx)
            .await?;
        let inserted: Option<(i64, DateTime<Utc>)> = sqlx::query_as(sql::DEBOUNCE_INSERT)
            .bind(event.source)
            .bind(event.dedup_key)
            .bind(event.kind)
            .bind(event.payload_json)
            .bind(event.plan_json)
            .bind(event.step_count)
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
        let Some((seq, now)) = inserted else {
            return Ok(InsertOutcome::Duplicate);
        };
        if !super::undo_tombstoned(&mut tx, [seq].into_iter())
            .await?
            .is_empty()
        {
            return Ok(InsertOutcome::Duplicate);
        }
        // Locked: a claim that holds one of them is waited for, and then it
        // is no longer waiting (it started).
        let waiting: Vec<(i64, Option<i64>, Option<DateTime<Utc>>)> =
            sqlx::query_as(sql::DEBOUNCE_WAITING)
                .bind(debounce.key)
                .bind(seq)
                .fetch_all(&mut *tx)
                .await?;
        let waiting: Vec<Waiting> = waiting
            .into_iter()
            .map(|(seq, resource_seq, burst_started_at)| Waiting {
                seq,
                resource_seq,
                burst_started_at,
            })
            .collect();
        let new = Waiting {
            seq,
            resource_seq: event.resource_seq,
            burst_started_at: None,
        };
        let decided = coalesce(new, &waiting, now, debounce, event.not_before);
        if !decided.superseded.is_empty() {
            sqlx::query(sql::DEBOUNCE_SUPERSEDE)
                .bind(&decided.superseded)
                .bind(decided.survivor)
                .bind(superseded_note(decided.survivor, debounce.key))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(sql::DEBOUNCE_SCHEDULE)
            .bind(decided.survivor)
            .bind(decided.due_at)
            .bind(decided.burst_started_at)
            .bind(&self.channel)
            .execute(&mut *tx)
            .await?;
        self.record_match_keys(&mut tx, seq, event.match_keys)
            .await?;
        tx.commit().await?;
        Ok(InsertOutcome::New(seq))
    }
}
