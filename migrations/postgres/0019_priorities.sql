-- Priorities: a handler's head start (issue 44; docs/flow_control.md,
-- "Priorities: a head start").
--
-- `Handler::head_start(d)` claims a handler's events as if they had become
-- due `d` earlier: orders with a head start of ten minutes go before
-- product syncs that became due up to ten minutes before them. It is a
-- priority that ages, so none starves: an event that has been due for the
-- largest head start (less its own) is behind nothing that becomes due
-- after it. Claims order by the rank, `due_at - head_start`, instead of
-- `due_at`: the unfair claim, each tenant's share in a fair claim, and the
-- events without a tenant beside them. Fairness between tenants is
-- unchanged: a head start orders a tenant's own events, never takes
-- another tenant's share.
ALTER TABLE tickmark_events ADD COLUMN head_start_ms INT NOT NULL DEFAULT 0
    CHECK (head_start_ms >= 0);
ALTER TABLE tickmark_queue ADD COLUMN head_start_ms INT NOT NULL DEFAULT 0;

-- An event's rank: its due time, less its head start. Declared immutable,
-- which it is: an interval of milliseconds alone (no days, no months)
-- moves a time by the same amount in every time zone. No search_path of
-- its own (a function with settings is never inlined, and this one runs
-- at every write of a queue row): it names no table, and its operators,
-- types and casts are pg_catalog's by name, so no caller's search_path
-- can put another operator in their place.
CREATE FUNCTION tickmark_rank(due_at TIMESTAMPTZ, head_start_ms INT) RETURNS TIMESTAMPTZ
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT due_at OPERATOR(pg_catalog.-)
           (head_start_ms::pg_catalog.float8 OPERATOR(pg_catalog.*)
            '1 millisecond'::pg_catalog.interval)
$$;

-- Kept with the row: every write of `due_at` (a claim's lease, a retry's
-- delay) moves it.
ALTER TABLE tickmark_queue ADD COLUMN rank_at TIMESTAMPTZ
    GENERATED ALWAYS AS (tickmark_rank(due_at, head_start_ms)) STORED;

-- The claim walks ranks in order. A row's rank is never after its due
-- time, so `rank_at <= now()` bounds every due row's search; rows ranked
-- before now but not yet due (a retry inside its head start) are skipped
-- on the way.
DROP INDEX tickmark_queue_due;
CREATE INDEX tickmark_queue_rank ON tickmark_queue (rank_at, event_seq);
DROP INDEX tickmark_queue_tenant;
CREATE INDEX tickmark_queue_tenant ON tickmark_queue (tenant_key, rank_at, event_seq)
    WHERE tenant_key IS NOT NULL;

-- Migration 0018's mending, with the head start.
CREATE OR REPLACE FUNCTION tickmark_queue_mend() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    queued TIMESTAMPTZ;
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM tickmark_queue WHERE event_seq = OLD.id;
        RETURN NULL;
    END IF;
    IF NEW.state IN ('pending', 'running') THEN
        INSERT INTO tickmark_queue
            (event_seq, due_at, resource_key, limit_key, debounce_key, tenant_key, head_start_ms)
        VALUES (NEW.id, NEW.due_at, NEW.resource_key, NEW.limit_key, NEW.debounce_key,
                NEW.tenant_key, NEW.head_start_ms)
        ON CONFLICT (event_seq) DO UPDATE
        SET due_at = EXCLUDED.due_at, resource_key = EXCLUDED.resource_key,
            limit_key = EXCLUDED.limit_key, debounce_key = EXCLUDED.debounce_key,
            tenant_key = EXCLUDED.tenant_key, head_start_ms = EXCLUDED.head_start_ms;
        queued := NEW.due_at;
    ELSE
        DELETE FROM tickmark_queue WHERE event_seq = NEW.id;
    END IF;
    -- The row says so, with an update that is in step (no trigger again).
    UPDATE tickmark_events SET queued_due_at = queued WHERE id = NEW.id;
    RETURN NULL;
END
$$;

DROP TRIGGER tickmark_queue_update ON tickmark_events;
CREATE TRIGGER tickmark_queue_update AFTER UPDATE ON tickmark_events
    FOR EACH ROW
    WHEN ((NEW.state IN ('pending', 'running')) IS DISTINCT FROM (NEW.queued_due_at IS NOT NULL)
          OR (NEW.state IN ('pending', 'running') AND NEW.due_at IS DISTINCT FROM NEW.queued_due_at)
          OR NEW.resource_key IS DISTINCT FROM OLD.resource_key
          OR NEW.limit_key IS DISTINCT FROM OLD.limit_key
          OR NEW.debounce_key IS DISTINCT FROM OLD.debounce_key
          OR NEW.tenant_key IS DISTINCT FROM OLD.tenant_key
          OR NEW.head_start_ms IS DISTINCT FROM OLD.head_start_ms)
    EXECUTE FUNCTION tickmark_queue_mend();

