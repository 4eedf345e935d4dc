//! Personal data on PostgreSQL (migration 0021, docs/privacy.md): the
//! registered keys, a rotation's pages and re-seals, and the erasure of a
//! subject's events.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use tickmark_driver::store::privacy::{
    ErasedBatch, RegisteredKey, Reseal, StoredValues, SubjectErase,
};
use tickmark_driver::store::StoreError;

/// The keys not retired, oldest first.
const KEYS_REGISTERED: &str =
    "SELECT key_id, key_check, registered_at FROM tickmark_keys ORDER BY registered_at, key_id";

/// Register key `$1` with check `$2` unless its id is known; answers the
/// check recorded under the id (the one just written, or the older one).
const KEY_REGISTER: &str = "
    WITH registered AS (
        INSERT INTO tickmark_keys (key_id, key_check) VALUES ($1, $2)
        ON CONFLICT (key_id) DO NOTHING
        RETURNING key_check
    )
    SELECT key_check FROM registered
    UNION ALL
    SELECT key_check FROM tickmark_keys WHERE key_id = $1
    LIMIT 1";

const KEY_RETIRE: &str = "DELETE FROM tickmark_keys WHERE key_id = $1";

/// Up to `$2` events after row `$1`, not erased, with their payloads as stored.
const PAYLOADS_PAGE: &str = "
    SELECT id, payload::text FROM tickmark_events
    WHERE id > $1 AND erased_at IS NULL
    ORDER BY id LIMIT $2";

/// The stored outputs of events `$1`.
const OUTPUTS_OF: &str = "
    SELECT event_seq, position, output::text FROM tickmark_steps
    WHERE event_seq = ANY($1) AND output IS NOT NULL
    ORDER BY event_seq, position";

/// Event `$1`'s payload becomes `$3`, if it is still `$2` and not erased.
const PAYLOAD_RESEAL: &str = "
    UPDATE tickmark_events SET payload = $3::json
    WHERE id = $1 AND payload::text = $2 AND erased_at IS NULL";

/// Event `$1`'s output at position `$2` becomes `$4`, if it is still `$3`.
const OUTPUT_RESEAL: &str = "
    UPDATE tickmark_steps SET output = $4::json
    WHERE event_seq = $1 AND position = $2 AND output::text = $3";

/// The events of subject `$1` not erased (but `$2`), locked: their row
/// numbers, and whether each runs under a live lease. The first `$3` that
/// do not are erased; all that do are reported.
const SUBJECT_EVENTS: &str = "
    SELECT id, (state = 'running' AND due_at > now()) AS live
    FROM tickmark_events
    WHERE subjects IS NOT NULL AND string_to_array(subjects, ' ') @> ARRAY[$1::text]
      AND erased_at IS NULL AND ($2::bigint IS NULL OR id <> $2)
    ORDER BY id
    FOR UPDATE";

/// Erase events `$1`: payload, error and progress text gone; an event that
/// had not ended is cancelled, and any lease on it fenced out, as an
/// operator's cancel does. Answers the ones cancelled.
const EVENTS_ERASE: &str = "
    UPDATE tickmark_events AS e
    SET payload = 'null'::json, erased_at = now(), last_error = NULL,
        progress = NULL, progress_message = NULL,
        state = CASE WHEN e.state IN ('pending', 'running', 'dead', 'parked')
                     THEN 'cancelled' ELSE e.state END,
        finished_at = coalesce(e.finished_at, now()),
        lease_token = e.lease_token + 1,
        wait_key = NULL, wait_since = NULL, wait_until = NULL
    FROM (SELECT id, state AS was FROM tickmark_events WHERE id = ANY($1)) AS before
    WHERE e.id = before.id AND e.erased_at IS NULL
      AND NOT (e.state = 'running' AND e.due_at > now())
    RETURNING e.id, before.was IN ('pending', 'running', 'dead', 'parked') AS cancelled";

