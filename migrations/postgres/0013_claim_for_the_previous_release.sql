-- A worker of the previous release keeps claiming during a rolling upgrade
-- (docs/deploying.md, "Rolling deploys"; tests/tests/postgres_upgrade.rs).
--
-- That worker keeps `SELECT * FROM tickmark_claim($1, $2::int, $3, $4, $5)`
-- prepared on each of its connections. Migration 0012 replaced the
-- five-argument function with one of seven whose two new arguments have
-- defaults, and whose result has one column more (`interrupted`): the
-- server re-plans the prepared statement, finds the new function, and
-- refuses the changed result ("cached plan must not change result type",
-- SQLSTATE 0A000) on every later claim of that connection, until the
-- worker restarts. So the five-argument call gets a function of its own
-- again, with the previous release's result, and the seven-argument one
-- loses its defaults (with both, a five-argument call matched either:
-- "function tickmark_claim(...) is not unique"). This release passes all
-- seven and names the columns it reads (`sql::EVENT_CLAIM_MANY`), so a
-- column added to the result later leaves its prepared claim valid.
--
-- The body is 0012's, unchanged.
DROP FUNCTION tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN);

CREATE FUNCTION tickmark_claim(
    worker      TEXT,
    batch       INT,
    lease_secs  FLOAT8,
    skip_sources TEXT[],
    skip_kinds  TEXT[],
    alone       BOOLEAN,
    pending     BOOLEAN
)
RETURNS TABLE (
    id BIGINT, source TEXT, dedup_key TEXT, kind TEXT, payload TEXT, received_at TIMESTAMPTZ,
    plan TEXT, next_step INT, attempt INT, lease_token BIGINT, took_over BOOLEAN,
    resource_key TEXT, resource_seq BIGINT, interrupted INT
)
LANGUAGE plpgsql
VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
-- The planner settings above price any sort at `disable_cost`, far above
-- `jit_above_cost`: without this, sorting the keys (a handful of rows)
-- would JIT-compile the statement, some 150 ms per claim.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    ids        BIGINT[];
    was_states TEXT[];
    keys       TEXT[];
    ns         INT[];
    limited    TEXT;
    held       INT;
    room       INT;
    i          INT;
BEGIN
    SELECT coalesce(array_agg(d.id ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.state ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.limit_key ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.limit_n ORDER BY d.ord), '{}')
    INTO ids, was_states, keys, ns
    FROM (
        SELECT e.id, e.state, e.limit_key, e.limit_n,
               row_number() OVER () AS ord
        FROM (
            SELECT e.id, e.state, e.limit_key, e.limit_n
            FROM tickmark_events AS e
            WHERE e.state IN ('pending', 'running') AND e.due_at <= now()
              -- An expired lease: a batch claim takes it once (its second
              -- chance); a suspect waits for a claim alone (and a claim of
              -- suspects only takes no pending event).
              AND CASE WHEN e.state = 'pending' THEN pending
                       ELSE alone OR (NOT e.claimed_alone AND e.interrupted = 0) END
              AND NOT (e.source = ANY(skip_sources))
              AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
              -- An ordered event waits while an earlier one of its resource is unfinished.
              AND NOT EXISTS (
                  SELECT 1 FROM tickmark_events AS earlier
                  WHERE earlier.resource_key = e.resource_key AND earlier.id < e.id
                    AND earlier.state IN ('pending', 'running'))
              -- A limited event waits while its key is full (checked again
              -- below, under the key's lock: this only saves the lock).
              AND (e.limit_key IS NULL OR (
                  SELECT count(*) FROM tickmark_events AS r
                  WHERE r.limit_key = e.limit_key AND r.state = 'running'
                    AND r.due_at > now()) < e.limit_n)
            ORDER BY e.due_at, e.id
            LIMIT CASE WHEN alone THEN least(batch, 1) ELSE batch END
            FOR UPDATE SKIP LOCKED
        ) AS e
    ) AS d;

    -- Most claims have no limited event: a plain expression, no statement,
    -- says so.
    IF cardinality(array_remove(keys, NULL)) > 0 THEN
        -- Keys in sorted order: two claims never wait for each other in a circle.
        FOR limited IN SELECT DISTINCT k FROM unnest(array_remove(keys, NULL)) AS k ORDER BY k LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('tickmark.limit:' || limited, 0));
            SELECT count(*) INTO held FROM tickmark_events AS r
            WHERE r.limit_key = limited AND r.state = 'running' AND r.due_at > now();
            FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
                IF keys[i] = limited THEN
                    room := ns[i] - held;
                    IF room > 0 THEN
                        held := held + 1;
                    ELSE
                        ids[i] := NULL; -- the key is full: not claimed (stays as it was)
                    END IF;
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    RETURN QUERY
    WITH due AS (
        SELECT u.id, u.was_state
        FROM unnest(ids, was_states) AS u (id, was_state)
        WHERE u.id IS NOT NULL
    )
    UPDATE tickmark_events AS e
    SET state = 'running',
        lease_owner = worker,
        lease_token = e.lease_token + 1,
        due_at = now() + make_interval(secs => lease_secs),
        -- Every claim counts a run; a run lost beside others is refunded:
        -- its crash is not known to be its own.
        attempt = e.attempt + 1,
        interrupted = e.interrupted + CASE WHEN due.was_state = 'running' AND NOT e.claimed_alone
                                           THEN 1 ELSE 0 END,
        claimed_alone = alone,
        step_started_at = now(),
        progress = NULL,
        progress_message = NULL,
        snoozed = false,
        throttled_by = NULL,
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
              (due.was_state = 'running'), e.resource_key, e.resource_seq, e.interrupted;
END
$$;

ALTER FUNCTION tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)
    SET plan_cache_mode = force_generic_plan;

-- The previous release's claim: a batch claim of pending events (what 0012's
-- defaults meant), with that release's thirteen columns.
CREATE FUNCTION tickmark_claim(
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
LANGUAGE sql
VOLATILE
AS $$
    SELECT c.id, c.source, c.dedup_key, c.kind, c.payload, c.received_at,
           c.plan, c.next_step, c.attempt, c.lease_token, c.took_over,
           c.resource_key, c.resource_seq
    FROM tickmark_claim(worker, batch, lease_secs, skip_sources, skip_kinds, false, true) AS c
$$;

-- Both pinned to this schema, as migration 0011 pins every function
-- tickmark creates.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %1$I.tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)
             SET search_path = pg_catalog, %1$I, pg_temp',
        current_schema());
    EXECUTE format(
        'ALTER FUNCTION %1$I.tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[])
             SET search_path = pg_catalog, %1$I, pg_temp',
        current_schema());
END
$$;
