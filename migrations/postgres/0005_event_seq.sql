-- One meaning per word: `event_id` is the provider's id of an event (its dedup
-- key: the `event_id` column of tickmark_step_status, the `event_id` log
-- field); the row number of tickmark_events is `event_seq`. The tables that
-- point at an event's row called their column `event_id`: renamed here.
-- PostgreSQL rewrites the step-status view, which reads these columns, itself.
ALTER TABLE tickmark_steps RENAME COLUMN event_id TO event_seq;
ALTER TABLE tickmark_audit RENAME COLUMN event_id TO event_seq;
ALTER TABLE tickmark_resources RENAME COLUMN event_id TO event_seq;
