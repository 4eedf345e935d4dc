-- Marking a step done is the hottest statement of the engine: one row of
-- tickmark_steps per step of every event. Its foreign key to tickmark_events
-- ran one lookup (a `FOR KEY SHARE` of the event's row) per inserted step row,
-- measured at about 40 % of a batch of marks, for a row the same statement
-- has just updated under its lease: the mark inserts a step row only for an
-- event it advanced (`JOIN advanced`), and no other statement inserts steps
-- for an event that is not there. Pruning deletes an event's steps with it
-- in one statement (`EVENT_PRUNE`), so the cascade is no longer needed.
-- docs/performance.md has the measurement.
ALTER TABLE tickmark_steps DROP CONSTRAINT tickmark_steps_event_id_fkey;
