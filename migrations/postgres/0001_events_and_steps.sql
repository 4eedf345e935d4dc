-- tickmark's schema for PostgreSQL: the inbox, the step marks and the step-status view.
-- The state machine is documented in docs/state_machine.md; the Rust mirror is
-- `tickmark::EventState` and `tickmark::StepState`.

-- One row per accepted event. Inserting is the dedup decision: (source, dedup_key) is unique.
CREATE TABLE tickmark_events (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source          TEXT        NOT NULL,
    -- The provider's event id, or `sha256:<hex>` of the raw body when the provider gives none.
    dedup_key       TEXT        NOT NULL,
    kind            TEXT        NOT NULL,
    payload         JSON        NOT NULL,
    -- The handler's steps as they were when the event was accepted (typetag JSON).
    plan            JSON        NOT NULL,
    state           TEXT        NOT NULL
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'parked', 'ignored', 'cancelled', 'stale')),
    step_count      INT         NOT NULL,
    -- Position of the first unfinished step; equals step_count once done.
    next_step       INT         NOT NULL DEFAULT 0,
    -- Attempts of the step at next_step, counted when a claim starts one.
    attempt         INT         NOT NULL DEFAULT 0,
    -- When a worker may next claim the row: the retry time while pending,
    -- the lease expiry while running. One column, so one index serves both.
    due_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_owner     TEXT,
    -- Fencing token: changes on every claim; marks and heartbeats filter on it.
    lease_token     BIGINT      NOT NULL DEFAULT 0,
    -- Claims that took over an expired lease (a worker died or stalled).
    takeovers       INT         NOT NULL DEFAULT 0,
    last_error      TEXT,
    received_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    step_started_at TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ,
    -- What the running step last reported (`StepContext::progress`); reset by claims and marks.
    progress        REAL,
    progress_message TEXT,
    -- The event is waiting because its step asked to be run again later (a snooze).
    snoozed         BOOLEAN     NOT NULL DEFAULT false,
    -- Ordering (docs/ordering.md): the resource the event is about — events
    -- with the same key run one at a time, in acceptance order — and its
    -- sequence (an event not newer than the last applied one is stale).
    resource_key    TEXT,
    resource_seq    BIGINT,
    CONSTRAINT tickmark_events_dedup UNIQUE (source, dedup_key)
)
-- Room on each page, so the many updates of a running event (one per mark,
-- none touching an indexed column) stay heap-only (HOT).
WITH (fillfactor = 80);

-- The claim walks this index in its exact order: no sort of the backlog, no OR.
CREATE INDEX tickmark_events_due ON tickmark_events (due_at, id)
    WHERE state IN ('pending', 'running');

-- Events that must wait for an earlier unfinished event of the same serial key.
CREATE INDEX tickmark_events_serial ON tickmark_events (resource_key, id)
    WHERE state IN ('pending', 'running') AND resource_key IS NOT NULL;

-- The last applied sequence per resource, for skipping stale events.
CREATE TABLE tickmark_resources (
    resource_key TEXT        PRIMARY KEY,
    last_seq     BIGINT      NOT NULL,
    event_id     BIGINT      NOT NULL,
    applied_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per (event, step) that has been marked: done, failed (retry scheduled),
-- dead or skipped. Steps not yet marked have no row; the view derives them.
CREATE TABLE tickmark_steps (
    event_id    BIGINT      NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    position    INT         NOT NULL,
    name        TEXT        NOT NULL,
    state       TEXT        NOT NULL CHECK (state IN ('done', 'failed', 'dead', 'skipped')),
    attempts    INT         NOT NULL,
    -- The fencing token of the lease the mark was made under.
    lease_token BIGINT      NOT NULL,
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ NOT NULL,
    output      JSON,
    last_error  TEXT,
    PRIMARY KEY (event_id, position)
);

-- The step-status table: one row per (event, step), marked or not.
-- Derived states (no write per step start): `running` is the current step of a
-- leased event; `interrupted` is the current step of an event whose lease has
-- expired without a mark, so its outcome is unknown and it re-runs with the same key.
CREATE VIEW tickmark_step_status AS
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
            CASE WHEN e.snoozed THEN 'snoozed' WHEN s.state = 'failed' THEN 'retrying' ELSE 'pending' END
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
LEFT JOIN tickmark_steps s ON s.event_id = e.id AND s.position = p.ordinality - 1;
