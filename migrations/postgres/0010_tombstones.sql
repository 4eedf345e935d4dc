-- Dedup tombstones (docs/operations.md, "Pruning"): when `tickmark prune`
-- deletes a finished event (its payload, plan, steps), it keeps this compact
-- record for the dedup window, so that a late redelivery is still answered as
-- a duplicate and never runs again. One row per key the event was accepted
-- under: its dedup key, and its replay key when it had one.
CREATE TABLE tickmark_tombstones (
    source      TEXT        NOT NULL,
    -- The first 16 bytes of SHA-256 over `dedup:<dedup key>` or
    -- `replay:<replay key>` (`tickmark_key_hash`; the Rust mirror is
    -- `tickmark::store::tombstone::key_hash`).
    key_hash    BYTEA       NOT NULL,
    -- When the event was accepted: the tombstone expires a dedup window later.
    accepted_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (source, key_hash)
);

-- Expiry deletes the oldest tombstones. Prune writes them oldest first, so a
-- block-range index finds them at a few bytes per thousand rows.
CREATE INDEX tickmark_tombstones_accepted ON tickmark_tombstones USING brin (accepted_at);

-- The key a tombstone stores, computed where the event is (prune and the
-- accept's check are one statement each).
CREATE FUNCTION tickmark_key_hash(kind TEXT, key TEXT) RETURNS BYTEA
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT substring(sha256(convert_to(kind || ':' || key, 'UTF8')) FROM 1 FOR 16) $$;
