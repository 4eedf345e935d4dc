//! The operator side of the SQLite store (see `store::admin`). Each action is
//! one `BEGIN IMMEDIATE` transaction: read the event, check it against
//! `admin::rules`, run the state-filtered `UPDATE` that bumps the fencing
//! token, change the step rows, write the audit row; a re-queue then wakes
//! this process's idle workers (others poll).

use std::time::Duration;

use chrono::Utc;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::time::{format_time, parse_time, parse_time_opt};
use super::{admin_sql as sql, record_from_row, sql as engine_sql, SqliteStore};
use crate::event::EventState;
use crate::store::admin::rules::{self, Before};
use crate::store::admin::{
    Actor, Admin, AdminError, AuditEntry, EventFilter, RetryRequest, StatusReport,
};
use crate::store::Store;
use crate::store::{decode, EventRecord, StoreError};

/// The audit row of one action.
struct Audit<'a> {
    action: &'a str,
    step: Option<&'a str>,
    detail: String,
}

impl SqliteStore {
    /// Read event `event_seq` for an action (the caller holds the write lock).
    async fn read_for_action(
        conn: &mut SqliteConnection,
        event_seq: i64,
        now: &str,
    ) -> Result<Before, AdminError> {
        let row = sqlx::query(sql::ADMIN_EVENT_READ)
            .bind(event_seq)
            .fetch_optional(conn)
            .await?
            .ok_or_else(|| AdminError::NotFound(event_seq.to_string()))?;
        let state: String = row.try_get("state")?;
        let plan: String = row.try_get("plan")?;
        let due_at: String = row.try_get("due_at")?;
        Ok(Before {
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
            steps: crate::plan::step_names(&plan)
                .map_err(|e| StoreError::Corrupt(format!("stored plan: {e}")))?,
        })
    }

    async fn audit(
        conn: &mut SqliteConnection,
        event_seq: i64,
        now: &str,
        actor: &Actor<'_>,
        audit: Audit<'_>,
    ) -> Result<(), AdminError> {
        sqlx::query(sql::AUDIT_INSERT)
            .bind(event_seq)
            .bind(now)
            .bind(actor.who)
            .bind(audit.action)
            .bind(audit.step)
            .bind(actor.reason)
            .bind(audit.detail)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Skip or mark done by hand: the two differ only in the step row.
    async fn settle_step(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
        done: bool,
    ) -> Result<EventRecord, AdminError> {
        let (action, verb, state, key) = if done {
            ("mark_done", "marked done by hand", "done", "marked_done_by")
        } else {
            ("skip", "skipped", "skipped", "skipped_by")
        };
        let reason = rules::required_reason(&actor, action)?;
        let (turn, mut tx) = self.begin_write().await?;
        let now = format_time(Utc::now());
        let before = Self::read_for_action(&mut tx, event_seq, &now).await?;
        let position = before.position_of(step)?;
        rules::settle_step(&before, position, verb)?;
        let record = refused_unless(
            sqlx::query(sql::EVENT_SETTLE_STEP)
                .bind(event_seq)
                .bind(position)
                .bind(&now)
                .fetch_optional(&mut *tx)
                .await?,
            &before,
        )?;
        sqlx::query(sql::STEP_UPSERT_BY_HAND)
            .bind(event_seq)
            .bind(position)
            .bind(step)
            .bind(state)
            .bind(before.attempt)
            .bind(record.lease_token)
            .bind(&now)
            .bind(rules::by_hand_output(key, actor.who, reason))
            .bind(if done {
                None
            } else {
                before.last_error.as_deref()
            })
            .execute(&mut *tx)
            .await?;
        let audit = Audit {
            action,
            step: Some(step),
            detail: rules::settle_detail(&before, verb),
        };
        Self::audit(&mut tx, event_seq, &now, &actor, audit).await?;
        tx.commit().await?;
        drop(turn);
        if record.state == EventState::Pending {
            self.wake_workers();
        }
        Ok(record)
    }
}

/// The row an action's `UPDATE` returned, or a refusal when it changed none.
fn refused_unless(row: Option<SqliteRow>, before: &Before) -> Result<EventRecord, AdminError> {
    match row {
        Some(row) => Ok(record_from_row(&row)?),
        None => Err(AdminError::Refused(format!(
            "event {} changed while the action ran (it was {}); look again with \
             `tickmark events show {}`",
            before.seq, before.state, before.seq
        ))),
    }
}

fn audit_from_row(row: &SqliteRow) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        id: row.try_get("id")?,
        event_seq: row.try_get("event_id")?,
        at: parse_time(&row.try_get::<String, _>("at")?)?,
        actor: row.try_get("actor")?,
        action: row.try_get("action")?,
        step: row.try_get("step")?,
        reason: row.try_get("reason")?,
        detail: row.try_get("detail")?,
    })
}

fn records(rows: Vec<SqliteRow>) -> Result<Vec<EventRecord>, StoreError> {
    rows.iter().map(record_from_row).collect()
}

