-- Flow control (docs/flow_control.md): rate limits and concurrency limits per
-- key. Same shape as migrations/postgres/0008_flow_control.sql, which says why.

CREATE TABLE tickmark_rate_buckets (
    bucket  TEXT    PRIMARY KEY,
    tat_us  INTEGER NOT NULL,
    wait_us INTEGER NOT NULL DEFAULT 0
) STRICT;

ALTER TABLE tickmark_events ADD COLUMN throttled_by TEXT;
ALTER TABLE tickmark_events ADD COLUMN limit_key TEXT;
ALTER TABLE tickmark_events ADD COLUMN limit_n INTEGER;

CREATE INDEX tickmark_events_limit ON tickmark_events (limit_key)
    WHERE state = 'running' AND limit_key IS NOT NULL;

DROP VIEW tickmark_step_status;
CREATE VIEW tickmark_step_status AS
SELECT
    e.id                                                AS event_seq,
    e.source                                            AS source,
    e.dedup_key                                         AS event_id,
    e.kind                                              AS kind,
    CAST(p.key AS INTEGER)                              AS position,
    json_extract(p.value, '$.name')                     AS step,
    e.source || ':' || e.dedup_key || ':' || json_extract(p.value, '$.name') AS idempotency_key,
    CASE
        WHEN s.state IN ('done', 'skipped') THEN s.state
        WHEN p.key > e.next_step THEN
            CASE WHEN e.state IN ('pending', 'running') THEN 'pending' ELSE 'not_run' END
        WHEN e.state = 'running' THEN
            CASE WHEN e.due_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now') THEN 'running' ELSE 'interrupted' END
        WHEN e.state = 'pending' THEN
            CASE WHEN e.snoozed AND e.throttled_by IS NOT NULL THEN 'throttled'
                 WHEN e.snoozed THEN 'snoozed'
                 WHEN s.state = 'failed' THEN 'retrying' ELSE 'pending' END
        ELSE e.state
    END                                                 AS state,
    CASE WHEN p.key = e.next_step THEN e.attempt ELSE coalesce(s.attempts, 0) END AS attempts,
    CASE WHEN p.key = e.next_step AND e.state = 'running' THEN e.step_started_at
         ELSE s.started_at END                          AS started_at,
    CASE WHEN s.state IN ('done', 'skipped') THEN s.finished_at END AS finished_at,
    CASE WHEN p.key = e.next_step AND e.state = 'pending' THEN e.due_at END AS retry_at,
    CASE WHEN p.key = e.next_step AND e.state = 'running' THEN e.due_at END AS lease_until,
    CASE WHEN p.key = e.next_step AND e.state = 'running' THEN e.lease_owner END AS worker,
    CASE WHEN p.key = e.next_step THEN coalesce(e.last_error, s.last_error)
         ELSE s.last_error END                          AS last_error,
    s.output                                            AS output,
    CASE WHEN p.key = e.next_step AND e.state = 'running' THEN e.progress END AS progress,
    CASE WHEN p.key = e.next_step AND e.state = 'running' THEN e.progress_message END AS progress_message
FROM tickmark_events e
CROSS JOIN json_each(e.plan, '$.steps') AS p
LEFT JOIN tickmark_steps s ON s.event_seq = e.id AND s.position = p.key;
