-- Reconciliation (pulling the deliveries a provider's API lists but the
-- receiver never got): one row per receiver source. The cursor is the
-- provider's id of the newest object fully handled, so the next run resumes
-- after it. One process reconciles a source at a time: it holds the row's
-- lease (`lease_owner` until `lease_until`), fenced by `fence`, which every
-- take bumps; each later write of the run filters on it, as an event's
-- lease token does (engine/src/store/reconcile.rs). Times are UTC text in
-- the fixed-width format of every other table.
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
