//! The SQLite statements of reconciliation (`store/reconcile.rs`): one per
//! transition of a source's row, each filtering on the expected state and
//! the fence, run in a `BEGIN IMMEDIATE` transaction. "Now" is bound by the
//! store from its clock, as for event leases.

/// Take source `?1`'s lease for owner `?2` until `?3`, at `?4` (now),
/// creating the row (fence 1) on first use: granted when no lease is held or
/// the one held expired, bumping the fence. No row when a live lease is held.
pub const RECONCILE_LEASE_TAKE: &str = "
    INSERT INTO tickmark_reconcile_cursors
        (source, lease_owner, lease_until, fence, last_run_started_at, updated_at)
    VALUES (?1, ?2, ?3, 1, ?4, ?4)
    ON CONFLICT (source) DO UPDATE
    SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until,
        fence = fence + 1, last_run_started_at = excluded.last_run_started_at,
        updated_at = excluded.updated_at
    WHERE lease_until IS NULL OR lease_until <= ?4
    RETURNING fence";

/// Move source `?1`'s cursor to `?4` (created at `?5`) and extend the lease
/// until `?6`, at `?7` (now), while owner `?2` holds it, unexpired, under
/// fence `?3`.
pub const RECONCILE_CURSOR_ADVANCE: &str = "
    UPDATE tickmark_reconcile_cursors
    SET cursor = ?4, cursor_at = ?5, lease_until = ?6, updated_at = ?7
    WHERE source = ?1 AND lease_owner = ?2 AND fence = ?3 AND lease_until > ?7";

/// Extend source `?1`'s lease until `?4`, at `?5` (now), while owner `?2`
/// holds it, unexpired, under fence `?3`.
pub const RECONCILE_LEASE_EXTEND: &str = "
    UPDATE tickmark_reconcile_cursors
    SET lease_until = ?4, updated_at = ?5
    WHERE source = ?1 AND lease_owner = ?2 AND fence = ?3 AND lease_until > ?5";

/// Give source `?1`'s lease back with the run's summary `?4`, at `?5` (now),
/// while owner `?2` holds it under fence `?3` (expired or not: no take came
/// since, or the fence would differ).
pub const RECONCILE_LEASE_RELEASE: &str = "
    UPDATE tickmark_reconcile_cursors
    SET lease_owner = NULL, lease_until = NULL, last_summary = ?4,
        last_run_finished_at = ?5, updated_at = ?5
    WHERE source = ?1 AND lease_owner = ?2 AND fence = ?3 AND lease_until IS NOT NULL";

/// Every source's row, in byte order of the source.
pub const RECONCILE_CURSORS: &str = "
    SELECT source, cursor, cursor_at, lease_owner, lease_until, fence, last_run_started_at,
           last_run_finished_at, last_summary, updated_at
    FROM tickmark_reconcile_cursors
    ORDER BY source";

/// Forget source `?1`'s cursor unless a live lease is held at `?2` (now),
/// fencing off an expired holder.
pub const RECONCILE_CURSOR_RESET: &str = "
    UPDATE tickmark_reconcile_cursors
    SET cursor = NULL, cursor_at = NULL, lease_owner = NULL, lease_until = NULL,
        fence = fence + 1, updated_at = ?2
    WHERE source = ?1 AND (lease_until IS NULL OR lease_until <= ?2)";

/// Whether source `?1` has a row (after a reset changed none: a live lease).
pub const RECONCILE_CURSOR_EXISTS: &str =
    "SELECT count(*) > 0 FROM tickmark_reconcile_cursors WHERE source = ?1";
