-- Traces (issue 45; docs/observability.md): the W3C trace context of the
-- span that accepted an event, so that every later run of it (a retry
-- hours later, a takeover by another process, a snooze, a durable wait
-- that resumes days later) continues the same trace. Written only by an
-- engine built with the `otel` feature; NULL otherwise. Nullable columns
-- without a default: adding them rewrites nothing.
ALTER TABLE tickmark_events
    ADD COLUMN traceparent TEXT CHECK (length(traceparent) = 55),
    ADD COLUMN tracestate TEXT CHECK (length(tracestate) <= 512);
