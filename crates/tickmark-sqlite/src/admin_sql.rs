//! The SQLite store's operator statements (see `store::admin`). Every
//! transition runs in one `BEGIN IMMEDIATE` transaction: it reads the event,
//! then changes it with an `UPDATE` that filters on the states it allows and
//! increments `lease_token`, so a worker still holding an older lease can
//! change nothing. Times are bound as fixed-width UTC text (`?now`).

/// The columns of an `EventRecord`, as `record_from_row` reads them.
macro_rules! record_columns {
    () => {
        "id, source, dedup_key, kind, payload, received_at, state, step_count, next_step, \
         attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at, \
         traceparent, tracestate, erased_at"
    };
}

/// Events by (state, source).
pub const STATUS_COUNTS: &str =
    "SELECT state, source, count(*) FROM tickmark_events GROUP BY state, source";

/// Events finished (done) after ?2 (now minus the window), bucketed by whole
/// minutes before ?1 (now): bucket 0 is the minute before now.
pub const STATUS_DONE_PER_MINUTE: &str = "
    SELECT CAST((julianday(?1) - julianday(finished_at)) * 1440 AS INTEGER) AS minutes_ago,
           count(*)
    FROM tickmark_events
    WHERE state = 'done' AND finished_at > ?2
    GROUP BY minutes_ago";

/// Events matching optional filters (state, source, kind, received after ?4),
/// newest first.
pub const EVENT_LIST: &str = concat!(
    "SELECT ",
    record_columns!(),
    "
    FROM tickmark_events
    WHERE (?1 IS NULL OR state = ?1)
      AND (?2 IS NULL OR source = ?2)
      AND (?3 IS NULL OR kind = ?3)
      AND (?4 IS NULL OR received_at > ?4)
    ORDER BY id DESC
    LIMIT ?5"
);

/// Events whose dedup key is ?1, within source ?2 when given.
pub const EVENT_BY_DEDUP_KEY: &str = concat!(
    "SELECT ",
    record_columns!(),
    "
    FROM tickmark_events
    WHERE dedup_key = ?1 AND (?2 IS NULL OR source = ?2)
    ORDER BY id"
);

/// The stored plan of one event.
pub const EVENT_PLAN: &str = "SELECT plan FROM tickmark_events WHERE id = ?1";

/// The sources that have events or tombstones.
pub const SOURCES: &str = "
    SELECT source FROM tickmark_events UNION SELECT source FROM tickmark_tombstones
    ORDER BY source";

/// One event's audit trail, oldest first.
pub const AUDIT_LIST: &str = "
    SELECT id, event_seq, at, actor, action, step, reason, detail
    FROM tickmark_audit
    WHERE event_seq = ?1
    ORDER BY id";

/// The event a transition is about (inside the transition's write
/// transaction, so nothing changes it before the transition's `UPDATE`).
pub const ADMIN_EVENT_READ: &str = "
    SELECT state, next_step, step_count, attempt, due_at, lease_owner, last_error, finished_at,
           plan, wait_until
    FROM tickmark_events
    WHERE id = ?1";

/// Re-queue event ?1 at step ?2: from dead, parked or cancelled; from done only
/// when re-running from a chosen step (?3); from running only when forced (?4)
/// and the lease has expired (before ?5, now); never an erased event (its
/// payload is gone: docs/privacy.md). Fences out any old lease.
pub const EVENT_RETRY: &str = concat!(
    "UPDATE tickmark_events
    SET state = 'pending', next_step = ?2, due_at = ?5, attempt = 0, interrupted = 0, suspect = 0, lease_owner = NULL,
        finished_at = NULL, last_error = NULL, lease_token = lease_token + 1,
        snoozed = 0, progress = NULL, progress_message = NULL,
        wait_key = NULL, wait_since = NULL, wait_until = NULL,
        resource_seq = CASE WHEN state = 'stale' THEN NULL ELSE resource_seq END
    WHERE id = ?1 AND erased_at IS NULL
      AND (state IN ('dead', 'parked', 'cancelled', 'stale')
           OR (state = 'done' AND ?3)
           OR (state = 'running' AND ?4 AND due_at <= ?5))
    RETURNING ",
    record_columns!()
);

