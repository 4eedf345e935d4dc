//! The PostgreSQL statements of reconciliation (`store/reconcile.rs`): one
//! per transition of a source's row, each filtering on the expected state
//! and the fence. Times are the database's `now()`, as for event leases.

/// Take source `$1`'s lease for owner `$2` for `$3` seconds, creating the
/// row (fence 1) on first use: granted when no lease is held or the one held
/// expired, bumping the fence. The upsert's update re-reads a row another
/// take just committed (READ COMMITTED re-checks its `WHERE` on the newest
/// version), so of racing takes one wins. No row when a live lease is held.
pub const RECONCILE_LEASE_TAKE: &str = "
    INSERT INTO tickmark_reconcile_cursors AS c
        (source, lease_owner, lease_until, fence, last_run_started_at, updated_at)
    VALUES ($1, $2, now() + make_interval(secs => $3), 1, now(), now())
    ON CONFLICT (source) DO UPDATE
    SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until,
        fence = c.fence + 1, last_run_started_at = excluded.last_run_started_at,
        updated_at = excluded.updated_at
    WHERE c.lease_until IS NULL OR c.lease_until <= now()
    RETURNING c.fence";

/// Move source `$1`'s cursor to `$4` (created at `$5`) and extend the lease
/// to `$6` seconds from now, while owner `$2` holds it, unexpired, under
/// fence `$3`.
pub const RECONCILE_CURSOR_ADVANCE: &str = "
    UPDATE tickmark_reconcile_cursors
    SET cursor = $4, cursor_at = $5, lease_until = now() + make_interval(secs => $6),
        updated_at = now()
    WHERE source = $1 AND lease_owner = $2 AND fence = $3 AND lease_until > now()";

/// Extend source `$1`'s lease to `$4` seconds from now, while owner `$2`
/// holds it, unexpired, under fence `$3`.
pub const RECONCILE_LEASE_EXTEND: &str = "
    UPDATE tickmark_reconcile_cursors
    SET lease_until = now() + make_interval(secs => $4), updated_at = now()
    WHERE source = $1 AND lease_owner = $2 AND fence = $3 AND lease_until > now()";

/// Give source `$1`'s lease back with the run's summary `$4`, while owner
/// `$2` holds it under fence `$3` (expired or not: no take came since, or
/// the fence would differ).
pub const RECONCILE_LEASE_RELEASE: &str = "
    UPDATE tickmark_reconcile_cursors
    SET lease_owner = NULL, lease_until = NULL, last_summary = $4,
        last_run_finished_at = now(), updated_at = now()
    WHERE source = $1 AND lease_owner = $2 AND fence = $3 AND lease_until IS NOT NULL";

/// Every source's row, in byte order of the source (SQLite's order too).
pub const RECONCILE_CURSORS: &str = "
    SELECT source, cursor, cursor_at, lease_owner, lease_until, fence, last_run_started_at,
           last_run_finished_at, last_summary, updated_at
    FROM tickmark_reconcile_cursors
    ORDER BY source COLLATE \"C\"";

/// Forget source `$1`'s cursor unless a live lease is held, fencing off an
/// expired holder. True when reset, or when the source has no row (in the
/// statement's snapshot); false when a live lease kept the row as it was.
pub const RECONCILE_CURSOR_RESET: &str = "
    WITH reset AS (
        UPDATE tickmark_reconcile_cursors
        SET cursor = NULL, cursor_at = NULL, lease_owner = NULL, lease_until = NULL,
            fence = fence + 1, updated_at = now()
        WHERE source = $1 AND (lease_until IS NULL OR lease_until <= now())
        RETURNING source
    )
    SELECT EXISTS (SELECT 1 FROM reset)
        OR NOT EXISTS (SELECT 1 FROM tickmark_reconcile_cursors WHERE source = $1)";
