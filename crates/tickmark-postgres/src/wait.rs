//! Durable waits on PostgreSQL (docs/long_handlers.md): the transaction that
//! settles or starts a wait, and the accept that records an event's match
//! keys and wakes the events waiting on them.
//!
//! A wait and an accept of one key take turns on a transaction-scoped
//! advisory lock on the key, and each reads only after it holds the lock:
//! the accept's wake-up then sees a wait that began before it, and a wait
//! that begins after it sees the accepted event. No wake-up is lost.

use chrono::{DateTime, Utc};

use super::{accept_lock, admin_sql, PostgresStore};
use tickmark_driver::store::wait::{decide, WaitDecision};
use tickmark_driver::store::{EventInsert, InsertOutcome, StoreError, WaitSettled, WaitStep};
use tickmark_driver::trace_context::TraceContext;

/// Accepts and waits of one key take turns (until the transaction ends).
const WAIT_LOCK: &str = "
    SELECT pg_advisory_xact_lock(hashtextextended('tickmark.wait:' || k, 0))
    FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) AS keys";

/// The leased event at its wait step, locked: when the wait began, its
/// deadline, and the database's time.
const WAIT_ROW: &str = "
    SELECT wait_since, wait_until, now() FROM tickmark_events
    WHERE id = $1 AND lease_token = $2 AND state = 'running' AND next_step = $3
      AND due_at > now()
    FOR UPDATE";

/// The first event recorded under key `$1`, other than the waiting event
/// `$2`, accepted no more than `$3` seconds (NULL: any) before it.
const WAIT_MATCH: &str = "
    SELECT k.event_seq, e.dedup_key
    FROM tickmark_match_keys AS k
    JOIN tickmark_events AS e ON e.id = k.event_seq
    WHERE k.match_key = $1 AND k.event_seq <> $2
      AND ($3::float8 IS NULL OR k.received_at >=
           (SELECT received_at FROM tickmark_events WHERE id = $2) - make_interval(secs => $3))
    ORDER BY k.event_seq
    LIMIT 1";

/// The wait settled: the event no longer waits on anything.
const WAIT_CLEAR: &str = "
    UPDATE tickmark_events SET wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = $1";

/// Give the leased event back to wait on key `$3` (NULL: a timer) until
/// `$5`, refunding the attempt; `$6` says what it waits for.
const WAIT_RELEASE: &str = "
    UPDATE tickmark_events
    SET state = 'pending', due_at = $5, wait_key = $3, wait_since = $4, wait_until = $5,
        attempt = greatest(attempt - 1, 0), last_error = $6, snoozed = false,
        throttled_by = NULL, progress = NULL, progress_message = NULL
    WHERE id = $1 AND lease_token = $2 AND state = 'running'";

/// Insert one event that waits may match (its keys follow); answers its id.
const MATCHABLE_INSERT: &str = "
    INSERT INTO tickmark_events
        (source, dedup_key, kind, payload, plan, state, step_count, due_at, resource_key,
         resource_seq, replay_key, limit_key, limit_n, tenant_key, head_start_ms, traceparent,
         tracestate, subjects)
    VALUES ($1, $2, $3, $4::json, $5::json, $6, $7, coalesce($8, now()), $9, $10, $11, $12, $13,
            $14, $15, $16, $17, $18)
    ON CONFLICT DO NOTHING
    RETURNING id";

/// Record event `$2` under its match keys `$1`.
const MATCH_KEYS_INSERT: &str = "
    INSERT INTO tickmark_match_keys (match_key, event_seq)
    SELECT DISTINCT k, $2 FROM unnest($1::text[]) AS k
    ON CONFLICT DO NOTHING";

/// Make the events waiting on keys `$1` due now; answers how many.
const WAIT_WAKE: &str = "
    UPDATE tickmark_events SET due_at = now()
    WHERE wait_key = ANY($1) AND state = 'pending' AND due_at > now()";

