-- Personal data (issue 46; docs/privacy.md).
--
-- `subjects`: the keyed hashes (HMAC-SHA256, hex) of the subjects a handler
-- found in the event's payload (a customer id, an email, a shop domain),
-- separated by spaces; never the subjects themselves. NULL: none declared.
-- `erased_at`: when the event's subject was erased. Its payload, its steps'
-- outputs and errors, and its audit trail's free text are gone; the row
-- stays, so a redelivery is still a duplicate and its step-status rows
-- still say what ran. Nullable columns without a default: adding them
-- rewrites nothing.
ALTER TABLE tickmark_events
    ADD COLUMN subjects TEXT CHECK (subjects ~ '^[0-9a-f]{64}( [0-9a-f]{64})*$'),
    ADD COLUMN erased_at TIMESTAMPTZ;

-- Erasing a subject finds its events without reading the table.
CREATE INDEX tickmark_events_subjects ON tickmark_events
    USING gin (string_to_array(subjects, ' '))
    WHERE subjects IS NOT NULL;

-- The keys that sealed this database's payloads and outputs, by id, each
-- with a check value (an HMAC of a fixed text under the key, never the key):
-- an engine started with a different key under the same id, without a key
-- rows were sealed with, or without keys at all, refuses to start instead
-- of failing to read or writing plaintext. `tickmark keys rotate` retires
-- a key once no row is sealed with it.
CREATE TABLE tickmark_keys (
    key_id        TEXT PRIMARY KEY CHECK (key_id ~ '^[A-Za-z0-9_-]{1,32}$'),
    key_check     TEXT NOT NULL CHECK (key_check ~ '^[0-9a-f]{32}$'),
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
