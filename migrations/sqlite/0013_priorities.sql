-- Priorities: a handler's head start (issue 44; docs/flow_control.md,
-- "Priorities: a head start"), as PostgreSQL's migration 0019: claims walk
-- events by rank, the due time less the handler's head start, instead of
-- by due time; a tenant's share in a fair claim too.
ALTER TABLE tickmark_events ADD COLUMN head_start_ms INTEGER NOT NULL DEFAULT 0
    CHECK (head_start_ms >= 0);

-- In the stored times' format (time.rs), so it compares with them as text.
-- Virtual: computed when read, and kept in the indexes below.
ALTER TABLE tickmark_events ADD COLUMN rank_at TEXT
    GENERATED ALWAYS AS (
        CASE WHEN head_start_ms = 0 THEN due_at
             ELSE strftime('%Y-%m-%dT%H:%M:%fZ', due_at, '-' || (head_start_ms / 1000.0) || ' seconds')
        END
    ) VIRTUAL;

-- A rank is never after its due time: `rank_at <= now` bounds the search
-- for due events, and the few ranked before now but not yet due (a retry
-- inside its head start) are skipped on the way.
DROP INDEX tickmark_events_due;
CREATE INDEX tickmark_events_rank ON tickmark_events (rank_at, id)
    WHERE state IN ('pending', 'running');

DROP INDEX tickmark_events_tenant;
CREATE INDEX tickmark_events_tenant ON tickmark_events (tenant_key, rank_at, id)
    WHERE state IN ('pending', 'running') AND tenant_key IS NOT NULL;