/// Forget the marks of steps at positions ?2 and later of event ?1: they run
/// again (with the same idempotency keys).
pub const STEPS_FORGET_FROM: &str =
    "DELETE FROM tickmark_steps WHERE event_seq = ?1 AND position >= ?2";

/// End the wait of event ?1's current step now: deadline and due time
/// become now (?2), so a worker settles it as a timeout. Only while it
/// waits.
pub const EVENT_END_WAIT: &str = concat!(
    "UPDATE tickmark_events
    SET wait_until = ?2, due_at = ?2, lease_token = lease_token + 1
    WHERE id = ?1 AND state = 'pending' AND wait_until IS NOT NULL
    RETURNING ",
    record_columns!()
);

/// Cancel event ?1 unless it has ended; a worker holding it loses its lease
/// (the token changes), so its next heartbeat or mark fails and it stops.
pub const EVENT_CANCEL: &str = concat!(
    "UPDATE tickmark_events
    SET state = 'cancelled', finished_at = ?2, lease_token = lease_token + 1,
        wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = ?1 AND state IN ('pending', 'running', 'dead', 'parked')
    RETURNING ",
    record_columns!()
);

/// Give ignored event ?1 the plan ?2 of ?3 steps, ordered by resource ?4 at
/// sequence ?5, limited by key ?6 to ?7 at once, claimed for tenant ?9 with
/// a head start of ?10 ms: pending at its first step, due now (?8). Only
/// from ignored.
pub const EVENT_REPLAN: &str = concat!(
    "UPDATE tickmark_events
    SET state = 'pending', plan = ?2, step_count = ?3, next_step = 0, attempt = 0,
        due_at = ?8, finished_at = NULL, last_error = NULL, lease_token = lease_token + 1,
        resource_key = ?4, resource_seq = ?5, limit_key = ?6, limit_n = ?7, tenant_key = ?9,
        head_start_ms = ?10
    WHERE id = ?1 AND state = 'ignored' AND erased_at IS NULL
    RETURNING ",
    record_columns!()
);

/// Move event ?1 past its current step ?2 (skipped or done by hand): done
/// after the last step, otherwise pending and due now (?3) with a fresh attempt
/// count. Not while a worker holds a live lease on it.
pub const EVENT_SETTLE_STEP: &str = concat!(
    "UPDATE tickmark_events
    SET next_step = next_step + 1,
        state = CASE WHEN next_step + 1 >= step_count THEN 'done' ELSE 'pending' END,
        finished_at = CASE WHEN next_step + 1 >= step_count THEN ?3 END,
        due_at = ?3, attempt = 0, interrupted = 0, suspect = 0, lease_owner = NULL, last_error = NULL,
        lease_token = lease_token + 1, snoozed = 0,
        progress = NULL, progress_message = NULL,
        wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = ?1 AND next_step = ?2
      AND (state IN ('pending', 'dead', 'parked') OR (state = 'running' AND due_at <= ?3))
    RETURNING ",
    record_columns!()
);

/// Record step ?2 of event ?1 as ?4 (`skipped` or `done`) by hand at ?7, under
/// the action's new token ?6, replacing any failed or dead mark.
pub const STEP_UPSERT_BY_HAND: &str = "
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output,
         last_error)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8, ?9)
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = excluded.state, attempts = excluded.attempts, lease_token = excluded.lease_token,
        started_at = NULL, finished_at = excluded.finished_at, output = excluded.output,
        last_error = excluded.last_error";

/// Record a manual action on event ?1 at ?2.
pub const AUDIT_INSERT: &str = "
    INSERT INTO tickmark_audit (event_seq, at, actor, action, step, reason, detail)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// The finished events a prune batch deletes: up to ?3 received before ?1
