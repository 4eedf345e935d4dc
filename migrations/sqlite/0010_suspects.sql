-- Suspects that stay suspects (docs/guarantees.md, guarantee 14; the
-- PostgreSQL migration 0014 says why): set by the claim that takes a
-- suspect, kept by a release (a shutdown, a snooze, a throttle, a
-- transaction not opened), cleared by a mark of its step and by an
-- operator's retry or settle. Only a claim alone takes a suspect.
ALTER TABLE tickmark_events ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0;
