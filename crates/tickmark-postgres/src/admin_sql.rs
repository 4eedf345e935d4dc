//! The PostgreSQL store's operator statements (see `store::admin`). Every
//! transition locks the event (`ADMIN_EVENT_LOCK`), then changes it with an
//! `UPDATE` that filters on the states the transition allows and increments
//! `lease_token`, so a worker still holding an older lease can change nothing.

/// The columns of an `EventRecord`, as `record_from_row` reads them.
macro_rules! record_columns {
    () => {
        "id, source, dedup_key, kind, payload::text AS payload, received_at, state, step_count, \
         next_step, attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at, \
         traceparent, tracestate, erased_at"
    };
}

/// Events by (state, source).
pub const STATUS_COUNTS: &str =
    "SELECT state, source, count(*) FROM tickmark_events GROUP BY state, source";

/// Events finished (done) in each of the last `$1` minutes: bucket 0 is the
/// minute before now.
pub const STATUS_DONE_PER_MINUTE: &str = "
    SELECT floor(extract(epoch FROM (now() - finished_at)) / 60)::int AS minutes_ago, count(*)
    FROM tickmark_events
    WHERE state = 'done' AND finished_at > now() - make_interval(mins => $1)
    GROUP BY minutes_ago";

/// Events matching optional filters (state, source, kind, received within `$4`
/// seconds), newest first.
pub const EVENT_LIST: &str = concat!(
    "SELECT ",
    record_columns!(),
    "
    FROM tickmark_events
    WHERE ($1::text IS NULL OR state = $1)
      AND ($2::text IS NULL OR source = $2)
      AND ($3::text IS NULL OR kind = $3)
      AND ($4::float8 IS NULL OR received_at > now() - make_interval(secs => $4))
    ORDER BY id DESC
    LIMIT $5"
);

/// Events whose dedup key is `$1`, within source `$2` when given.
pub const EVENT_BY_DEDUP_KEY: &str = concat!(
    "SELECT ",
    record_columns!(),
    "
    FROM tickmark_events
    WHERE dedup_key = $1 AND ($2::text IS NULL OR source = $2)
    ORDER BY id"
);

/// The stored plan of one event.
pub const EVENT_PLAN: &str = "SELECT plan::text FROM tickmark_events WHERE id = $1";

/// The sources that have events or tombstones.
pub const SOURCES: &str = "
    SELECT source FROM tickmark_events UNION SELECT source FROM tickmark_tombstones
    ORDER BY source";

/// One event's audit trail, oldest first.
pub const AUDIT_LIST: &str = "
    SELECT id, event_seq, at, actor, action, step, reason, detail
    FROM tickmark_audit
    WHERE event_seq = $1
    ORDER BY id";

/// The event a transition is about, locked until the transition commits (a worker's
/// claim skips it meanwhile; a worker's mark waits, then finds the new token).
/// `lease_expired` uses the same clock as leases: the database's.
pub const ADMIN_EVENT_LOCK: &str = "
    SELECT state, next_step, step_count, attempt, due_at, (due_at <= now()) AS lease_expired,
           lease_owner, last_error, finished_at, plan::text AS plan, wait_until
    FROM tickmark_events
    WHERE id = $1
    FOR UPDATE";

/// Re-queue event `$1` at step `$2`: from dead, parked or cancelled; from done
/// only when re-running from a chosen step (`$3`); from running only when
/// forced (`$4`) and the lease has expired; never an erased event (its
/// payload is gone: docs/privacy.md). Fences out any old lease.
pub const EVENT_RETRY: &str = concat!(
    "UPDATE tickmark_events
    SET state = 'pending', next_step = $2, due_at = now(), attempt = 0, interrupted = 0, suspect = false, lease_owner = NULL,
        finished_at = NULL, last_error = NULL, lease_token = lease_token + 1,
        snoozed = false, progress = NULL, progress_message = NULL,
        wait_key = NULL, wait_since = NULL, wait_until = NULL,
        resource_seq = CASE WHEN state = 'stale' THEN NULL ELSE resource_seq END
    WHERE id = $1 AND erased_at IS NULL
      AND (state IN ('dead', 'parked', 'cancelled', 'stale')
           OR (state = 'done' AND $3)
           OR (state = 'running' AND $4 AND due_at <= now()))
    RETURNING ",
    record_columns!()
);

/// Forget the marks of steps at positions `$2` and later of event `$1`: they
/// run again (with the same idempotency keys).
pub const STEPS_FORGET_FROM: &str =
    "DELETE FROM tickmark_steps WHERE event_seq = $1 AND position >= $2";

