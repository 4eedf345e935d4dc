-- The audit trail: one row per manual action on an event, written in the same
-- transaction as the action, deleted with its event. Same shape as
-- migrations/postgres/0002_audit.sql; `at` is fixed-width UTC text.
CREATE TABLE tickmark_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id INTEGER NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    at       TEXT    NOT NULL,
    actor    TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    step     TEXT,
    reason   TEXT,
    detail   TEXT
) STRICT;

CREATE INDEX tickmark_audit_event ON tickmark_audit (event_id, id);
