-- Bytes per finished event and per tombstone on PostgreSQL (scripts/tombstone-bytes):
-- 20,000 finished 3-step events with a 1 KB payload, then the tombstones prune would keep.
\set n 20000
INSERT INTO tickmark_events (source, dedup_key, kind, payload, plan, state, step_count, next_step, received_at, finished_at)
SELECT 'stripe', 'evt_1NG8Du2eZvKYlo2C' || lpad(g::text, 8, '0'), 'invoice.paid',
       json_build_object('id', 'evt_' || g, 'type', 'invoice.paid', 'data', json_build_object('object', json_build_object('customer', 'cus_' || (g % 977), 'amount_paid', 1000 + g, 'lines', repeat('x', 880)))),
       '{"steps":[{"name":"credit_account","step":{"credit_account":{}}},{"name":"send_receipt","step":{"send_receipt":{}}},{"name":"render_invoice","step":{"render_invoice":{"dir":"/var/lib/payments/invoices"}}}]}'::json,
       'done', 3, 3, now() - interval '10 days', now() - interval '10 days'
FROM generate_series(1, :n) g;
INSERT INTO tickmark_steps (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output)
SELECT e.id, p.pos, p.name, 'done', 1, 1, now(), now(), '{"receipt":"rcpt_0001","ok":true}'::json
FROM tickmark_events e CROSS JOIN (VALUES (0,'credit_account'),(1,'send_receipt'),(2,'render_invoice')) AS p(pos, name);
VACUUM ANALYZE tickmark_events; VACUUM ANALYZE tickmark_steps;
SELECT 'full event' AS what, (pg_total_relation_size('tickmark_events') + pg_total_relation_size('tickmark_steps')) / :n AS bytes_each,
       pg_total_relation_size('tickmark_events') / :n AS events_table, pg_total_relation_size('tickmark_steps') / :n AS steps_table;
-- What prune writes: one tombstone per key (these events have no replay key).
INSERT INTO tickmark_tombstones (source, key_hash, accepted_at)
SELECT source, tickmark_key_hash('dedup', dedup_key), received_at FROM tickmark_events ORDER BY id;
VACUUM ANALYZE tickmark_tombstones;
SELECT 'tombstone' AS what, pg_total_relation_size('tickmark_tombstones') / :n AS bytes_each,
       pg_relation_size('tickmark_tombstones') / :n AS heap, pg_indexes_size('tickmark_tombstones') / :n AS indexes;
