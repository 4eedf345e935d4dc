-- A second dedup key, for sources whose signature does not cover the event id
-- (GitHub, Shopify, Twilio, a generic source with the id in a header): the
-- receiver derives it from what the signature does cover (`sig:` + SHA-256 of
-- the verified signature), so that a captured delivery sent again with a new
-- id header is a duplicate. NULL for every other event.
--
-- The insert's `ON CONFLICT DO NOTHING` names no target, so it covers both
-- unique keys in one statement. The key lives on the event row, so it is
-- kept exactly as long as the dedup key (pruning deletes both).
ALTER TABLE tickmark_events ADD COLUMN replay_key TEXT;

CREATE UNIQUE INDEX tickmark_events_replay ON tickmark_events (source, replay_key)
    WHERE replay_key IS NOT NULL;
