-- Traces (issue 45; docs/observability.md), as PostgreSQL's migration
-- 0020: the W3C trace context of the span that accepted an event, which
-- every later run of it continues. NULL when tracing is off.
ALTER TABLE tickmark_events ADD COLUMN traceparent TEXT
    CHECK (length(traceparent) = 55);
ALTER TABLE tickmark_events ADD COLUMN tracestate TEXT
    CHECK (length(tracestate) <= 512);