/// End the wait of event $1's current step now: deadline and due time
/// become now (now()), so a worker settles it as a timeout. Only while it
/// waits.
pub const EVENT_END_WAIT: &str = concat!(
    "UPDATE tickmark_events
    SET wait_until = now(), due_at = now(), lease_token = lease_token + 1
    WHERE id = $1 AND state = 'pending' AND wait_until IS NOT NULL
    RETURNING ",
    record_columns!()
);

/// Cancel event `$1` unless it has ended; a worker holding it loses its lease
/// (the token changes), so its next heartbeat or mark fails and it stops.
pub const EVENT_CANCEL: &str = concat!(
    "UPDATE tickmark_events
    SET state = 'cancelled', finished_at = now(), lease_token = lease_token + 1,
        wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = $1 AND state IN ('pending', 'running', 'dead', 'parked')
    RETURNING ",
    record_columns!()
);

/// Give ignored event `$1` the plan `$2` of `$3` steps, ordered by resource
/// `$4` at sequence `$5`, limited by key `$6` to `$7` at once, claimed for
/// tenant `$8` with a head start of `$9` ms: pending at its first step, due
/// now. Only from ignored.
pub const EVENT_REPLAN: &str = concat!(
    "UPDATE tickmark_events
    SET state = 'pending', plan = $2::json, step_count = $3, next_step = 0, attempt = 0,
        due_at = now(), finished_at = NULL, last_error = NULL, lease_token = lease_token + 1,
        resource_key = $4, resource_seq = $5, limit_key = $6, limit_n = $7, tenant_key = $8,
        head_start_ms = $9
    WHERE id = $1 AND state = 'ignored' AND erased_at IS NULL
    RETURNING ",
    record_columns!()
);

/// Move event `$1` past its current step `$2` (skipped or done by hand): done
/// after the last step, otherwise pending and due now with a fresh attempt
/// count. Not while a worker holds a live lease on it.
pub const EVENT_SETTLE_STEP: &str = concat!(
    "UPDATE tickmark_events
    SET next_step = next_step + 1,
        state = CASE WHEN next_step + 1 >= step_count THEN 'done' ELSE 'pending' END,
        finished_at = CASE WHEN next_step + 1 >= step_count THEN now() END,
        due_at = now(), attempt = 0, interrupted = 0, suspect = false, lease_owner = NULL, last_error = NULL,
        lease_token = lease_token + 1, snoozed = false,
        progress = NULL, progress_message = NULL,
        wait_key = NULL, wait_since = NULL, wait_until = NULL
    WHERE id = $1 AND next_step = $2
      AND (state IN ('pending', 'dead', 'parked') OR (state = 'running' AND due_at <= now()))
    RETURNING ",
    record_columns!()
);

/// Record step `$2` of event `$1` as `$4` (`skipped` or `done`) by hand, under
/// the action's new token `$6`, replacing any failed or dead mark.
pub const STEP_UPSERT_BY_HAND: &str = "
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output,
         last_error)
    VALUES ($1, $2, $3, $4, $5, $6, NULL, now(), $7::json, $8)
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = EXCLUDED.state, attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = NULL, finished_at = EXCLUDED.finished_at, output = EXCLUDED.output,
        last_error = EXCLUDED.last_error";

/// Record a manual action on event `$1`.
pub const AUDIT_INSERT: &str = "
    INSERT INTO tickmark_audit (event_seq, actor, action, step, reason, detail)
    VALUES ($1, $2, $3, $4, $5, $6)";

/// Wake listening workers (delivered at commit, and only then).
pub const NOTIFY: &str = "SELECT pg_notify($1, '')";

