-- GENERATED FILE, NOT APPLIED: tickmark's SQLite schema as
-- migrations/sqlite/*.sql leave it. The migrations are the source; this
-- is their result, read back from a freshly migrated database's catalogs
-- by tests/tests/it/schema_snapshot.rs, which fails when the two differ.
-- Regenerate it after changing a migration, and commit it with the migration:
--   TICKMARK_BLESS_SCHEMA=1 cargo test -p tickmark-tests --test it schema_snapshot::
-- What it holds and why not a dump: docs/schema.md.
-- SQLite keeps each object's statement as written (comments included) and
-- rewrites it on ALTER TABLE. tickmark_migrations is the migration history,
-- created by tickmark's migrator rather than by a migration: its shape is
-- listed, its rows are not.

-- Tables

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

CREATE TABLE "tickmark_events" (
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
    superseded_by   INTEGER, wait_key TEXT, wait_since TEXT, wait_until TEXT, claimed_alone INTEGER NOT NULL DEFAULT 0, interrupted INTEGER NOT NULL DEFAULT 0, suspect INTEGER NOT NULL DEFAULT 0, tenant_key TEXT, head_start_ms INTEGER NOT NULL DEFAULT 0
    CHECK (head_start_ms >= 0), rank_at TEXT
    GENERATED ALWAYS AS (
        CASE WHEN head_start_ms = 0 THEN due_at
             ELSE strftime('%Y-%m-%dT%H:%M:%fZ', due_at, '-' || (head_start_ms / 1000.0) || ' seconds')
        END
    ) VIRTUAL, traceparent TEXT
    CHECK (length(traceparent) = 55), tracestate TEXT
    CHECK (length(tracestate) <= 512), subjects TEXT
    CHECK (length(subjects) % 65 = 64 AND subjects NOT GLOB '*[^0-9a-f ]*'), erased_at TEXT,
    UNIQUE (source, dedup_key)
) STRICT;

CREATE TABLE tickmark_fair_clock (
    only_row     INTEGER PRIMARY KEY CHECK (only_row = 1),
    virtual_time REAL    NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE tickmark_keys (
    key_id        TEXT PRIMARY KEY
                  CHECK (length(key_id) BETWEEN 1 AND 32 AND key_id NOT GLOB '*[^A-Za-z0-9_-]*'),
    key_check     TEXT NOT NULL CHECK (length(key_check) = 32 AND key_check NOT GLOB '*[^0-9a-f]*'),
    registered_at TEXT NOT NULL
);

CREATE TABLE tickmark_match_keys (
    match_key   TEXT    NOT NULL,
    event_seq   INTEGER NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    received_at TEXT    NOT NULL,
    PRIMARY KEY (match_key, event_seq)
) WITHOUT ROWID;

CREATE TABLE tickmark_migrations (
    version        BIGINT PRIMARY KEY,
    description    TEXT NOT NULL,
    installed_on   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success        BOOLEAN NOT NULL,
    checksum       BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);

CREATE TABLE tickmark_rate_buckets (
    bucket  TEXT    PRIMARY KEY,
    tat_us  INTEGER NOT NULL,
    wait_us INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE tickmark_reconcile_cursors (
    source               TEXT    PRIMARY KEY,
    -- The provider's id of the newest object fully handled (NULL: none yet,
    -- or forgotten by an operator's reset).
    cursor               TEXT,
    -- That object's creation time at the provider.
    cursor_at            TEXT,
    lease_owner          TEXT,
    lease_until          TEXT,
    fence                INTEGER NOT NULL DEFAULT 0,
    last_run_started_at  TEXT,
    last_run_finished_at TEXT,
    -- What the last run reported, as JSON text (the reconciler's own shape).
    last_summary         TEXT,
    updated_at           TEXT    NOT NULL
) STRICT;

CREATE TABLE tickmark_resources (
    resource_key TEXT    PRIMARY KEY,
    last_seq     INTEGER NOT NULL,
    event_seq     INTEGER NOT NULL,
    applied_at   TEXT    NOT NULL
) STRICT;

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

CREATE TABLE tickmark_tenants (
    tenant_key    TEXT PRIMARY KEY,
    weight        REAL NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000000),
    pass          REAL NOT NULL DEFAULT 0,
    weight_set_at TEXT
) STRICT;

CREATE TABLE tickmark_tombstones (
    source      TEXT NOT NULL,
    -- The first 16 bytes of SHA-256 over `dedup:<dedup key>` or
    -- `replay:<replay key>` (`tickmark::store::tombstone::key_hash`; SQLite
    -- has no SHA-256 of its own, so the store computes it).
    key_hash    BLOB NOT NULL,
    -- When the event was accepted: the tombstone expires a dedup window later.
    accepted_at TEXT NOT NULL,
    PRIMARY KEY (source, key_hash)
) WITHOUT ROWID;

-- Indexes

CREATE INDEX tickmark_audit_event ON tickmark_audit (event_seq, id);

CREATE INDEX tickmark_events_debounce ON tickmark_events (debounce_key)
    WHERE state = 'pending' AND debounce_key IS NOT NULL;

CREATE INDEX tickmark_events_limit ON tickmark_events (limit_key, due_at)
    WHERE state = 'running' AND limit_key IS NOT NULL;

CREATE INDEX tickmark_events_rank ON tickmark_events (rank_at, id)
    WHERE state IN ('pending', 'running');

CREATE UNIQUE INDEX tickmark_events_replay ON tickmark_events (source, replay_key)
    WHERE replay_key IS NOT NULL;

CREATE INDEX tickmark_events_serial ON tickmark_events (resource_key, id)
    WHERE state IN ('pending', 'running') AND resource_key IS NOT NULL;

CREATE INDEX tickmark_events_tenant ON tickmark_events (tenant_key, rank_at, id)
    WHERE state IN ('pending', 'running') AND tenant_key IS NOT NULL;

CREATE INDEX tickmark_events_waiting ON tickmark_events (wait_key)
    WHERE state = 'pending' AND wait_key IS NOT NULL;

CREATE INDEX tickmark_match_keys_event ON tickmark_match_keys (event_seq);

CREATE INDEX tickmark_tombstones_accepted ON tickmark_tombstones (accepted_at);

-- Views

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
            CASE WHEN e.wait_until IS NOT NULL THEN 'waiting'
                 WHEN e.snoozed AND e.throttled_by IS NOT NULL THEN 'throttled'
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

-- Triggers

-- (none)
