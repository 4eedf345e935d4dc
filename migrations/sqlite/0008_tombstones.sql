-- Dedup tombstones (docs/operations.md, "Pruning"): when `tickmark prune`
-- deletes a finished event (its payload, plan, steps), it keeps this compact
-- record for the dedup window, so that a late redelivery is still answered as
-- a duplicate and never runs again. One row per key the event was accepted
-- under: its dedup key, and its replay key when it had one.
CREATE TABLE tickmark_tombstones (
    source      TEXT NOT NULL,
    -- The first 16 bytes of SHA-256 over `dedup:<dedup key>` or
    -- `replay:<replay key>` (`tickmark::store::tombstone::key_hash`; SQLite
    -- has no SHA-256 of its own, so the store computes it).
    key_hash    BLOB NOT NULL,
    -- When the event was accepted: the tombstone expires a dedup window later.
    accepted_at TEXT NOT NULL,
    PRIMARY KEY (source, key_hash)
) WITHOUT ROWID;

-- Expiry deletes the oldest tombstones first.
CREATE INDEX tickmark_tombstones_accepted ON tickmark_tombstones (accepted_at);
