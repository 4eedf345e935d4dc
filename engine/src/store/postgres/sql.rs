//! The PostgreSQL store's statements, one per transition. Each transition of a
//! leased event filters on the expected state and the fencing token.

/// Insert unless the dedup key exists. `ON CONFLICT DO NOTHING` makes the
/// unique index the judge: of concurrent duplicates exactly one returns a row.
pub const EVENT_INSERT: &str = "
    INSERT INTO tickmark_events (source, dedup_key, kind, payload, plan, state, step_count, due_at)
    VALUES ($1, $2, $3, $4::json, $5::json, $6, $7, coalesce($8, now()))
    ON CONFLICT (source, dedup_key) DO NOTHING
    RETURNING id";

/// The same, and wake listening workers when a row was inserted (the NOTIFY is
/// delivered at commit, and only then).
pub const EVENT_INSERT_AND_NOTIFY: &str = "
    WITH inserted AS (
        INSERT INTO tickmark_events (source, dedup_key, kind, payload, plan, state, step_count, due_at)
        VALUES ($1, $2, $3, $4::json, $5::json, $6, $7, coalesce($8, now()))
        ON CONFLICT (source, dedup_key) DO NOTHING
        RETURNING id
    )
    SELECT inserted.id FROM inserted CROSS JOIN LATERAL pg_notify($9, '') AS notified";

