-- The claim again, in PL/pgSQL: the same statement, the same planner
-- settings, but planned once per connection and kept. A `LANGUAGE sql`
-- function with SET clauses is never inlined, so PostgreSQL planned its
-- statement afresh on every call: a claim at the default concurrency spent
-- more time being planned than running (docs/performance.md).
CREATE OR REPLACE FUNCTION tickmark_claim(
    worker      TEXT,
    batch       INT,
    lease_secs  FLOAT8,
    skip_sources TEXT[],
    skip_kinds  TEXT[]
)
RETURNS TABLE (
    id BIGINT, source TEXT, dedup_key TEXT, kind TEXT, payload TEXT, received_at TIMESTAMPTZ,
    plan TEXT, next_step INT, attempt INT, lease_token BIGINT, took_over BOOLEAN,
    resource_key TEXT, resource_seq BIGINT
)
LANGUAGE plpgsql
VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT e.id, e.state AS was_state
        FROM tickmark_events AS e
        WHERE e.state IN ('pending', 'running') AND e.due_at <= now()
          AND NOT (e.source = ANY(skip_sources))
          AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
          -- An ordered event waits while an earlier one of its resource is unfinished.
          AND NOT EXISTS (
              SELECT 1 FROM tickmark_events AS earlier
              WHERE earlier.resource_key = e.resource_key AND earlier.id < e.id
                AND earlier.state IN ('pending', 'running'))
        ORDER BY e.due_at, e.id
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    )
    UPDATE tickmark_events AS e
    SET state = 'running',
        lease_owner = worker,
        lease_token = e.lease_token + 1,
        due_at = now() + make_interval(secs => lease_secs),
        attempt = e.attempt + 1,
        step_started_at = now(),
        progress = NULL,
        progress_message = NULL,
        snoozed = false,
        takeovers = e.takeovers + CASE WHEN due.was_state = 'running' THEN 1 ELSE 0 END,
        last_error = CASE WHEN due.was_state = 'running'
            THEN 'interrupted: the lease of ' || coalesce(e.lease_owner, 'a worker')
                 || ' expired before step ' || e.next_step
                 || ' was marked; re-running it with the same idempotency key'
            ELSE e.last_error END
    FROM due
    WHERE e.id = due.id
    RETURNING e.id, e.source, e.dedup_key, e.kind, e.payload::text, e.received_at,
              e.plan::text, e.next_step, e.attempt, e.lease_token,
              (due.was_state = 'running'), e.resource_key, e.resource_seq;
END
$$;
