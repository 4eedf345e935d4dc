-- Fair share across tenants (issue 44; docs/flow_control.md, "Fair share
-- across tenants").
--
-- A handler may name where an event's tenant is (`Handler::tenant_key`: a
-- shop, a connected account). Among the tenants with events due, a claim
-- gives each tenant slots in proportion to its weight, whatever the due
-- order, so one tenant's backlog no longer queues every other tenant's
-- events behind it. The scheme is start-time fair queuing: every tenant
-- has a virtual time (`pass`), advanced by 1/weight for each event claimed
-- for it; a claim takes the events with the smallest virtual finish times
-- (the tenant's start plus k/weight for its k-th event), and a tenant that
-- was idle starts at the fleet's clock (`tickmark_fair_clock`), never
-- behind it, so it cannot save up slots while it has nothing to run.
--
-- Events without a tenant (handlers that name none) cost nothing new: no
-- entry in the tenants' index, and while no queued event has a tenant the
-- claim is the one of migration 0017.
ALTER TABLE tickmark_events ADD COLUMN tenant_key TEXT;
ALTER TABLE tickmark_queue ADD COLUMN tenant_key TEXT;

-- Each tenant's events in due order: a fair claim finds the tenants with
-- events due (one descent per tenant) and takes each one's share from here.
CREATE INDEX tickmark_queue_tenant ON tickmark_queue (tenant_key, due_at, event_seq)
    WHERE tenant_key IS NOT NULL;

-- What operators set (`tickmark tenants weight`), and each tenant's virtual
-- time. A tenant without a row has weight 1 and starts at the clock.
CREATE TABLE tickmark_tenants (
    tenant_key    TEXT        PRIMARY KEY,
    -- Slots in proportion to this, among the tenants with events due. NaN
    -- and infinity fail the check too (PostgreSQL orders NaN above all).
    weight        FLOAT8      NOT NULL DEFAULT 1
        CHECK (weight > 0 AND weight <= 1000000),
    -- Events claimed for the tenant, each counted 1/weight, from where it
    -- last started (never behind the clock).
    pass          FLOAT8      NOT NULL DEFAULT 0,
    weight_set_at TIMESTAMPTZ
);

-- The fleet's virtual time: the start of the last event the last claim
-- served. Every fair claim locks it first, so fair claims take turns
-- (each is a few milliseconds) and no two give out the same slots.
CREATE TABLE tickmark_fair_clock (
    only_row     BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    virtual_time FLOAT8  NOT NULL DEFAULT 0
);
INSERT INTO tickmark_fair_clock DEFAULT VALUES;

-- Migration 0017's mending, with the tenant: an event written out of step
-- gets its queue row, tenant included.
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
            (event_seq, due_at, resource_key, limit_key, debounce_key, tenant_key)
        VALUES (NEW.id, NEW.due_at, NEW.resource_key, NEW.limit_key, NEW.debounce_key,
                NEW.tenant_key)
        ON CONFLICT (event_seq) DO UPDATE
        SET due_at = EXCLUDED.due_at, resource_key = EXCLUDED.resource_key,
            limit_key = EXCLUDED.limit_key, debounce_key = EXCLUDED.debounce_key,
            tenant_key = EXCLUDED.tenant_key;
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
          OR NEW.tenant_key IS DISTINCT FROM OLD.tenant_key)
    EXECUTE FUNCTION tickmark_queue_mend();

-- The fair choice of a batch (never a claim alone: that takes one
-- suspect), with its tenants charged: the same result columns and row
-- locks as `tickmark_claimable`, which calls it while any queued event has
-- a tenant.
--
-- 1. The tenants with events due: one descent of the tenants' index each.
-- 2. Each one's share of the batch, ceil(batch * weight / total weight),
--    and what tenants with fewer events due leave of theirs shared among
--    the others by weight; its first events in due order: some 2 * batch
--    + tenants rows read.
-- 3. Events without a tenant: those among the first `batch` due events
--    (the due index, as migration 0017 claims), as one more tenant of
--    weight 1 starting at the clock.
-- 4. By virtual finish time (start + k/weight), then due order, each
--    checked and locked on its event row as `tickmark_claimable` does,
--    until the batch is full.
-- 5. Each tenant served is charged (its pass moves to start + n/weight),
--    and the clock to the start of the last event served.
CREATE FUNCTION tickmark_claimable_fair(
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
    SELECT coalesce(array_agg(c.event_seq ORDER BY c.finish, c.due_at, c.event_seq), '{}'),
           coalesce(array_agg(c.tenant ORDER BY c.finish, c.due_at, c.event_seq), '{}')
    INTO candidate_ids, candidate_tenants
    FROM (
        WITH RECURSIVE due_tenants (key) AS (
            (SELECT q.tenant_key FROM tickmark_queue AS q
             WHERE q.tenant_key IS NOT NULL AND q.due_at <= now()
             ORDER BY q.tenant_key LIMIT 1)
            UNION ALL
            SELECT (SELECT q.tenant_key FROM tickmark_queue AS q
                    WHERE q.tenant_key > t.key AND q.due_at <= now()
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
                             WHERE q.tenant_key = g.key AND q.due_at <= now()
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
        SELECT s.key AS tenant, d.event_seq, d.due_at,
               s.start + (row_number() OVER (PARTITION BY s.key
                                             ORDER BY d.due_at, d.event_seq)) / s.weight
                   AS finish
        FROM shares AS s
        CROSS JOIN LATERAL (
            SELECT q.event_seq, q.due_at FROM tickmark_queue AS q
            WHERE q.tenant_key = s.key AND q.due_at <= now()
            ORDER BY q.due_at, q.event_seq
            LIMIT s.share
        ) AS d
        UNION ALL
        SELECT NULL, u.event_seq, u.due_at,
               clock + (row_number() OVER (ORDER BY u.due_at, u.event_seq))::float8
        FROM (
            SELECT q.event_seq, q.due_at, q.tenant_key FROM tickmark_queue AS q
            WHERE q.due_at <= now()
            ORDER BY q.due_at, q.event_seq
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

-- Migration 0017's choice of rows, unchanged while no queued event has a
-- tenant (one probe of the tenants' index says so), else the fair choice.
-- A claim alone (one suspect) is never fair: it takes the oldest.
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
    WHERE q.due_at <= now()
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
    ORDER BY q.due_at, q.event_seq
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