/// Lease due events in one statement. The CTE walks `tickmark_events_due` in
/// its exact order (no sort of the backlog) and locks with SKIP LOCKED, so
/// concurrent claimers take different rows instead of queueing. Running rows
/// whose lease expired are due too: that is how a dead worker's event is taken
/// over, with a new fencing token that fences the old worker out.
pub const EVENT_CLAIM_MANY: &str = "
    WITH due AS (
        SELECT id, state AS was_state
        FROM tickmark_events
        WHERE state IN ('pending', 'running') AND due_at <= now()
        ORDER BY due_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    UPDATE tickmark_events AS e
    SET state = 'running',
        lease_owner = $1,
        lease_token = e.lease_token + 1,
        due_at = now() + make_interval(secs => $3),
        attempt = e.attempt + 1,
        step_started_at = now(),
        takeovers = e.takeovers + CASE WHEN due.was_state = 'running' THEN 1 ELSE 0 END,
        last_error = CASE WHEN due.was_state = 'running'
            THEN 'interrupted: the lease of ' || coalesce(e.lease_owner, 'a worker')
                 || ' expired before step ' || e.next_step
                 || ' was marked; re-running it with the same idempotency key'
            ELSE e.last_error END
    FROM due
    WHERE e.id = due.id
    RETURNING e.id, e.source, e.dedup_key, e.kind, e.payload::text AS payload, e.received_at,
              e.plan::text AS plan, e.next_step, e.attempt, e.lease_token,
              (due.was_state = 'running') AS took_over";

/// Extend every lease still held under its token; an expired lease is not revived.
pub const EVENT_HEARTBEAT_MANY: &str = "
    UPDATE tickmark_events AS e
    SET due_at = now() + make_interval(secs => $3)
    FROM unnest($1::bigint[], $2::bigint[]) AS held (id, token)
    WHERE e.id = held.id AND e.lease_token = held.token
      AND e.state = 'running' AND e.due_at > now()
    RETURNING e.id";

/// Hand a leased event back at once (refunding the attempt when `$4`: the
/// step never started), and wake the other workers.
pub const EVENT_RELEASE: &str = "
    WITH released AS (
        UPDATE tickmark_events
        SET state = 'pending', due_at = now(),
            attempt = CASE WHEN $4 THEN greatest(attempt - 1, 0) ELSE attempt END
        WHERE id = $1 AND lease_token = $2 AND state = 'running'
        RETURNING id
    )
    SELECT released.id FROM released CROSS JOIN LATERAL pg_notify($3, '') AS notified";

/// Park a leased event whose plan this build cannot run.
pub const EVENT_PARK: &str = "
    UPDATE tickmark_events
    SET state = 'parked', last_error = $3, finished_at = now(), attempt = greatest(attempt - 1, 0)
    WHERE id = $1 AND lease_token = $2 AND state = 'running'";

/// Seconds until the earliest active row falls due: the first entry of the index.
pub const EVENT_NEXT_DUE: &str = "
    SELECT greatest(extract(epoch FROM (due_at - now())), 0)::float8
    FROM tickmark_events
    WHERE state IN ('pending', 'running')
    ORDER BY due_at, id
    LIMIT 1";

/// Pending or running events.
pub const EVENT_COUNT_ACTIVE: &str =
    "SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')";

/// Events per state.
pub const EVENT_COUNT_BY_STATE: &str =
    "SELECT state, count(*) FROM tickmark_events GROUP BY state ORDER BY state";

/// Seconds the oldest due pending event has waited.
pub const EVENT_OLDEST_PENDING_AGE: &str = "
    SELECT extract(epoch FROM (now() - min(due_at)))::float8 FROM tickmark_events
    WHERE state = 'pending' AND due_at <= now()";

/// One event by row number.
pub const EVENT_GET: &str = "
    SELECT id, source, dedup_key, kind, payload::text AS payload, received_at, state, step_count,
           next_step, attempt, due_at, lease_owner, lease_token, takeovers, last_error, finished_at
    FROM tickmark_events WHERE id = $1";

/// One event by dedup key.
pub const EVENT_FIND: &str = "
    SELECT id, source, dedup_key, kind, payload::text AS payload, received_at, state, step_count,
           next_step, attempt, due_at, lease_owner, lease_token, takeovers, last_error, finished_at
    FROM tickmark_events WHERE source = $1 AND dedup_key = $2";

/// Outputs of the done steps, for resuming.
pub const STEP_OUTPUTS: &str = "
    SELECT position, output::text FROM tickmark_steps
    WHERE event_id = $1 AND state IN ('done', 'skipped')
    ORDER BY position";

/// Mark step `$3` done under lease (`$1`, `$2`) and advance the event; the last
/// step's mark also finishes the event. The event update filters on state,
/// token, position and an unexpired lease: if it changes nothing, nothing is
/// inserted either.
pub const STEP_MARK_DONE: &str = "
    WITH advanced AS (
        UPDATE tickmark_events
        SET next_step = next_step + 1,
            state = CASE WHEN next_step + 1 >= step_count THEN 'done' ELSE 'running' END,
            attempt = CASE WHEN next_step + 1 >= step_count THEN attempt ELSE 1 END,
            finished_at = CASE WHEN next_step + 1 >= step_count THEN now() END,
            step_started_at = now(),
            last_error = NULL
        WHERE id = $1 AND lease_token = $2 AND state = 'running' AND next_step = $3
          AND due_at > now()
        RETURNING id
    )
    INSERT INTO tickmark_steps
        (event_id, position, name, state, attempts, lease_token, started_at, finished_at, output)
    SELECT id, $3, $4, 'done', $5, $2, $6, $7, $8::json FROM advanced
    ON CONFLICT (event_id, position) DO UPDATE
    SET state = 'done', attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        output = EXCLUDED.output, last_error = NULL";

/// Record a failed attempt under lease (`$1`, `$2`): schedule the retry in
/// `$10` seconds, or dead-letter the event when `$9`.
pub const STEP_MARK_FAILED: &str = "
    WITH failed AS (
        UPDATE tickmark_events
        SET state = CASE WHEN $9 THEN 'dead' ELSE 'pending' END,
            due_at = now() + make_interval(secs => $10),
            attempt = $5,
            last_error = $8,
            finished_at = CASE WHEN $9 THEN now() END
        WHERE id = $1 AND lease_token = $2 AND state = 'running' AND next_step = $3
          AND due_at > now()
        RETURNING id
    )
    INSERT INTO tickmark_steps
        (event_id, position, name, state, attempts, lease_token, started_at, finished_at, last_error)
    SELECT id, $3, $4, CASE WHEN $9 THEN 'dead' ELSE 'failed' END, $5, $2, $6, $7, $8 FROM failed
    ON CONFLICT (event_id, position) DO UPDATE
    SET state = EXCLUDED.state, attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        last_error = EXCLUDED.last_error";

/// Whether a mark that changed nothing had in fact been applied under this
/// token (a commit whose answer was lost, then retried).
pub const STEP_MARK_CONFIRM: &str = "
    SELECT 1 FROM tickmark_steps
    WHERE event_id = $1 AND position = $2 AND lease_token = $3 AND state = $4";

/// The step-status table of one event.
pub const STEP_STATUS: &str = "
    SELECT position, step, idempotency_key, state, attempts, started_at, finished_at, retry_at,
           lease_until, worker, last_error, output::text AS output
    FROM tickmark_step_status
    WHERE event_seq = $1
    ORDER BY position";