/// Now minus `duration`, as stored text (the distant past if it overflows).
fn before_now(duration: Duration) -> String {
    let ago = chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX);
    format_time(
        Utc::now()
            .checked_sub_signed(ago)
            .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC),
    )
}

#[async_trait::async_trait]
impl Admin for SqliteStore {
    async fn status(&self, minutes: u32) -> Result<StatusReport, StoreError> {
        let now = Utc::now();
        let now_text = format_time(now);
        let counts: Vec<(String, String, i64)> = sqlx::query_as(sql::STATUS_COUNTS)
            .fetch_all(&self.pool)
            .await?;
        let counts = rules::sorted_counts(counts)?;
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
            done_per_minute: rules::per_minute(minutes, buckets),
        })
    }

    async fn event_list(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let rows = sqlx::query(sql::EVENT_LIST)
            .bind(filter.state.map(EventState::as_str))
            .bind(filter.source.as_deref())
            .bind(filter.kind.as_deref())
            .bind(filter.since.map(before_now))
            .bind(i64::from(filter.limit))
            .fetch_all(&self.pool)
            .await?;
        records(rows)
    }

    async fn event_lookup(
        &self,
        id: &str,
        source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        if let Some(seq) = rules::row_number(id) {
            if let Some(record) = self.event_get(seq).await? {
                if source.is_none_or(|source| source == record.event.source) {
                    return Ok(vec![record]);
                }
            }
        }
        let rows = sqlx::query(sql::EVENT_BY_DEDUP_KEY)
            .bind(id)
            .bind(source)
            .fetch_all(&self.pool)
            .await?;
        records(rows)
    }

    async fn audit_list(&self, event_seq: i64) -> Result<Vec<AuditEntry>, StoreError> {
        sqlx::query(sql::AUDIT_LIST)
            .bind(event_seq)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(audit_from_row)
            .collect()
    }

    async fn event_plan(&self, event_seq: i64) -> Result<Option<serde_json::Value>, StoreError> {
        let plan: Option<String> = sqlx::query_scalar(sql::EVENT_PLAN)
            .bind(event_seq)
            .fetch_optional(&self.pool)
            .await?;
        plan.map(|plan| decode::json(&plan, "stored plan"))
            .transpose()
    }

    async fn event_retry(&self, request: &RetryRequest<'_>) -> Result<EventRecord, AdminError> {
        let (turn, mut tx) = self.begin_write().await?;
        let now = format_time(Utc::now());
        let before = Self::read_for_action(&mut tx, request.event_seq, &now).await?;
        let from = request
            .from_step
            .map(|step| before.position_of(step))
            .transpose()?;
        let resume_at = rules::retry(&before, from, request.force)?;
        let record = refused_unless(
            sqlx::query(sql::EVENT_RETRY)
                .bind(request.event_seq)
                .bind(resume_at)
                .bind(from.is_some())
                .bind(request.force)
                .bind(&now)
                .fetch_optional(&mut *tx)
                .await?,
            &before,
        )?;
        sqlx::query(sql::STEPS_FORGET_FROM)
            .bind(request.event_seq)
            .bind(resume_at)
            .execute(&mut *tx)
            .await?;
        let audit = Audit {
            action: "retry",
            step: Some(before.step_at(resume_at)),
            detail: rules::retry_detail(&before, resume_at, from.is_some()),
        };
        Self::audit(&mut tx, request.event_seq, &now, &request.actor, audit).await?;
        tx.commit().await?;
        drop(turn);
        self.wake_workers();
        Ok(record)
    }

    async fn event_cancel(
        &self,
        event_seq: i64,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        let (turn, mut tx) = self.begin_write().await?;
        let now = format_time(Utc::now());
        let before = Self::read_for_action(&mut tx, event_seq, &now).await?;
        rules::cancel(&before)?;
        let record = refused_unless(
            sqlx::query(sql::EVENT_CANCEL)
                .bind(event_seq)
                .bind(&now)
                .fetch_optional(&mut *tx)
                .await?,
            &before,
        )?;
        let step = (before.next_step < before.step_count).then(|| before.step_at(before.next_step));
        let audit = Audit {
            action: "cancel",
            step,
            detail: rules::cancel_detail(&before),
        };
        Self::audit(&mut tx, event_seq, &now, &actor, audit).await?;
        tx.commit().await?;
        drop(turn);
        Ok(record)
    }

    async fn step_skip(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.settle_step(event_seq, step, actor, false).await
    }

    async fn step_mark_done_by_hand(
        &self,
        event_seq: i64,
        step: &str,
        actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        self.settle_step(event_seq, step, actor, true).await
    }

    async fn event_prune(
        &self,
        older_than: Duration,
        include_dead: bool,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        let deleted = sqlx::query(sql::EVENT_PRUNE)
            .bind(before_now(older_than))
            .bind(include_dead)
            .bind(i64::from(batch))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        drop(turn);
        Ok(deleted)
    }

    async fn sources(&self) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(sql::SOURCES)
            .fetch_all(&self.pool)
            .await?)
    }
}