-- Migration 0018's fair choice, in claim order (by rank) instead of due
-- order: within each tenant's share, and among the events without a
-- tenant, the event with the earliest rank comes first.
CREATE OR REPLACE FUNCTION tickmark_claimable_fair(
    batch        INT,
    pending      BOOLEAN,
    skip_sources TEXT[],
    skip_kinds   TEXT[]
)
RETURNS TABLE (id BIGINT, state TEXT, limit_key TEXT, limit_n INT, due_at TIMESTAMPTZ)
LANGUAGE plpgsql
VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    clock             FLOAT8;
    candidate_ids     BIGINT[];
    candidate_tenants TEXT[];
    ids               BIGINT[];
    was_states        TEXT[];
    keys              TEXT[];
    ns                INT[];
    dues              TIMESTAMPTZ[];
    tenants           TEXT[];
    served            RECORD;
    last_start        FLOAT8;
    top_start         FLOAT8;
BEGIN
    SELECT c.virtual_time INTO clock FROM tickmark_fair_clock AS c FOR UPDATE;

    -- The candidates, best first: no lock yet, only the queue and the
    -- tenants read.
    SELECT coalesce(array_agg(c.event_seq ORDER BY c.finish, c.rank_at, c.event_seq), '{}'),
           coalesce(array_agg(c.tenant ORDER BY c.finish, c.rank_at, c.event_seq), '{}')
    INTO candidate_ids, candidate_tenants
    FROM (
        WITH RECURSIVE due_tenants (key) AS (
            (SELECT q.tenant_key FROM tickmark_queue AS q
             WHERE q.tenant_key IS NOT NULL AND q.rank_at <= now() AND q.due_at <= now()
             ORDER BY q.tenant_key LIMIT 1)
            UNION ALL
            SELECT (SELECT q.tenant_key FROM tickmark_queue AS q
                    WHERE q.tenant_key > t.key AND q.rank_at <= now() AND q.due_at <= now()
                    ORDER BY q.tenant_key LIMIT 1)
            FROM due_tenants AS t
            WHERE t.key IS NOT NULL
        ),
        weighed AS (
            SELECT t.key, coalesce(w.weight, 1) AS weight,
                   greatest(coalesce(w.pass, 0), clock) AS start,
                   ceil(batch * coalesce(w.weight, 1)
                        / sum(coalesce(w.weight, 1)) OVER ())::int AS share
            FROM due_tenants AS t
            LEFT JOIN tickmark_tenants AS w ON w.tenant_key = t.key
            WHERE t.key IS NOT NULL
        ),
        -- How many of its share each tenant has due: the share a tenant
        -- leaves unused (two events due, a share of twenty) goes to the
        -- tenants that fill theirs, by weight, so a batch is full whenever
        -- that many events are due.
        counted AS (
            SELECT g.*, (SELECT count(*) FROM (
                             SELECT 1 FROM tickmark_queue AS q
                             WHERE q.tenant_key = g.key AND q.rank_at <= now() AND q.due_at <= now()
                             LIMIT g.share) AS x) AS have
            FROM weighed AS g
        ),
        shares AS (
            SELECT c.key, c.weight, c.start,
                   CASE WHEN c.have < c.share THEN c.have::int
                        ELSE c.share + ceil(greatest(batch - sum(least(c.have, c.share)) OVER (), 0)
                                            * c.weight
                                            / sum(CASE WHEN c.have >= c.share THEN c.weight END)
                                                  OVER ())::int
                   END AS share
            FROM counted AS c
        )
        SELECT s.key AS tenant, d.event_seq, d.rank_at,
               s.start + (row_number() OVER (PARTITION BY s.key
                                             ORDER BY d.rank_at, d.event_seq)) / s.weight
                   AS finish
        FROM shares AS s
        CROSS JOIN LATERAL (
            SELECT q.event_seq, q.rank_at FROM tickmark_queue AS q
            WHERE q.tenant_key = s.key AND q.rank_at <= now() AND q.due_at <= now()
            ORDER BY q.rank_at, q.event_seq
            LIMIT s.share
        ) AS d
        UNION ALL
        SELECT NULL, u.event_seq, u.rank_at,
               clock + (row_number() OVER (ORDER BY u.rank_at, u.event_seq))::float8
        FROM (
            SELECT q.event_seq, q.rank_at, q.tenant_key FROM tickmark_queue AS q
            WHERE q.rank_at <= now() AND q.due_at <= now()
            ORDER BY q.rank_at, q.event_seq
            LIMIT batch
        ) AS u
        WHERE u.tenant_key IS NULL
    ) AS c;

    -- Each candidate's event row, in that order, checked and locked as
    -- `tickmark_claimable` does a batch's (never alone here). The lateral
    -- lookup keeps the candidates outside: a plan made while the event
    -- table was small, free to join, walked every event instead.
    SELECT coalesce(array_agg(f.id ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.state ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.limit_key ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.limit_n ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.due_at ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.tenant ORDER BY f.ord), '{}')
    INTO ids, was_states, keys, ns, dues, tenants
    FROM (
        SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at, c.tenant, c.ord
        FROM unnest(candidate_ids, candidate_tenants) WITH ORDINALITY AS c (event_seq, tenant, ord)
        CROSS JOIN LATERAL (
            SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at
            FROM tickmark_events AS e
            WHERE e.id = c.event_seq
              AND e.state IN ('pending', 'running') AND e.due_at <= now()
              AND CASE WHEN e.suspect OR (e.state = 'running'
                                          AND (e.claimed_alone OR e.interrupted > 0))
                            THEN false
                       WHEN e.state = 'pending' THEN pending
                       ELSE true END
              AND NOT (e.source = ANY(skip_sources))
              AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
              AND NOT EXISTS (
                  SELECT 1 FROM tickmark_queue AS earlier
                  WHERE earlier.resource_key = e.resource_key AND earlier.event_seq < e.id)
              AND (e.limit_key IS NULL OR tickmark_limit_held(e.limit_key) < e.limit_n)
            FOR UPDATE SKIP LOCKED
        ) AS e
        LIMIT batch
    ) AS f;

    -- Tenants in key order: two claims never wait for each other in a circle.
    FOR served IN
        SELECT t AS key, count(*) AS n FROM unnest(tenants) AS t
        WHERE t IS NOT NULL GROUP BY t ORDER BY t
    LOOP
        UPDATE tickmark_tenants AS w
        SET pass = greatest(w.pass, clock) + served.n / w.weight
        WHERE w.tenant_key = served.key
        RETURNING w.pass - 1 / w.weight INTO last_start;
        IF NOT FOUND THEN
            INSERT INTO tickmark_tenants AS w (tenant_key, pass)
            VALUES (served.key, clock + served.n)
            ON CONFLICT (tenant_key) DO UPDATE
            SET pass = greatest(w.pass, clock) + served.n / w.weight
            RETURNING w.pass - 1 / w.weight INTO last_start;
        END IF;
        top_start := greatest(top_start, last_start);
    END LOOP;
    -- The clock moves to the start of the last event served: a tenant that
    -- comes back from idle starts there, level with the tenants served.
    IF top_start > clock THEN
        UPDATE tickmark_fair_clock SET virtual_time = top_start;
    END IF;

    RETURN QUERY
    SELECT u.id, u.state, u.limit_key, u.limit_n, u.due_at
    FROM unnest(ids, was_states, keys, ns, dues) WITH ORDINALITY
        AS u (id, state, limit_key, limit_n, due_at, ord)
    ORDER BY u.ord;
