-- The audit trail: one row per manual action on an event (`tickmark events retry`,
-- `events cancel`, `steps skip`, `steps mark-done`, and the same actions from the
-- dashboard). Written in the same transaction as the action, so an action without
-- its audit row cannot exist. Deleted with its event (`tickmark prune`).
CREATE TABLE tickmark_audit (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id BIGINT      NOT NULL REFERENCES tickmark_events (id) ON DELETE CASCADE,
    at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Who: `$USER@host` from the CLI, `dashboard` (or its user) from the web page.
    actor    TEXT        NOT NULL,
    -- What: `retry`, `cancel`, `skip`, `mark_done`.
    action   TEXT        NOT NULL,
    -- The step acted on (the step re-run from, skipped or marked done), if any.
    step     TEXT,
    -- Why, in the operator's words.
    reason   TEXT,
    -- What changed, in words: `dead → pending at step send_receipt (position 1)`.
    detail   TEXT
);

-- `tickmark events show` reads one event's trail, oldest first; the cascade
-- on prune finds the rows to delete.
CREATE INDEX tickmark_audit_event ON tickmark_audit (event_id, id);
