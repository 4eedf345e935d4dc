-- Flow control across the fleet (docs/flow_control.md): rate limits,
-- concurrency limits and debounce per key, shared by every worker on this
-- database.

-- One token bucket per (rate limit, key), kept as GCRA's single number: the
-- theoretical arrival time of the next request, in microseconds since the
-- epoch on the database clock. A take is one upsert that moves it forward
-- only when the burst allows (`tickmark::flow::RateLimit`). `wait_us` is
-- the wake-up time last given to a step that found the bucket empty: the
-- next one is woken one refill later, so waiting steps come back one by one
-- as tokens refill instead of all at once for the same token.
CREATE TABLE tickmark_rate_buckets (
    bucket  TEXT   PRIMARY KEY,
    tat_us  BIGINT NOT NULL,
    wait_us BIGINT NOT NULL DEFAULT 0
);

ALTER TABLE tickmark_events
    -- The bucket a throttled event waits on (set with `snoozed` by the
    -- release that gave it back; read only while it is snoozed).
    ADD COLUMN throttled_by TEXT,
    -- At most `limit_n` events of one `limit_key` (`{source}:{value}`) run
    -- at once, fleet-wide (`Handler::concurrency_per`).
    ADD COLUMN limit_key TEXT,
    ADD COLUMN limit_n INT,
    -- Debounce (`Handler::debounce_per`): the key (`{source}:{value}`), when
    -- the burst this event waits in began, and, once a newer event of the
    -- key took its place, that event.
    ADD COLUMN debounce_key TEXT,
    ADD COLUMN burst_started_at TIMESTAMPTZ,
    ADD COLUMN superseded_by BIGINT;

-- A new final state: coalesced into a later event of its debounce key.
ALTER TABLE tickmark_events
    DROP CONSTRAINT tickmark_events_state_check,
    ADD CONSTRAINT tickmark_events_state_check CHECK (state IN
        ('pending', 'running', 'done', 'dead', 'parked', 'ignored', 'cancelled', 'stale',
         'superseded'));

-- An accept finds the events of its key still waiting through this index.
CREATE INDEX tickmark_events_debounce ON tickmark_events (debounce_key)
    WHERE state = 'pending' AND debounce_key IS NOT NULL;

-- The claim counts the running events of a key (with a live lease) through
-- this index.
CREATE INDEX tickmark_events_limit ON tickmark_events (limit_key, due_at)
    WHERE state = 'running' AND limit_key IS NOT NULL;

-- The step-status view learns `throttled`: a snoozed step whose wait is a
-- rate limit's next token.
CREATE OR REPLACE VIEW tickmark_step_status AS
SELECT
    e.id                                                AS event_seq,
    e.source                                            AS source,
    e.dedup_key                                         AS event_id,
    e.kind                                              AS kind,
    (p.ordinality - 1)::INT                             AS position,
    p.entry ->> 'name'                                  AS step,
    e.source || ':' || e.dedup_key || ':' || (p.entry ->> 'name') AS idempotency_key,
    CASE
        WHEN s.state IN ('done', 'skipped') THEN s.state
        WHEN p.ordinality - 1 > e.next_step THEN
            CASE WHEN e.state IN ('pending', 'running') THEN 'pending' ELSE 'not_run' END
        WHEN e.state = 'running' THEN
            CASE WHEN e.due_at > now() THEN 'running' ELSE 'interrupted' END
        WHEN e.state = 'pending' THEN
            CASE WHEN e.snoozed AND e.throttled_by IS NOT NULL THEN 'throttled'
                 WHEN e.snoozed THEN 'snoozed'
                 WHEN s.state = 'failed' THEN 'retrying' ELSE 'pending' END
        ELSE e.state
    END                                                 AS state,
    CASE WHEN p.ordinality - 1 = e.next_step THEN e.attempt
         ELSE coalesce(s.attempts, 0) END               AS attempts,
    CASE WHEN p.ordinality - 1 = e.next_step AND e.state = 'running' THEN e.step_started_at
         ELSE s.started_at END                          AS started_at,
    CASE WHEN s.state IN ('done', 'skipped') THEN s.finished_at END AS finished_at,
    CASE WHEN p.ordinality - 1 = e.next_step AND e.state = 'pending' THEN e.due_at END AS retry_at,
    CASE WHEN p.ordinality - 1 = e.next_step AND e.state = 'running' THEN e.due_at END AS lease_until,
    CASE WHEN p.ordinality - 1 = e.next_step AND e.state = 'running' THEN e.lease_owner END AS worker,
    CASE WHEN p.ordinality - 1 = e.next_step THEN coalesce(e.last_error, s.last_error)
         ELSE s.last_error END                          AS last_error,
    s.output                                            AS output,
    CASE WHEN p.ordinality - 1 = e.next_step AND e.state = 'running' THEN e.progress END AS progress,
    CASE WHEN p.ordinality - 1 = e.next_step AND e.state = 'running' THEN e.progress_message END AS progress_message
FROM tickmark_events e
CROSS JOIN LATERAL json_array_elements(e.plan -> 'steps') WITH ORDINALITY AS p (entry, ordinality)
LEFT JOIN tickmark_steps s ON s.event_seq = e.id AND s.position = p.ordinality - 1;

-- The claim learns fleet-wide concurrency limits. Candidates are chosen and
-- locked as before (SKIP LOCKED, in due order); then, key by key in sorted
-- order, the claim takes a transaction-scoped advisory lock on the key and
-- counts the key's running events with a fresh snapshot (PL/pgSQL takes one
-- per statement under READ COMMITTED). A claimer that leased events of the
-- key before holds that lock until it commits, so the count sees its
-- leases: two claims can never both fill the last slot. Only a claim moves
-- an event into `running`, so only the claim needs the lock; marks and
-- releases only ever lower the count.
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
            LIMIT batch
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
        attempt = e.attempt + 1,
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
              (due.was_state = 'running'), e.resource_key, e.resource_seq;
END
$$;
