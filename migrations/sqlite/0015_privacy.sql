-- Personal data (issue 46; docs/privacy.md), as PostgreSQL's migration
-- 0021: the keyed hashes of an event's subjects (64 hex digits each,
-- separated by spaces), when its subject was erased, and the keys that
-- sealed this database's payloads and outputs, each with a check value.
ALTER TABLE tickmark_events ADD COLUMN subjects TEXT
    CHECK (length(subjects) % 65 = 64 AND subjects NOT GLOB '*[^0-9a-f ]*');
ALTER TABLE tickmark_events ADD COLUMN erased_at TEXT;

CREATE TABLE tickmark_keys (
    key_id        TEXT PRIMARY KEY
                  CHECK (length(key_id) BETWEEN 1 AND 32 AND key_id NOT GLOB '*[^A-Za-z0-9_-]*'),
    key_check     TEXT NOT NULL CHECK (length(key_check) = 32 AND key_check NOT GLOB '*[^0-9a-f]*'),
    registered_at TEXT NOT NULL
);
