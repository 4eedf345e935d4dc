//! Decoding shared by both stores: JSON text columns, state names, the step
//! names of a stored plan, the operator reads' counts, and the "zero rows
//! changed means the lease is lost" rule.

use serde::Deserialize;

use super::{Lease, StoreError};
use crate::event::EventState;

/// A JSON text column.
pub fn json(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// A nullable JSON text column.
pub fn json_opt(text: Option<String>, what: &str) -> Result<Option<serde_json::Value>, StoreError> {
    text.as_deref().map(|t| json(t, what)).transpose()
}

/// A state name (`EventState` or `StepState`).
pub fn state<S>(name: &str, what: &str) -> Result<S, StoreError>
where
    S: std::str::FromStr,
    S::Err: std::fmt::Display,
{
    name.parse()
        .map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// Stored step outputs by position; a NULL output reads as JSON `null`.
pub fn outputs(
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
pub fn lease_kept(rows_affected: u64, lease: &Lease) -> Result<(), StoreError> {
    if rows_affected == 0 {
        Err(StoreError::LeaseLost {
            event_seq: lease.event_seq,
        })
    } else {
        Ok(())
    }
}

/// The answer of a mark-confirmation query: applied under this token, or lost.
pub fn confirmed(applied: bool, lease: &Lease) -> Result<(), StoreError> {
    lease_kept(u64::from(applied), lease)
}

/// Why an event was recorded as stale.
/// A row of the count by state: state, and source and kind for superseded events.
pub type StateCountRow = (String, Option<String>, Option<String>, i64);

/// Events per state, summed over the superseded events' handlers.
pub fn counts_by_state(
    rows: &[StateCountRow],
) -> Result<Vec<(crate::event::EventState, i64)>, StoreError> {
    let mut by_state: Vec<(crate::event::EventState, i64)> = Vec::new();
    for (state, _, _, count) in rows {
        let state = self::state(state, "event state")?;
        match by_state.iter_mut().find(|(known, _)| *known == state) {
            Some((_, total)) => *total += count,
            None => by_state.push((state, *count)),
        }
    }
    Ok(by_state)
}

/// Superseded events per (source, kind).
pub fn superseded_by_handler(rows: &[StateCountRow]) -> Vec<(String, String, i64)> {
    rows.iter()
        .filter_map(|(_, source, kind, count)| Some((source.clone()?, kind.clone()?, *count)))
        .collect()
}

/// An empty bucket's answer: wait this many µs (at least a millisecond: an
/// empty bucket never means "try again now").
pub fn rate_waiting(wake_in_us: i64) -> super::RateTaken {
    let micros = u64::try_from(wake_in_us).unwrap_or(0).max(1_000);
    super::RateTaken::Empty {
        next_in: std::time::Duration::from_micros(micros),
    }
}

#[doc(hidden)]
pub fn stale_reason(resource_key: &str, resource_seq: i64, last_seq: i64) -> String {
    format!(
        "stale: sequence {resource_seq} of {resource_key} is not newer than {last_seq}, \
         already applied; recorded, not run"
    )
}

/// The step names of a stored plan (`{"steps": [{"name": …}, …], …}`), in
/// order, read without decoding the steps themselves: it works for plans
/// whose step types this build does not know.
pub fn step_names(plan: &str) -> Result<Vec<String>, StoreError> {
    #[derive(Deserialize)]
    struct StoredNames {
        steps: Vec<StoredName>,
    }
    #[derive(Deserialize)]
    struct StoredName {
        name: String,
    }
    let stored: StoredNames =
        serde_json::from_str(plan).map_err(|e| StoreError::Corrupt(format!("stored plan: {e}")))?;
    Ok(stored.steps.into_iter().map(|step| step.name).collect())
}

/// Operator input that is all digits names a row number.
pub fn row_number(id: &str) -> Option<i64> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// Event counts by (state, source) as stored, decoded and sorted in
/// lifecycle order, then by source.
pub fn sorted_counts(
    rows: Vec<(String, String, i64)>,
) -> Result<Vec<(EventState, String, i64)>, StoreError> {
    let mut counts = rows
        .into_iter()
        .map(|(state_name, source, count)| Ok((state(&state_name, "event state")?, source, count)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    counts.sort_by(|a, b| state_order(a.0).cmp(&state_order(b.0)).then(a.1.cmp(&b.1)));
    Ok(counts)
}

/// States in lifecycle order, for sorting counts.
fn state_order(state: EventState) -> usize {
    EventState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or(usize::MAX)
}

/// Zero-filled per-minute counts, newest first, from (minutes ago, count) rows.
pub fn per_minute(minutes: u32, buckets: Vec<(i32, i64)>) -> Vec<i64> {
    let mut counts = vec![0; usize::try_from(minutes).unwrap_or(0)];
    for (ago, count) in buckets {
        if let Some(slot) = usize::try_from(ago).ok().and_then(|i| counts.get_mut(i)) {
            *slot += count;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_are_read_even_from_plans_this_build_cannot_run() {
        let plan =
            r#"{"version":1,"steps":[{"name":"x","step":{"type":"gone"}},{"name":"y","step":{}}]}"#;
        assert_eq!(step_names(plan).unwrap(), ["x", "y"]);
        assert!(step_names("{}").is_err());
    }
}
