-- Suspects that stay suspects, and are looked for as the claim looks
-- (docs/guarantees.md, guarantee 14; docs/design/exact-blame.md).
--
-- A suspect (an event lost twice in a batch, or once while held alone) is
-- taken over only by a claim alone. Migrations 0012 and 0013 read that from
-- the expired lease (`claimed_alone`, `interrupted`), so a suspect given back
-- before its step ran (a shutdown, a snooze, a throttle, a transaction not
-- opened) was an ordinary pending event again, and a batch claim took it:
-- a poison step could dodge blame that way, its next crash refunded again.
-- `suspect` remembers it: set by the claim that takes a suspect, kept by a
-- release, cleared by a mark of its step (done, skipped or failed) and by
-- an operator's retry or settle.
ALTER TABLE tickmark_events ADD COLUMN suspect BOOLEAN NOT NULL DEFAULT false;

-- The due events a claim may take, in the claim's order, locked (SKIP
-- LOCKED): the one query both `tickmark_claim` and a worker asking whether
-- a suspect waits for a claim alone run (`Store::event_suspect_waits`,
-- which calls it as a claim alone of suspects would), so a suspect is
-- reported only when a claim alone could take it: due, its key under its
-- limit, no earlier event of its resource unfinished.
--
-- Which rows: a suspect (marked so, or an expired lease that was held
-- alone or whose step was interrupted before) only for a claim alone; a
-- pending event if `pending`; an expired batch lease on its second chance
-- for a batch claim, or for a claim alone that takes pending events too.
CREATE FUNCTION tickmark_claimable(
    batch        INT,
    alone        BOOLEAN,
    pending      BOOLEAN,
    skip_sources TEXT[],
    skip_kinds   TEXT[]
)
RETURNS TABLE (id BIGINT, state TEXT, limit_key TEXT, limit_n INT, due_at TIMESTAMPTZ)
LANGUAGE plpgsql
VOLATILE
-- As `tickmark_claim` (migration 0012 says why): walk `tickmark_events_due`
-- in its order, never sort the backlog, never JIT-compile.
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at
    FROM tickmark_events AS e
    WHERE e.state IN ('pending', 'running') AND e.due_at <= now()
      AND CASE WHEN e.suspect OR (e.state = 'running' AND (e.claimed_alone OR e.interrupted > 0))
                    THEN alone
               WHEN e.state = 'pending' THEN pending
               ELSE pending OR NOT alone END
      AND NOT (e.source = ANY(skip_sources))
      AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
      -- An ordered event waits while an earlier one of its resource is unfinished.
      AND NOT EXISTS (
          SELECT 1 FROM tickmark_events AS earlier
          WHERE earlier.resource_key = e.resource_key AND earlier.id < e.id
            AND earlier.state IN ('pending', 'running'))
      -- A limited event waits while its key is full (the claim checks again
      -- under the key's lock: this only saves the lock).
      AND (e.limit_key IS NULL OR (
          SELECT count(*) FROM tickmark_events AS r
          WHERE r.limit_key = e.limit_key AND r.state = 'running'
            AND r.due_at > now()) < e.limit_n)
    ORDER BY e.due_at, e.id
    LIMIT CASE WHEN alone THEN least(batch, 1) ELSE batch END
    FOR UPDATE SKIP LOCKED;
END
$$;

-- The claim of migration 0013, replaced in place: the same arguments and
-- the same result, so a statement prepared on it stays valid (a worker of
-- this release or the one before, claiming during a rolling upgrade), and
-- the five-argument claim of the release before exact blame, which calls
-- it, no longer takes a suspect either. It chooses its rows with
-- `tickmark_claimable` and remembers the suspects it takes.
CREATE OR REPLACE FUNCTION tickmark_claim(
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
        SELECT c.id, c.state, c.limit_key, c.limit_n, row_number() OVER () AS ord
        FROM tickmark_claimable(batch, alone, pending, skip_sources, skip_kinds) AS c
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
        -- A suspect taken (only a claim alone takes one) stays one until
        -- its step is marked, whatever gives it back before.
        suspect = e.suspect OR (due.was_state = 'running'
                                AND (e.claimed_alone OR e.interrupted > 0)),
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

-- CREATE OR REPLACE dropped what migrations 0013 and 0011 set on the
-- claim: set it again, and on the new function.
ALTER FUNCTION tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tickmark_claimable(INT, BOOLEAN, BOOLEAN, TEXT[], TEXT[])
    SET plan_cache_mode = force_generic_plan;

DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %1$I.tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)
             SET search_path = pg_catalog, %1$I, pg_temp',
        current_schema());
    EXECUTE format(
        'ALTER FUNCTION %1$I.tickmark_claimable(INT, BOOLEAN, BOOLEAN, TEXT[], TEXT[])
             SET search_path = pg_catalog, %1$I, pg_temp',
        current_schema());
END
$$;
