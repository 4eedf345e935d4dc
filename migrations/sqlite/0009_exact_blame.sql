-- Exact blame for a crash (docs/guarantees.md; the PostgreSQL migration
-- 0012 says why). Whether the current (or last) lease was taken by a claim
-- alone, and how many runs of the current step were interrupted beside
-- other events (refunded: `attempt - interrupted` is held against
-- `max_attempts`). An expired batch lease gets one second chance in a
-- batch; lost again, or lost while held alone, it is a suspect, which only
-- a claim alone takes over.
ALTER TABLE tickmark_events ADD COLUMN claimed_alone INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tickmark_events ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0;
