-- The claim's own narrow table (issue 43; docs/performance.md, "The claim
-- queue").
--
-- Until now the claim walked an index of `tickmark_events` on `due_at`
-- whose predicate named `state`, and four more partial indexes named
-- `state` too. PostgreSQL updates a row in place (HOT: no index entry
-- written) only when no column an index names, in its key or its
-- predicate, changes. So the claim (pending -> running, a new `due_at`)
-- and an event's last mark (running -> done) each wrote a new entry in
-- every index of the table: the primary key, the dedup key and the due
-- index, five entries per event on top of the two row versions.
--
-- `tickmark_queue` holds one narrow row per pending or running event: what
-- the claim walks (`due_at`), what it checks (the resource of an ordered
-- event, the key of a limited one) and the debounce key a burst is looked
-- up by. No index of `tickmark_events` names `state`, `due_at` or any
-- column a claim or a mark changes any more, so every update of the event
-- row is HOT; what is indexed and updated is the queue row (some 50 bytes,
-- two index entries), deleted when the event ends.
--
-- The event row stays the truth, and says what its queue row holds:
-- `queued_due_at` is the queue row's `due_at`, NULL when it has none. The
-- statements that run for every event (the accept, the claim, a mark)
-- keep both in step themselves, in the same statement. Any other write
-- (a rare transition of this release, a statement of the previous
-- release during a rolling upgrade, an operator's psql) leaves them apart,
-- and the triggers below, whose conditions PostgreSQL evaluates without
-- calling them for the rows in step, mend the queue row in the same
-- transaction. So the queue never disagrees with a committed event row,
-- and the hot path pays no trigger.
--
-- The claim reads the queue without locking it, then locks and checks the
-- event row (SKIP LOCKED): a queue row a concurrent statement is changing
-- costs a skip, never a wrong claim. Every writer locks the event row
-- before it touches the queue row: one lock order, no deadlock.
ALTER TABLE tickmark_events ADD COLUMN queued_due_at TIMESTAMPTZ;

CREATE TABLE tickmark_queue (
    event_seq    BIGINT      PRIMARY KEY,
    -- The event's `due_at`: when it may be claimed, or its lease's end.
    due_at       TIMESTAMPTZ NOT NULL,
    resource_key TEXT,
    limit_key    TEXT,
    debounce_key TEXT
)
-- Every claim updates its row: room on each page keeps the new version on
-- the page of the old one (a smaller WAL record).
WITH (fillfactor = 50);

-- The claim walks this index in its exact order: no sort of the backlog.
CREATE INDEX tickmark_queue_due ON tickmark_queue (due_at, event_seq);

-- Events that must wait for an earlier unfinished event of their resource.
CREATE INDEX tickmark_queue_serial ON tickmark_queue (resource_key, event_seq)
    WHERE resource_key IS NOT NULL;

-- Unfinished events per concurrency key, for the limit check.
CREATE INDEX tickmark_queue_limit ON tickmark_queue (limit_key, due_at)
    WHERE limit_key IS NOT NULL;

-- Unfinished events of a debounce key, for the burst an accept joins.
CREATE INDEX tickmark_queue_debounce ON tickmark_queue (debounce_key)
    WHERE debounce_key IS NOT NULL;

INSERT INTO tickmark_queue (event_seq, due_at, resource_key, limit_key, debounce_key)
SELECT id, due_at, resource_key, limit_key, debounce_key
FROM tickmark_events
WHERE state IN ('pending', 'running');

UPDATE tickmark_events SET queued_due_at = due_at WHERE state IN ('pending', 'running');

-- Mend the queue row of an event written out of step (see above), and say
-- so in the row. After the row is written: an insert an ON CONFLICT
-- skipped gets no queue row.
CREATE FUNCTION tickmark_queue_mend() RETURNS trigger
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
        INSERT INTO tickmark_queue (event_seq, due_at, resource_key, limit_key, debounce_key)
        VALUES (NEW.id, NEW.due_at, NEW.resource_key, NEW.limit_key, NEW.debounce_key)
        ON CONFLICT (event_seq) DO UPDATE
        SET due_at = EXCLUDED.due_at, resource_key = EXCLUDED.resource_key,
            limit_key = EXCLUDED.limit_key, debounce_key = EXCLUDED.debounce_key;
        queued := NEW.due_at;
    ELSE
        DELETE FROM tickmark_queue WHERE event_seq = NEW.id;
    END IF;
    -- The row says so, with an update that is in step (no trigger again).
    UPDATE tickmark_events SET queued_due_at = queued WHERE id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER tickmark_queue_insert AFTER INSERT ON tickmark_events
    FOR EACH ROW
    WHEN ((NEW.state IN ('pending', 'running')) IS DISTINCT FROM (NEW.queued_due_at IS NOT NULL)
          OR (NEW.state IN ('pending', 'running') AND NEW.due_at IS DISTINCT FROM NEW.queued_due_at))
    EXECUTE FUNCTION tickmark_queue_mend();
-- After, not before: a BEFORE ROW trigger locks every row it might fire
-- for before its condition is evaluated, one more WAL record per update.
CREATE TRIGGER tickmark_queue_update AFTER UPDATE ON tickmark_events
    FOR EACH ROW
    WHEN ((NEW.state IN ('pending', 'running')) IS DISTINCT FROM (NEW.queued_due_at IS NOT NULL)
          OR (NEW.state IN ('pending', 'running') AND NEW.due_at IS DISTINCT FROM NEW.queued_due_at)
          OR NEW.resource_key IS DISTINCT FROM OLD.resource_key
          OR NEW.limit_key IS DISTINCT FROM OLD.limit_key
          OR NEW.debounce_key IS DISTINCT FROM OLD.debounce_key)
    EXECUTE FUNCTION tickmark_queue_mend();
CREATE TRIGGER tickmark_queue_delete AFTER DELETE ON tickmark_events
    FOR EACH ROW
    WHEN (OLD.queued_due_at IS NOT NULL)
    EXECUTE FUNCTION tickmark_queue_mend();

CREATE FUNCTION tickmark_queue_truncated() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    TRUNCATE tickmark_queue;
    RETURN NULL;
END
$$;

CREATE TRIGGER tickmark_queue_truncate AFTER TRUNCATE ON tickmark_events
    FOR EACH STATEMENT EXECUTE FUNCTION tickmark_queue_truncated();

-- The indexes that named `state` go; their work moved to the queue's. The
-- one durable waits match by keeps `wait_key` alone: it is set while an
-- event waits and cleared when the wait ends.
DROP INDEX tickmark_events_due;
DROP INDEX tickmark_events_serial;
DROP INDEX tickmark_events_limit;
DROP INDEX tickmark_events_debounce;
DROP INDEX tickmark_events_waiting;
CREATE INDEX tickmark_events_waiting ON tickmark_events (wait_key)
    WHERE wait_key IS NOT NULL;

-- Running events of a concurrency key whose lease is live: what the claim
-- counts against the key's limit.
CREATE FUNCTION tickmark_limit_held(key TEXT) RETURNS BIGINT
LANGUAGE sql
STABLE
AS $$
    SELECT count(*) FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.limit_key = key AND q.due_at > now() AND e.state = 'running' AND e.due_at > now()
$$;

-- Migration 0014's choice of rows, over the queue: the same arguments, the
-- same result, the same order and locks (the event row's), so a statement
-- prepared on it stays valid.
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
-- Each queue row finds its event by the primary key, in the queue's order:
-- never a hash or merge join, and never a scan of the event table kept
-- aside and filtered (which the planner, guessing few events pass the
-- filters, would choose: a walk of every event, at every claim).
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
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

-- Migration 0014's claim, its limit count from the queue, and the queue
-- row of each event it claims moved to the lease's end with the event row.
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
              (due.was_state = 'running'), e.resource_key, e.resource_seq, e.interrupted
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

-- An event's marks of done steps, many at once (the group commit's batch),
-- as `sql::STEP_MARK_DONE_MANY` in the engine wrote them before, with the
-- claim queue row of each finished event deleted. A function so that its
-- plan is generic, made once per connection: sent as a statement of its
-- own, it was planned again at every mark of one step (concurrency 1),
-- since a custom plan for one mark always looks cheaper than the generic
-- plan for the ten a parameter array is guessed to hold.
CREATE FUNCTION tickmark_mark_done_many(
    mark_events    BIGINT[],
    mark_tokens    BIGINT[],
    mark_positions INT[],
    mark_names     TEXT[],
    mark_attempts  INT[],
    mark_started   TIMESTAMPTZ[],
    mark_finished  TIMESTAMPTZ[],
    mark_outputs   TEXT[]
)
RETURNS SETOF BIGINT
LANGUAGE plpgsql
VOLATILE
SET plan_cache_mode = force_generic_plan
-- Each mark finds its event by the primary key, in the batch's order (the
-- caller sorts it by event: one lock order for every batch), whatever the
-- table's size when the plan is made.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH marks AS (
        SELECT * FROM unnest(mark_events, mark_tokens, mark_positions, mark_names, mark_attempts,
                             mark_started, mark_finished, mark_outputs)
            AS m (event_seq, token, position, name, attempts, started_at, finished_at, output)
    ),
    advanced AS (
        UPDATE tickmark_events AS e
        SET next_step = e.next_step + 1,
            state = CASE WHEN e.next_step + 1 >= e.step_count THEN 'done' ELSE 'running' END,
            attempt = CASE WHEN e.next_step + 1 >= e.step_count THEN e.attempt ELSE 1 END,
            interrupted = CASE WHEN e.next_step + 1 >= e.step_count THEN e.interrupted ELSE 0 END,
            suspect = false,
            finished_at = CASE WHEN e.next_step + 1 >= e.step_count THEN now() END,
            queued_due_at = CASE WHEN e.next_step + 1 >= e.step_count THEN NULL
                                 ELSE e.queued_due_at END,
            step_started_at = now(),
            last_error = NULL,
            progress = NULL,
            progress_message = NULL
        FROM marks AS m
        WHERE e.id = m.event_seq AND e.lease_token = m.token AND e.state = 'running'
          AND e.next_step = m.position AND e.due_at > now()
        -- The mark's own fields too: the step rows below need no join.
        RETURNING e.id, e.state, m.position, m.name, m.attempts, m.token, m.started_at,
                  m.finished_at, m.output
    ),
    dequeued AS (
        DELETE FROM tickmark_queue AS q USING advanced AS a
        WHERE q.event_seq = a.id AND a.state = 'done'
    )
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output)
    SELECT a.id, a.position, a.name, 'done', a.attempts, a.token, a.started_at,
           a.finished_at, a.output::json
    FROM advanced AS a
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = 'done', attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        output = EXCLUDED.output, last_error = NULL
    RETURNING tickmark_steps.event_seq;
END
$$;

-- CREATE OR REPLACE dropped what earlier migrations set on the two claim
-- functions: set it again, and on the new functions (migration 0011).
ALTER FUNCTION tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tickmark_claimable(INT, BOOLEAN, BOOLEAN, TEXT[], TEXT[])
    SET plan_cache_mode = force_generic_plan;

DO $$
DECLARE
    signature TEXT;
BEGIN
    FOREACH signature IN ARRAY ARRAY[
        'tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[], BOOLEAN, BOOLEAN)',
        'tickmark_claimable(INT, BOOLEAN, BOOLEAN, TEXT[], TEXT[])',
        'tickmark_limit_held(TEXT)',
        'tickmark_mark_done_many(BIGINT[], BIGINT[], INT[], TEXT[], INT[], TIMESTAMPTZ[],
                                 TIMESTAMPTZ[], TEXT[])',
        'tickmark_queue_mend()',
        'tickmark_queue_truncated()'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %1$I.%2$s SET search_path = pg_catalog, %1$I, pg_temp',
                       current_schema(), signature);
    END LOOP;
END
$$;
