//! Personal data on SQLite (migration 0015, docs/privacy.md), as the
//! PostgreSQL store's `privacy.rs`: the registered keys, a rotation's pages
//! and re-seals, and the erasure of a subject's events. Each write takes the
//! process's write turn and the file's write lock.

use super::time::{format_time, parse_time};
use super::SqliteStore;
use tickmark_driver::store::privacy::{
    join_outputs, split_live, ErasedBatch, RegisteredKey, Reseal, StoredValues, SubjectErase,
};
use tickmark_driver::store::StoreError;

const KEYS_REGISTERED: &str =
    "SELECT key_id, key_check, registered_at FROM tickmark_keys ORDER BY registered_at, key_id";

/// Register key ?1 with check ?2 at ?3 unless its id is known.
const KEY_REGISTER: &str = "
    INSERT INTO tickmark_keys (key_id, key_check, registered_at) VALUES (?1, ?2, ?3)
    ON CONFLICT (key_id) DO NOTHING";

const KEY_CHECK: &str = "SELECT key_check FROM tickmark_keys WHERE key_id = ?1";

const KEY_RETIRE: &str = "DELETE FROM tickmark_keys WHERE key_id = ?1";

const PAYLOADS_PAGE: &str = "
    SELECT id, payload FROM tickmark_events
    WHERE id > ?1 AND erased_at IS NULL
    ORDER BY id LIMIT ?2";

/// The stored outputs of the events in the JSON array ?1.
const OUTPUTS_OF: &str = "
    SELECT event_seq, position, output FROM tickmark_steps
    WHERE event_seq IN (SELECT value FROM json_each(?1)) AND output IS NOT NULL
    ORDER BY event_seq, position";

const PAYLOAD_RESEAL: &str = "
    UPDATE tickmark_events SET payload = ?3
    WHERE id = ?1 AND payload = ?2 AND erased_at IS NULL";

const OUTPUT_RESEAL: &str = "
    UPDATE tickmark_steps SET output = ?4
    WHERE event_seq = ?1 AND position = ?2 AND output = ?3";

/// The events of subject ?1 not erased (but ?2), and whether each runs
/// under a live lease (at ?3). Read inside the write transaction.
const SUBJECT_EVENTS: &str = "
    SELECT id, (state = 'running' AND due_at > ?3) AS live,
           state IN ('pending', 'running', 'dead', 'parked') AS active
    FROM tickmark_events
    WHERE subjects IS NOT NULL AND instr(' ' || subjects || ' ', ' ' || ?1 || ' ') > 0
      AND erased_at IS NULL AND (?2 IS NULL OR id <> ?2)
    ORDER BY id";

/// Erase event ?1 at ?2 (see PostgreSQL's `EVENTS_ERASE`); answers its row
/// number, or nothing when it was erased already or runs under a live lease.
const EVENT_ERASE: &str = "
    UPDATE tickmark_events
    SET payload = 'null', erased_at = ?2, last_error = NULL,
        progress = NULL, progress_message = NULL,
        state = CASE WHEN state IN ('pending', 'running', 'dead', 'parked')
                     THEN 'cancelled' ELSE state END,
        finished_at = coalesce(finished_at, ?2),
        lease_token = lease_token + 1,
        wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = ?1 AND erased_at IS NULL AND NOT (state = 'running' AND due_at > ?2)
    RETURNING id";

const STEPS_ERASE: &str =
    "UPDATE tickmark_steps SET output = NULL, last_error = NULL WHERE event_seq = ?1";

const AUDIT_ERASE: &str =
    "UPDATE tickmark_audit SET reason = NULL, detail = NULL WHERE event_seq = ?1";

const MATCH_KEYS_ERASE: &str = "DELETE FROM tickmark_match_keys WHERE event_seq = ?1";

const ERASE_AUDIT: &str = "
    INSERT INTO tickmark_audit (event_seq, at, actor, action, reason, detail)
    VALUES (?1, ?2, ?3, 'erase', ?4,
            'payload, outputs and free text erased; dedup keys and step states kept')";

/// Zero the space the next statements free in the pages they rewrite (an
/// erased payload, a value sealed with a retired key), and free pages too,
/// instead of leaving the old bytes in them; answers the connection's
/// setting before, which [`secure_delete_restore`] puts back before the
/// connection goes back to the pool. Per connection, so set inside the
/// write transaction.
async fn secure_delete(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
) -> Result<i64, StoreError> {
    let before: i64 = sqlx::query_scalar("PRAGMA secure_delete")
        .fetch_one(&mut **tx)
        .await?;
    sqlx::query("PRAGMA secure_delete = ON")
        .execute(&mut **tx)
        .await?;
    Ok(before)
}

/// Put back the connection's `secure_delete` setting (0, 1, or 2: fast).
async fn secure_delete_restore(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    before: i64,
) -> Result<(), StoreError> {
    let pragma = match before {
        0 => "PRAGMA secure_delete = OFF",
        1 => "PRAGMA secure_delete = ON",
        _ => "PRAGMA secure_delete = FAST",
    };
    sqlx::query(pragma).execute(&mut **tx).await?;
    Ok(())
}

