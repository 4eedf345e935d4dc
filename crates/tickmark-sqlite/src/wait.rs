//! Durable waits on SQLite (docs/long_handlers.md): the transaction that
//! settles or starts a wait, and, inside an accept's transaction (batched
//! or debounced), the recording of an event's match keys and the wake-up of
//! the events waiting on them. Each is part of a `BEGIN IMMEDIATE`
//! transaction: the file's write lock makes a wait and an accept of one key
//! take turns, so no wake-up is lost.

use chrono::Utc;

use super::time::{format_time, parse_time_opt};
use super::SqliteStore;
use tickmark_driver::store::wait::{decide, WaitDecision};
use tickmark_driver::store::{StoreError, WaitSettled, WaitStep};

/// The leased event at its wait step: when the wait began and its deadline
/// (`?4` is now).
const WAIT_ROW: &str = "
    SELECT wait_since, wait_until FROM tickmark_events
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND next_step = ?3
      AND due_at > ?4";

/// The first event recorded under key `?1`, other than the waiting event
/// `?2`, accepted no earlier than `?3` (NULL: any).
const WAIT_MATCH: &str = "
    SELECT k.event_seq, e.dedup_key
    FROM tickmark_match_keys AS k
    JOIN tickmark_events AS e ON e.id = k.event_seq
    WHERE k.match_key = ?1 AND k.event_seq <> ?2
      AND (?3 IS NULL OR k.received_at >= ?3)
    ORDER BY k.event_seq
    LIMIT 1";

/// When the waiting event was accepted.
const WAITER_RECEIVED: &str = "SELECT received_at FROM tickmark_events WHERE id = ?1";

/// The wait settled: the event no longer waits on anything.
const WAIT_CLEAR: &str = "
    UPDATE tickmark_events SET wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = ?1";

/// Give the leased event back to wait on key `?3` (NULL: a timer) until
/// `?5`, refunding the attempt; `?6` says what it waits for.
const WAIT_RELEASE: &str = "
    UPDATE tickmark_events
    SET state = 'pending', due_at = ?5, wait_key = ?3, wait_since = ?4, wait_until = ?5,
        attempt = max(attempt - 1, 0), last_error = ?6, snoozed = 0,
        throttled_by = NULL, progress = NULL, progress_message = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running'";

/// Record event `?2` (accepted at `?3`) under match key `?1`.
const MATCH_KEY_INSERT: &str = "
    INSERT INTO tickmark_match_keys (match_key, event_seq, received_at) VALUES (?1, ?2, ?3)
    ON CONFLICT DO NOTHING";

/// Make the events waiting on key `?1` due now (`?2`).
const WAIT_WAKE: &str = "
    UPDATE tickmark_events SET due_at = ?2
    WHERE wait_key = ?1 AND state = 'pending' AND due_at > ?2";

impl SqliteStore {
    pub(super) async fn settle_wait(&self, wait: &WaitStep<'_>) -> Result<WaitSettled, StoreError> {
        let lease = wait.lease;
        let (turn, mut tx) = self.begin_write().await?;
        let now = self.clock.now();
        let row: Option<(Option<String>, Option<String>)> = sqlx::query_as(WAIT_ROW)
            .bind(lease.event_seq)
            .bind(lease.token)
            .bind(wait.position)
            .bind(format_time(now))
            .fetch_optional(&mut *tx)
            .await?;
        let Some((since, until)) = row else {
            return Err(StoreError::LeaseLost {
                event_seq: lease.event_seq,
            });
        };
        let (since, until) = (parse_time_opt(since)?, parse_time_opt(until)?);
        let matched: Option<(i64, String)> = match wait.key {
            Some(key) => {
                let earliest = match wait.lookback {
                    Some(lookback) => {
                        let received: String = sqlx::query_scalar(WAITER_RECEIVED)
                            .bind(lease.event_seq)
                            .fetch_one(&mut *tx)
                            .await?;
                        let received = super::time::parse_time(&received)?;
                        Some(format_time(
                            received
                                - chrono::Duration::from_std(lookback)
                                    .unwrap_or(chrono::Duration::MAX),
                        ))
                    }
                    None => None,
                };
                sqlx::query_as(WAIT_MATCH)
                    .bind(key)
                    .bind(lease.event_seq)
                    .bind(earliest)
                    .fetch_optional(&mut *tx)
                    .await?
            }
            None => None,
        };
        let settled = match decide(wait, since, until, now, matched) {
            WaitDecision::Done { output, outcome } => {
                let output_json = output.to_string();
                let mark = wait.done_mark(&output_json, since, now);
                if !Self::mark_done_on(now, &mut tx, &mark).await? {
                    return Err(StoreError::LeaseLost {
                        event_seq: lease.event_seq,
                    });
                }
                WaitSettled::Done { output, outcome }
            }
            WaitDecision::Dead => {
                let mark = wait.dead_mark(since, now);
                if !Self::mark_failed_on(now, &mut tx, &mark).await? {
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
                    .bind(format_time(since))
                    .bind(format_time(until))
                    .bind(wait.waiting_note)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                drop(turn);
                return Ok(WaitSettled::Waiting { until });
            }
        };
        sqlx::query(WAIT_CLEAR)
            .bind(lease.event_seq)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        drop(turn);
        Ok(settled)
    }
}

/// Record event `seq`, accepted at `now`, under `keys` and make the events
/// waiting on them due now. Answers whether any was woken.
pub(super) async fn record_match_keys(
    tx: &mut sqlx::SqliteConnection,
    seq: i64,
    keys: &[String],
    now: chrono::DateTime<Utc>,
) -> Result<bool, StoreError> {
    let now = format_time(now);
    let mut woken = 0;
    for key in keys {
        sqlx::query(MATCH_KEY_INSERT)
            .bind(key)
            .bind(seq)
            .bind(&now)
            .execute(&mut *tx)
            .await?;
        woken += sqlx::query(WAIT_WAKE)
            .bind(key)
            .bind(&now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    Ok(woken > 0)
}
