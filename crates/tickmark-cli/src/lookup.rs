//! From what an operator types to one event: a row number (`42`) or a dedup
//! key (`evt_1NG8…`, `sha256:…`), optionally within one source.

use super::Failure;
use tickmark_driver::store::{EventRecord, Store};

/// The one event `id` names, or why there is not exactly one.
pub(crate) async fn resolve(
    store: &dyn Store,
    id: &str,
    source: Option<&str>,
) -> Result<EventRecord, Failure> {
    let mut found = store.event_lookup(id, source).await?;
    match found.len() {
        0 => Err(Failure::NotFound(format!(
            "no event `{id}`{} (an ID is a row number or a dedup key); \
             `tickmark events list` shows recent events",
            source
                .map(|s| format!(" from source `{s}`"))
                .unwrap_or_default()
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Failure::Usage(format!(
            "`{id}` is the dedup key of {} events: {}; add --source NAME, or use the row number",
            found.len(),
            found
                .iter()
                .map(|r| format!("{} from {}", r.event.seq, r.event.source))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
