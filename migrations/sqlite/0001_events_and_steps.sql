-- tickmark's schema for SQLite: the inbox, the step marks and the step-status view.
-- Same shape as migrations/postgres; times are UTC text in one fixed-width format
-- (YYYY-MM-DDTHH:MM:SS.sssZ), so they read well and compare correctly as text.

CREATE TABLE tickmark_events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT    NOT NULL,
    dedup_key       TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    plan            TEXT    NOT NULL,
    state           TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'parked', 'ignored', 'cancelled', 'stale')),
    step_count      INTEGER NOT NULL,
    next_step       INTEGER NOT NULL DEFAULT 0,
    attempt         INTEGER NOT NULL DEFAULT 0,
    due_at          TEXT    NOT NULL,
    lease_owner     TEXT,
    lease_token     INTEGER NOT NULL DEFAULT 0,
    takeovers       INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    received_at     TEXT    NOT NULL,
    step_started_at TEXT,
    finished_at     TEXT,
    progress        REAL,
    progress_message TEXT,
    snoozed         INTEGER NOT NULL DEFAULT 0,
    resource_key    TEXT,
    resource_seq    INTEGER,
    UNIQUE (source, dedup_key)
) STRICT;

CREATE INDEX tickmark_events_due ON tickmark_events (due_at, id)
    WHERE state IN ('pending', 'running');

CREATE INDEX tickmark_events_serial ON tickmark_events (resource_key, id)
    WHERE state IN ('pending', 'running') AND resource_key IS NOT NULL;

CREATE TABLE tickmark_resources (
    resource_key TEXT    PRIMARY KEY,
    last_seq     INTEGER NOT NULL,
    event_id     INTEGER NOT NULL,
    applied_at   TEXT    NOT NULL
) STRICT;

CREATE TABLE tickmark_steps (
    event_id    INTEGER NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('done', 'failed', 'dead', 'skipped')),
    attempts    INTEGER NOT NULL,
    lease_token INTEGER NOT NULL,
    started_at  TEXT,
    finished_at TEXT    NOT NULL,
    output      TEXT,
    last_error  TEXT,
    PRIMARY KEY (event_id, position)
) STRICT;

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
            CASE WHEN e.snoozed THEN 'snoozed' WHEN s.state = 'failed' THEN 'retrying' ELSE 'pending' END
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
LEFT JOIN tickmark_steps s ON s.event_id = e.id AND s.position = p.key;
