-- Fair share across tenants (issue 44; docs/flow_control.md, "Fair share
-- across tenants"), as PostgreSQL's migration 0018: an event's tenant,
-- each tenant's due events in due order, the tenants' weights and virtual
-- times, and the clock. The claim that reads them is the store's
-- (`fair.rs`): SQLite has one writer, and a claim runs inside it.
ALTER TABLE tickmark_events ADD COLUMN tenant_key TEXT;

CREATE INDEX tickmark_events_tenant ON tickmark_events (tenant_key, due_at, id)
    WHERE state IN ('pending', 'running') AND tenant_key IS NOT NULL;

-- A tenant without a row has weight 1 and starts at the clock. NaN is
-- stored as NULL and refused; infinity fails the check.
CREATE TABLE tickmark_tenants (
    tenant_key    TEXT PRIMARY KEY,
    weight        REAL NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000000),
    pass          REAL NOT NULL DEFAULT 0,
    weight_set_at TEXT
) STRICT;

CREATE TABLE tickmark_fair_clock (
    only_row     INTEGER PRIMARY KEY CHECK (only_row = 1),
    virtual_time REAL    NOT NULL DEFAULT 0
) STRICT;
INSERT INTO tickmark_fair_clock (only_row) VALUES (1);
