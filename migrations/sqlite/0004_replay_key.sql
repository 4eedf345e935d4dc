-- A second dedup key, for sources whose signature does not cover the event id.
-- Same shape as migrations/postgres/0004_replay_key.sql, which says why.
ALTER TABLE tickmark_events ADD COLUMN replay_key TEXT;

CREATE UNIQUE INDEX tickmark_events_replay ON tickmark_events (source, replay_key)
    WHERE replay_key IS NOT NULL;
