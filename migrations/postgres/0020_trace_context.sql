-- Traces (issue 45; docs/observability.md): the W3C trace context of the
-- span that accepted an event, so that every later run of it (a retry
-- hours later, a takeover by another process, a snooze, a durable wait
-- that resumes days later) continues the same trace. Written only by an
-- engine built with the `otel` feature; NULL otherwise. Nullable columns
-- without a default: adding them rewrites nothing.
ALTER TABLE tickmark_events
    ADD COLUMN traceparent TEXT CHECK (length(traceparent) = 55),
    ADD COLUMN tracestate TEXT CHECK (length(tracestate) <= 512);

-- The claim answers each claimed event's trace context, read by the claim's
-- own update (migration 0017's function, two columns more). Read beside the
-- function instead, in the statement that calls it, an event accepted
-- after that statement began was claimed but not seen: the statement's
-- snapshot is older than the function's, and the claim was lost to the
-- worker until its lease ran out (found by
-- `prefetch::postgres_shutdown_gives_prefetched_events_back_within_its_grace`).
-- A function's result type cannot be replaced: it is dropped and made
-- again, in this migration's transaction. The previous release names the
-- columns it claims, so the two more leave its prepared claim valid
-- (`postgres_upgrade::a_claim_prepared_before_its_function_gains_a_column_still_claims`).
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
    resource_key TEXT, resource_seq BIGINT, interrupted INT, traceparent TEXT, tracestate TEXT
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
    held       BIGINT;
    room       BIGINT;
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

    IF cardinality(array_remove(keys, NULL)) > 0 THEN
        -- Keys in sorted order: two claims never wait for each other in a circle.
        FOR limited IN SELECT DISTINCT k FROM unnest(array_remove(keys, NULL)) AS k ORDER BY k LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('tickmark.limit:' || limited, 0));
            held := tickmark_limit_held(limited);
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
    ),
    claimed AS (
    UPDATE tickmark_events AS e
    SET state = 'running',
        lease_owner = worker,
        lease_token = e.lease_token + 1,
        due_at = now() + make_interval(secs => lease_secs),
        -- The queue row follows, below: in step, no trigger.
        queued_due_at = now() + make_interval(secs => lease_secs),
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
              (due.was_state = 'running'), e.resource_key, e.resource_seq, e.interrupted,
              e.traceparent, e.tracestate
    ),
    requeued AS (
        UPDATE tickmark_queue AS q
        SET due_at = now() + make_interval(secs => lease_secs)
        FROM claimed AS c
        WHERE q.event_seq = c.id
    )
    SELECT * FROM claimed;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %1$I.%2$s SET search_path = pg_catalog, %1$I, pg_temp',
                   current_schema(),
                   'tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)');
END
$$;