/// Events `$1`'s steps lose their outputs and errors; their rows stay.
const STEPS_ERASE: &str =
    "UPDATE tickmark_steps SET output = NULL, last_error = NULL WHERE event_seq = ANY($1)";

/// Events `$1`'s audit rows lose their free text.
const AUDIT_ERASE: &str =
    "UPDATE tickmark_audit SET reason = NULL, detail = NULL WHERE event_seq = ANY($1)";

/// Events `$1` are no longer matched by waits: their match keys came from
/// their payloads.
const MATCH_KEYS_ERASE: &str = "DELETE FROM tickmark_match_keys WHERE event_seq = ANY($1)";

/// An `erase` audit row for each of events `$1`, by `$2`, because `$3`.
const ERASE_AUDIT: &str = "
    INSERT INTO tickmark_audit (event_seq, actor, action, reason, detail)
    SELECT id, $2, 'erase', $3, 'payload, outputs and free text erased; dedup keys and step states kept'
    FROM unnest($1::bigint[]) AS id";

impl PostgresStore {
    pub(super) async fn registered_keys(&self) -> Result<Vec<RegisteredKey>, StoreError> {
        let rows: Vec<(String, String, DateTime<Utc>)> =
            sqlx::query_as(KEYS_REGISTERED).fetch_all(&self.db).await?;
        Ok(rows
            .into_iter()
            .map(|(key_id, key_check, registered_at)| RegisteredKey {
                key_id,
                key_check,
                registered_at,
            })
            .collect())
    }

    pub(super) async fn register_key(
        &self,
        key_id: &str,
        key_check: &str,
    ) -> Result<String, StoreError> {
        Ok(sqlx::query_scalar(KEY_REGISTER)
            .bind(key_id)
            .bind(key_check)
            .fetch_one(&self.db)
            .await?)
    }

    pub(super) async fn retire_key(&self, key_id: &str) -> Result<(), StoreError> {
        sqlx::query(KEY_RETIRE)
            .bind(key_id)
            .execute(&self.db)
            .await?;
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
            .fetch_all(&self.db)
            .await?;
        let seqs: Vec<i64> = payloads.iter().map(|(seq, _)| *seq).collect();
        let outputs: Vec<(i64, i32, String)> = sqlx::query_as(OUTPUTS_OF)
            .bind(&seqs)
            .fetch_all(&self.db)
            .await?;
        Ok(tickmark_driver::store::privacy::join_outputs(
            payloads, outputs,
        ))
    }

    pub(super) async fn reseal_values(&self, reseals: &[Reseal<'_>]) -> Result<u64, StoreError> {
        let mut tx = self.db.begin().await?;
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
        tx.commit().await?;
        Ok(written)
    }

    pub(super) async fn erase_subject(
        &self,
        erase: &SubjectErase<'_>,
    ) -> Result<ErasedBatch, StoreError> {
        let mut tx = self.db.begin().await?;
        let found: Vec<(i64, bool)> = sqlx::query_as(SUBJECT_EVENTS)
            .bind(erase.subject_hash)
            .bind(erase.except_event)
            .fetch_all(&mut *tx)
            .await?;
        let (running, ended) = tickmark_driver::store::privacy::split_live(found, erase.batch);
        let erased: Vec<(i64, bool)> = sqlx::query_as(EVENTS_ERASE)
            .bind(&ended)
            .fetch_all(&mut *tx)
            .await?;
        let erased_seqs: Vec<i64> = erased.iter().map(|(seq, _)| *seq).collect();
        for statement in [STEPS_ERASE, AUDIT_ERASE, MATCH_KEYS_ERASE] {
            sqlx::query(statement)
                .bind(&erased_seqs)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(ERASE_AUDIT)
            .bind(&erased_seqs)
            .bind(erase.actor)
            .bind(erase.reason)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(ErasedBatch {
            cancelled: erased
                .iter()
                .filter(|(_, cancelled)| *cancelled)
                .map(|(seq, _)| *seq)
                .collect(),
            erased: erased_seqs,
            running,
        })
    }
}
