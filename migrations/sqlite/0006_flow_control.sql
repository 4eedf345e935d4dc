-- Flow control (docs/flow_control.md): rate limits, concurrency limits and
-- debounce per key. Same shape as migrations/postgres/0008_flow_control.sql,
-- which says why.

CREATE TABLE tickmark_rate_buckets (
    bucket  TEXT    PRIMARY KEY,
    tat_us  INTEGER NOT NULL,
    wait_us INTEGER NOT NULL DEFAULT 0
) STRICT;

-- A new state, `superseded`, needs a new CHECK, and SQLite changes a CHECK
-- only by rebuilding the table (https://sqlite.org/lang_altertable.html,
-- "making other kinds of table schema changes"). The steps and audit tables
-- point at `tickmark_events` with ON DELETE CASCADE, and with foreign keys
-- on (they are, and a migration's transaction cannot turn them off)
-- dropping or renaming the old table would empty them or re-point them. So
-- they are set aside in plain copies first, and rebuilt, unchanged, after.
-- Row numbers are never reused: each AUTOINCREMENT keeps its high-water mark.
CREATE TABLE tickmark_steps_kept AS SELECT * FROM tickmark_steps;
CREATE TABLE tickmark_audit_kept AS SELECT * FROM tickmark_audit;
CREATE TABLE tickmark_sequence_kept AS SELECT name, seq FROM sqlite_sequence;
DROP VIEW tickmark_step_status;
DROP TABLE tickmark_steps;
DROP TABLE tickmark_audit;

CREATE TABLE tickmark_events_rebuilt (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT    NOT NULL,
    dedup_key       TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    plan            TEXT    NOT NULL,
    state           TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'parked', 'ignored', 'cancelled',
                         'stale', 'superseded')),
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
    replay_key      TEXT,
    throttled_by    TEXT,
    limit_key       TEXT,
    limit_n         INTEGER,
    debounce_key    TEXT,
    burst_started_at TEXT,
    superseded_by   INTEGER,
    UNIQUE (source, dedup_key)
) STRICT;

INSERT INTO tickmark_events_rebuilt
    (id, source, dedup_key, kind, payload, plan, state, step_count, next_step, attempt,
     due_at, lease_owner, lease_token, takeovers, last_error, received_at, step_started_at,
     finished_at, progress, progress_message, snoozed, resource_key, resource_seq, replay_key)
SELECT id, source, dedup_key, kind, payload, plan, state, step_count, next_step, attempt,
       due_at, lease_owner, lease_token, takeovers, last_error, received_at, step_started_at,
       finished_at, progress, progress_message, snoozed, resource_key, resource_seq, replay_key
FROM tickmark_events;

DROP TABLE tickmark_events;
ALTER TABLE tickmark_events_rebuilt RENAME TO tickmark_events;

CREATE TABLE tickmark_steps (
    event_seq   INTEGER NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('done', 'failed', 'dead', 'skipped')),
    attempts    INTEGER NOT NULL,
    lease_token INTEGER NOT NULL,
    started_at  TEXT,
    finished_at TEXT    NOT NULL,
    output      TEXT,
    last_error  TEXT,
    PRIMARY KEY (event_seq, position)
) STRICT;
INSERT INTO tickmark_steps
    (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output,
     last_error)
SELECT event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output,
       last_error
FROM tickmark_steps_kept;
DROP TABLE tickmark_steps_kept;

CREATE TABLE tickmark_audit (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    event_seq INTEGER NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    at        TEXT    NOT NULL,
    actor     TEXT    NOT NULL,
    action    TEXT    NOT NULL,
    step      TEXT,
    reason    TEXT,
    detail    TEXT
) STRICT;
INSERT INTO tickmark_audit (id, event_seq, at, actor, action, step, reason, detail)
SELECT id, event_seq, at, actor, action, step, reason, detail FROM tickmark_audit_kept;
DROP TABLE tickmark_audit_kept;
CREATE INDEX tickmark_audit_event ON tickmark_audit (event_seq, id);

DELETE FROM sqlite_sequence WHERE name IN ('tickmark_events', 'tickmark_audit');
INSERT INTO sqlite_sequence (name, seq)
SELECT name, seq FROM tickmark_sequence_kept WHERE name IN ('tickmark_events', 'tickmark_audit');
DROP TABLE tickmark_sequence_kept;

CREATE INDEX tickmark_events_due ON tickmark_events (due_at, id)
    WHERE state IN ('pending', 'running');
CREATE INDEX tickmark_events_serial ON tickmark_events (resource_key, id)
    WHERE state IN ('pending', 'running') AND resource_key IS NOT NULL;
CREATE UNIQUE INDEX tickmark_events_replay ON tickmark_events (source, replay_key)
    WHERE replay_key IS NOT NULL;
CREATE INDEX tickmark_events_limit ON tickmark_events (limit_key, due_at)
    WHERE state = 'running' AND limit_key IS NOT NULL;
CREATE INDEX tickmark_events_debounce ON tickmark_events (debounce_key)
    WHERE state = 'pending' AND debounce_key IS NOT NULL;

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