impl SqliteStore {
    /// Copy the rewritten pages into the file and empty the WAL, which
    /// still holds the pages as they were. Best effort: a reader holding an
    /// old snapshot keeps them until a later checkpoint.
    async fn checkpoint(&self) {
        if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await
        {
            tracing::warn!(%error, "the WAL checkpoint after an erasure or a re-seal failed; the next checkpoint copies it");
        }
    }

    pub(super) async fn registered_keys(&self) -> Result<Vec<RegisteredKey>, StoreError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(KEYS_REGISTERED)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|(key_id, key_check, registered_at)| {
                Ok(RegisteredKey {
                    key_id,
                    key_check,
                    registered_at: parse_time(&registered_at)?,
                })
            })
            .collect()
    }

    pub(super) async fn register_key(
        &self,
        key_id: &str,
        key_check: &str,
    ) -> Result<String, StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        sqlx::query(KEY_REGISTER)
            .bind(key_id)
            .bind(key_check)
            .bind(format_time(self.clock.now()))
            .execute(&mut *tx)
            .await?;
        let recorded: String = sqlx::query_scalar(KEY_CHECK)
            .bind(key_id)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        drop(turn);
        Ok(recorded)
    }

    pub(super) async fn retire_key(&self, key_id: &str) -> Result<(), StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        sqlx::query(KEY_RETIRE)
            .bind(key_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        drop(turn);
        Ok(())
    }

    pub(super) async fn stored_values_page(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredValues>, StoreError> {
        let payloads: Vec<(i64, String)> = sqlx::query_as(PAYLOADS_PAGE)
            .bind(after_seq)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        let seqs: Vec<i64> = payloads.iter().map(|(seq, _)| *seq).collect();
        let seqs = serde_json::to_string(&seqs).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let outputs: Vec<(i64, i32, String)> = sqlx::query_as(OUTPUTS_OF)
            .bind(seqs)
            .fetch_all(&self.pool)
            .await?;
        Ok(join_outputs(payloads, outputs))
    }

    pub(super) async fn reseal_values(&self, reseals: &[Reseal<'_>]) -> Result<u64, StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        let secure_delete_before = secure_delete(&mut tx).await?;
        let mut written = 0;
        for reseal in reseals {
            let done = match reseal.position {
                None => {
                    sqlx::query(PAYLOAD_RESEAL)
                        .bind(reseal.event_seq)
                        .bind(reseal.old_json)
                        .bind(reseal.new_json)
                        .execute(&mut *tx)
                        .await?
                }
                Some(position) => {
                    sqlx::query(OUTPUT_RESEAL)
                        .bind(reseal.event_seq)
                        .bind(position)
                        .bind(reseal.old_json)
                        .bind(reseal.new_json)
                        .execute(&mut *tx)
                        .await?
                }
            };
            written += done.rows_affected();
        }
        secure_delete_restore(&mut tx, secure_delete_before).await?;
        tx.commit().await?;
        self.checkpoint().await;
        drop(turn);
        Ok(written)
    }

    pub(super) async fn erase_subject(
        &self,
        erase: &SubjectErase<'_>,
    ) -> Result<ErasedBatch, StoreError> {
        let (turn, mut tx) = self.begin_write().await?;
        let secure_delete_before = secure_delete(&mut tx).await?;
        let now = format_time(self.clock.now());
        let found: Vec<(i64, bool, bool)> = sqlx::query_as(SUBJECT_EVENTS)
            .bind(erase.subject_hash)
            .bind(erase.except_event)
            .bind(&now)
            .fetch_all(&mut *tx)
            .await?;
        let active: Vec<i64> = found
            .iter()
            .filter(|(_, _, active)| *active)
            .map(|(seq, ..)| *seq)
            .collect();
        let found = found
            .into_iter()
            .map(|(seq, live, _)| (seq, live))
            .collect();
        let (running, ended) = split_live(found, erase.batch);
        let mut batch = ErasedBatch {
            running,
            ..ErasedBatch::default()
        };
        for seq in ended {
            let erased: Option<i64> = sqlx::query_scalar(EVENT_ERASE)
                .bind(seq)
                .bind(&now)
                .fetch_optional(&mut *tx)
                .await?;
            if erased.is_none() {
                continue;
            }
            for statement in [STEPS_ERASE, AUDIT_ERASE, MATCH_KEYS_ERASE] {
                sqlx::query(statement).bind(seq).execute(&mut *tx).await?;
            }
            sqlx::query(ERASE_AUDIT)
                .bind(seq)
                .bind(&now)
                .bind(erase.actor)
                .bind(erase.reason)
                .execute(&mut *tx)
                .await?;
            batch.erased.push(seq);
            if active.contains(&seq) {
                batch.cancelled.push(seq);
            }
        }
        secure_delete_restore(&mut tx, secure_delete_before).await?;
        tx.commit().await?;
        self.checkpoint().await;
        drop(turn);
        Ok(batch)
    }
}
