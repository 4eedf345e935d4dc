//! Decoding shared by both stores: JSON text columns, state names, and the
//! "zero rows changed means the lease is lost" rule.

use super::{Lease, StoreError};

/// A JSON text column.
pub(crate) fn json(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// A nullable JSON text column.
pub(crate) fn json_opt(
    text: Option<String>,
    what: &str,
) -> Result<Option<serde_json::Value>, StoreError> {
    text.as_deref().map(|t| json(t, what)).transpose()
}

/// A state name (`EventState` or `StepState`).
pub(crate) fn state<S>(name: &str, what: &str) -> Result<S, StoreError>
where
    S: std::str::FromStr,
    S::Err: std::fmt::Display,
{
    name.parse()
        .map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// Stored step outputs by position; a NULL output reads as JSON `null`.
pub(crate) fn outputs(
    rows: Vec<(i32, Option<String>)>,
) -> Result<Vec<(i32, serde_json::Value)>, StoreError> {
    rows.into_iter()
        .map(|(position, output)| {
            Ok((
                position,
                json_opt(output, "step output")?.unwrap_or(serde_json::Value::Null),
            ))
        })
        .collect()
}

/// A transition of a leased event that changed no row lost its lease.
pub(crate) fn lease_kept(rows_affected: u64, lease: &Lease) -> Result<(), StoreError> {
    if rows_affected == 0 {
        Err(StoreError::LeaseLost {
            event_seq: lease.event_seq,
        })
    } else {
        Ok(())
    }
}

/// The answer of a mark-confirmation query: applied under this token, or lost.
pub(crate) fn confirmed(applied: bool, lease: &Lease) -> Result<(), StoreError> {
    lease_kept(u64::from(applied), lease)
}

/// Why an event was recorded as stale.
pub(crate) fn stale_reason(resource_key: &str, resource_seq: i64, last_seq: i64) -> String {
    format!(
        "stale: sequence {resource_seq} of {resource_key} is not newer than {last_seq}, \
         already applied; recorded, not run"
    )
}
