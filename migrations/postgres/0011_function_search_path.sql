-- Each function tickmark creates finds tickmark's tables in the schema it was
-- created in, whatever the calling session's `search_path` says: a session
-- that set another schema (an application sharing the pool, an operator's
-- psql) still claims from this schema's tables, and an object of the same
-- name elsewhere on the path cannot stand in for one of tickmark's or for a
-- built-in (pg_catalog first, pg_temp last, as PostgreSQL advises for
-- functions: "Writing SECURITY DEFINER Functions Safely").
--
-- tickmark's tables live in the connection's `search_path` schema, so the
-- schema is only known when the migration runs: `current_schema()`, through
-- dynamic SQL. A later migration that replaces one of these functions
-- (CREATE OR REPLACE drops its SET clauses) must pin it again; a test checks
-- every function of the schema (tests/src/conformance/isolation.rs).
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %1$I.tickmark_claim(TEXT, INT, FLOAT8, TEXT[], TEXT[])
             SET search_path = pg_catalog, %1$I, pg_temp',
        current_schema());
    EXECUTE format(
        'ALTER FUNCTION %1$I.tickmark_key_hash(TEXT, TEXT)
             SET search_path = pg_catalog, %1$I, pg_temp',
        current_schema());
END
$$;