impl PostgresStore {
    pub(super) async fn settle_wait(&self, wait: &WaitStep<'_>) -> Result<WaitSettled, StoreError> {
        let lease = wait.lease;
        let mut tx = self.db.begin().await?;
        if let Some(key) = wait.key {
            sqlx::query(WAIT_LOCK).bind([key]).execute(&mut *tx).await?;
        }
        type Row = (Option<DateTime<Utc>>, Option<DateTime<Utc>>, DateTime<Utc>);
        let row: Option<Row> = sqlx::query_as(WAIT_ROW)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(wait.position)
            .fetch_optional(&mut *tx)
            .await?;
        let Some((since, until, now)) = row else {
            return Err(StoreError::LeaseLost {
                event_seq: lease.event_seq,
            });
        };
        let matched: Option<(i64, String)> = match wait.key {
            Some(key) => {
                sqlx::query_as(WAIT_MATCH)
                    .bind(key)
                    .bind(lease.event_seq)
                    .bind(wait.lookback.map(|lookback| lookback.as_secs_f64()))
                    .fetch_optional(&mut *tx)
                    .await?
            }
            None => None,
        };
        let settled = match decide(wait, since, until, now, matched) {
            WaitDecision::Done { output, outcome } => {
                let output_json = output.to_string();
                let mark = wait.done_mark(&output_json, since, now);
                if Self::mark_done_on(&mut *tx, &mark).await? == 0 {
                    return Err(StoreError::LeaseLost {
                        event_seq: lease.event_seq,
                    });
                }
                WaitSettled::Done { output, outcome }
            }
            WaitDecision::Dead => {
                let mark = wait.dead_mark(since, now);
                if Self::mark_failed_on(&mut *tx, &mark).await? == 0 {
                    return Err(StoreError::LeaseLost {
                        event_seq: lease.event_seq,
                    });
                }
                WaitSettled::Dead
            }
            WaitDecision::Wait { since, until } => {
                sqlx::query(WAIT_RELEASE)
                    .bind(lease.event_seq)
                    .bind(lease.token)
                    .bind(wait.key)
                    .bind(since)
                    .bind(until)
                    .bind(wait.waiting_note)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                return Ok(WaitSettled::Waiting { until });
            }
        };
        sqlx::query(WAIT_CLEAR)
            .bind(lease.event_seq)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(settled)
    }

    /// Accept an event that waits may match: insert it, record it under its
    /// match keys and wake the events waiting on them, in one transaction.
    pub(super) async fn insert_matchable(
        &self,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.db.begin().await?;
        // Never wait for an open caller's transaction (`accept_lock.rs`).
        accept_lock::refuse_if_held(&mut tx, event).await?;
        let outcome = self.insert_one_on(&mut tx, event).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    /// Insert one event on `tx`, in its transaction (the caller commits):
    /// undone if a tombstone refuses it, recorded under its match keys
    /// (waiters woken), and the workers notified (at the commit). Any
    /// event but a debounced one.
    pub(super) async fn insert_one_on(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &EventInsert<'_>,
    ) -> Result<InsertOutcome, StoreError> {
        let inserted: Option<i64> = sqlx::query_scalar(MATCHABLE_INSERT)
            .bind(event.source)
            .bind(event.dedup_key)
            .bind(event.kind)
            .bind(event.payload_json)
            .bind(event.plan_json)
            .bind(event.state.as_str())
            .bind(event.step_count)
            .bind(event.not_before)
            .bind(event.resource_key)
            .bind(event.resource_seq)
            .bind(event.replay_key)
            .bind(event.limit_key)
            .bind(event.limit_n)
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
        if !super::undo_tombstoned(tx, [seq].into_iter())
            .await?
            .is_empty()
        {
            return Ok(InsertOutcome::Duplicate);
        }
        let woken = self.record_match_keys(tx, seq, event.match_keys).await?;
        if woken || event.state == tickmark_driver::EventState::Pending {
            sqlx::query(admin_sql::NOTIFY)
                .bind(&self.channel)
                .execute(&mut *tx)
                .await?;
        }
        Ok(InsertOutcome::New(seq))
    }

    /// Record event `seq` under `keys`, then (holding the keys' locks) make
    /// the events waiting on them due now. Answers whether any was woken.
    pub(super) async fn record_match_keys(
        &self,
        tx: &mut sqlx::PgConnection,
        seq: i64,
        keys: &[String],
    ) -> Result<bool, StoreError> {
        if keys.is_empty() {
            return Ok(false);
        }
        sqlx::query(MATCH_KEYS_INSERT)
            .bind(keys)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        // Its own statement, before the wake: the wake's snapshot then
        // includes every wait that began before this accept held the lock.
        sqlx::query(WAIT_LOCK).bind(keys).execute(&mut *tx).await?;
        let woken = sqlx::query(WAIT_WAKE)
            .bind(keys)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        Ok(woken > 0)
    }
}