END
$$;

-- Migration 0018's dispatch; the unfair choice walks the rank index.
CREATE OR REPLACE FUNCTION tickmark_claimable(
    batch        INT,
    alone        BOOLEAN,
    pending      BOOLEAN,
    skip_sources TEXT[],
    skip_kinds   TEXT[]
)
RETURNS TABLE (id BIGINT, state TEXT, limit_key TEXT, limit_n INT, due_at TIMESTAMPTZ)
LANGUAGE plpgsql
VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF NOT alone AND EXISTS (SELECT 1 FROM tickmark_queue AS t WHERE t.tenant_key IS NOT NULL) THEN
        RETURN QUERY SELECT * FROM tickmark_claimable_fair(batch, pending, skip_sources, skip_kinds);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at
    FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.rank_at <= now() AND q.due_at <= now()
      -- The event row decides (the queue row read may be a moment old):
      -- checked again on the locked row.
      AND e.state IN ('pending', 'running') AND e.due_at <= now()
      AND CASE WHEN e.suspect OR (e.state = 'running' AND (e.claimed_alone OR e.interrupted > 0))
                    THEN alone
               WHEN e.state = 'pending' THEN pending
               ELSE pending OR NOT alone END
      AND NOT (e.source = ANY(skip_sources))
      AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
      -- An ordered event waits while an earlier one of its resource is unfinished.
      AND NOT EXISTS (
          SELECT 1 FROM tickmark_queue AS earlier
          WHERE earlier.resource_key = q.resource_key AND earlier.event_seq < q.event_seq)
      -- A limited event waits while its key is full (the claim checks again
      -- under the key's lock: this only saves the lock).
      AND (q.limit_key IS NULL OR tickmark_limit_held(q.limit_key) < e.limit_n)
    ORDER BY q.rank_at, q.event_seq
    LIMIT CASE WHEN alone THEN least(batch, 1) ELSE batch END
    FOR UPDATE OF e SKIP LOCKED;
END
$$;

-- CREATE OR REPLACE dropped what earlier migrations set on the function:
-- set it again, and on the new function (migration 0011).
ALTER FUNCTION tickmark_claimable(INT, BOOLEAN, BOOLEAN, TEXT[], TEXT[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tickmark_claimable_fair(INT, BOOLEAN, TEXT[], TEXT[])
    SET plan_cache_mode = force_generic_plan;

DO $$
DECLARE
    signature TEXT;
BEGIN
    FOREACH signature IN ARRAY ARRAY[
        'tickmark_claimable(INT, BOOLEAN, BOOLEAN, TEXT[], TEXT[])',
        'tickmark_claimable_fair(INT, BOOLEAN, TEXT[], TEXT[])',
        'tickmark_queue_mend()'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %1$I.%2$s SET search_path = pg_catalog, %1$I, pg_temp',
                       current_schema(), signature);
    END LOOP;
END
$$;