/// (dead ones too when ?2), oldest first, with the keys their tombstones keep.
pub const EVENT_PRUNE_PICK: &str = "
    SELECT id, source, dedup_key, replay_key, received_at FROM tickmark_events
    WHERE (state IN ('done', 'ignored', 'cancelled', 'stale', 'superseded') OR (?2 AND state = 'dead'))
      AND received_at < ?1
    ORDER BY id
    LIMIT ?3";

/// A tombstone for one key of an event being pruned.
pub const TOMBSTONE_KEEP: &str = "
    INSERT INTO tickmark_tombstones (source, key_hash, accepted_at) VALUES (?1, ?2, ?3)
    ON CONFLICT (source, key_hash) DO UPDATE SET accepted_at = max(accepted_at, excluded.accepted_at)";

/// Delete the picked events (a JSON array of row numbers); their steps, match
/// keys and audit rows go with them (`ON DELETE CASCADE`, the store turns
/// foreign keys on).
pub const EVENT_PRUNE: &str = "
    DELETE FROM tickmark_events WHERE id IN (SELECT value FROM json_each(?1))";

/// Set tenant ?1's weight to ?2, at ?3.
pub const TENANT_WEIGHT_SET: &str = "
    INSERT INTO tickmark_tenants (tenant_key, weight, weight_set_at) VALUES (?1, ?2, ?3)
    ON CONFLICT (tenant_key) DO UPDATE
    SET weight = excluded.weight, weight_set_at = excluded.weight_set_at";

/// The tenants with unfinished events, most first, and those whose weight
/// was set; at most ?2 (?1: now).
pub const TENANTS: &str = "
    WITH queued AS (
        SELECT tenant_key,
               sum(state = 'pending') AS pending,
               sum(state = 'running') AS running,
               min(CASE WHEN state = 'pending' AND due_at <= ?1 THEN due_at END) AS oldest_due_at
        FROM tickmark_events
        WHERE state IN ('pending', 'running') AND tenant_key IS NOT NULL
        GROUP BY tenant_key
    ),
    named AS (
        SELECT tenant_key FROM queued
        UNION
        SELECT tenant_key FROM tickmark_tenants WHERE weight_set_at IS NOT NULL
    )
    SELECT n.tenant_key, coalesce(w.weight, 1.0), coalesce(q.pending, 0),
           coalesce(q.running, 0), q.oldest_due_at
    FROM named AS n
    LEFT JOIN queued AS q ON q.tenant_key = n.tenant_key
    LEFT JOIN tickmark_tenants AS w ON w.tenant_key = n.tenant_key
    ORDER BY coalesce(q.pending, 0) + coalesce(q.running, 0) DESC, 1
    LIMIT ?2";

/// Delete up to ?2 tombstones of events accepted before ?1, oldest first.
pub const TOMBSTONE_PRUNE: &str = "
    DELETE FROM tickmark_tombstones
    WHERE (source, key_hash) IN (
        SELECT source, key_hash FROM tickmark_tombstones
        WHERE accepted_at < ?1
        ORDER BY accepted_at
        LIMIT ?2
    )";

/// A concurrency-limited event's key and limit.
pub const EVENT_KEY: &str =
    "SELECT limit_key, limit_n FROM tickmark_events WHERE id = ?1 AND limit_key IS NOT NULL";

/// The events holding a key's slots: running under a live lease (?2 is now).
pub const KEY_HOLDERS: &str = "
    SELECT id, dedup_key FROM tickmark_events
    WHERE limit_key = ?1 AND state = 'running' AND due_at > ?2
    ORDER BY id LIMIT 10";

/// Up to `?2` events of subject hash `?1`, not erased, oldest first (a
/// data request's answer).
pub const SUBJECT_EVENTS: &str = concat!(
    "SELECT ",
    record_columns!(),
    "
    FROM tickmark_events
    WHERE subjects IS NOT NULL AND instr(' ' || subjects || ' ', ' ' || ?1 || ' ') > 0
      AND erased_at IS NULL
    ORDER BY id LIMIT ?2"
);