/// Delete up to $3 finished events received more than $1 seconds ago (dead
/// ones too when $2), oldest first, with their steps (deleted here: migration
/// 0006 dropped that foreign key), match keys and audit rows (`ON DELETE
/// CASCADE`); the number of events deleted. Rows an action holds are skipped,
/// and the state is checked again on the locked row. Those
/// received within the dedup window ($4 seconds) leave a tombstone per key,
/// in the same transaction: an accept of one of their keys that raced this
/// delete finds it when it looks after its insert.
pub const EVENT_PRUNE: &str = "
    WITH gone AS (
    DELETE FROM tickmark_events
    WHERE id IN (
        SELECT id FROM tickmark_events
        WHERE (state IN ('done', 'ignored', 'cancelled', 'stale', 'superseded') OR ($2 AND state = 'dead'))
          AND received_at < now() - make_interval(secs => $1)
        ORDER BY id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    )
    AND (state IN ('done', 'ignored', 'cancelled', 'stale', 'superseded') OR ($2 AND state = 'dead'))
    RETURNING id, source, dedup_key, replay_key, received_at
    ),
    steps AS (
        DELETE FROM tickmark_steps WHERE event_seq IN (SELECT id FROM gone)
    ),
    keys AS (
        DELETE FROM tickmark_match_keys WHERE event_seq IN (SELECT id FROM gone)
    ),
    tombstones AS (
        INSERT INTO tickmark_tombstones (source, key_hash, accepted_at)
        SELECT source, tickmark_key_hash(k.kind, k.key), received_at
        FROM gone
        CROSS JOIN LATERAL (VALUES ('dedup', dedup_key), ('replay', replay_key)) AS k (kind, key)
        WHERE k.key IS NOT NULL AND received_at >= now() - make_interval(secs => $4)
        ON CONFLICT (source, key_hash)
            DO UPDATE SET accepted_at = greatest(tickmark_tombstones.accepted_at, EXCLUDED.accepted_at)
    )
    SELECT count(*) FROM gone";

/// Set tenant $1's weight to $2.
pub const TENANT_WEIGHT_SET: &str = "
    INSERT INTO tickmark_tenants (tenant_key, weight, weight_set_at) VALUES ($1, $2, now())
    ON CONFLICT (tenant_key) DO UPDATE
    SET weight = EXCLUDED.weight, weight_set_at = EXCLUDED.weight_set_at";

/// The tenants with unfinished events (from the claim queue), most first,
/// and those whose weight was set; at most $1.
pub const TENANTS: &str = "
    WITH queued AS (
        SELECT q.tenant_key,
               count(*) FILTER (WHERE e.state = 'pending') AS pending,
               count(*) FILTER (WHERE e.state = 'running') AS running,
               min(e.due_at) FILTER (WHERE e.state = 'pending' AND e.due_at <= now())
                   AS oldest_due_at
        FROM tickmark_queue AS q
        JOIN tickmark_events AS e ON e.id = q.event_seq
        WHERE q.tenant_key IS NOT NULL
        GROUP BY q.tenant_key
    )
    SELECT coalesce(q.tenant_key, w.tenant_key) AS tenant, coalesce(w.weight, 1) AS weight,
           coalesce(q.pending, 0) AS pending, coalesce(q.running, 0) AS running,
           q.oldest_due_at
    FROM queued AS q
    FULL JOIN (SELECT tenant_key, weight FROM tickmark_tenants
               WHERE weight_set_at IS NOT NULL) AS w ON w.tenant_key = q.tenant_key
    ORDER BY coalesce(q.pending, 0) + coalesce(q.running, 0) DESC, 1
    LIMIT $1";

/// Delete up to $2 tombstones of events accepted more than $1 seconds ago,
/// oldest first.
pub const TOMBSTONE_PRUNE: &str = "
    WITH gone AS (
        DELETE FROM tickmark_tombstones
        WHERE (source, key_hash) IN (
            SELECT source, key_hash FROM tickmark_tombstones
            WHERE accepted_at < now() - make_interval(secs => $1)
            ORDER BY accepted_at
            LIMIT $2
            FOR UPDATE SKIP LOCKED
        )
        RETURNING 1
    )
    SELECT count(*) FROM gone";

/// A concurrency-limited event's key and limit.
pub const EVENT_KEY: &str =
    "SELECT limit_key, limit_n FROM tickmark_events WHERE id = $1 AND limit_key IS NOT NULL";

/// The events holding a key's slots: running under a live lease.
pub const KEY_HOLDERS: &str = "
    SELECT e.id, e.dedup_key
    FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.limit_key = $1 AND q.due_at > now()
      AND e.state = 'running' AND e.due_at > now()
    ORDER BY e.id LIMIT 10";

/// Up to `$2` events of subject hash `$1`, not erased, oldest first (a
/// data request's answer).
pub const SUBJECT_EVENTS: &str = concat!(
    "SELECT ",
    record_columns!(),
    "
    FROM tickmark_events
    WHERE subjects IS NOT NULL AND string_to_array(subjects, ' ') @> ARRAY[$1::text]
      AND erased_at IS NULL
    ORDER BY id LIMIT $2"
);
