-- Durable waits (docs/long_handlers.md): a step that waits for another
-- accepted event, or for a time, holding no lease and no worker slot.

-- The keys accepted events can be matched by: one row per (key, event) for
-- every key some handler's wait reads from events of that source and kind
-- (`{source}␟{kind}␟{pointers}␟{value}`). A wait looks its match up here.
CREATE TABLE tickmark_match_keys (
    match_key   TEXT        NOT NULL,
    event_seq   BIGINT      NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (match_key, event_seq)
);
-- Prune deletes an event's keys with it.
CREATE INDEX tickmark_match_keys_event ON tickmark_match_keys (event_seq);

ALTER TABLE tickmark_events
    -- While the event waits at step `next_step`: the key it waits on (NULL
    -- for a timer), when the wait began, and its deadline (also `due_at`,
    -- until an accept of a match makes the event due at once). Cleared when
    -- the wait settles.
    ADD COLUMN wait_key TEXT,
    ADD COLUMN wait_since TIMESTAMPTZ,
    ADD COLUMN wait_until TIMESTAMPTZ;

-- An accept finds the events waiting on its keys through this index.
CREATE INDEX tickmark_events_waiting ON tickmark_events (wait_key)
    WHERE state = 'pending' AND wait_key IS NOT NULL;

-- The step-status view learns `waiting`: a pending event whose current
-- step is a wait that has begun.
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
            CASE WHEN e.wait_until IS NOT NULL THEN 'waiting'
                 WHEN e.snoozed AND e.throttled_by IS NOT NULL THEN 'throttled'
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


-- The claim's statements are planned once and kept (migration 0007), but
-- PL/pgSQL's plan cache chooses a custom plan per call once the table has
-- rows, and tried again every call: with 10,000 waiting events a claim
-- that found nothing due took 1.26× to 1.9× as long (wait_bench,
-- docs/performance.md). Its planner settings already fix the plan's shape,
-- so the generic plan is the one it wants.
ALTER FUNCTION tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[])
    SET plan_cache_mode = force_generic_plan;
