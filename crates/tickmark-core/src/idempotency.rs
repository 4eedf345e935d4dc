//! The per-step idempotency key: event id + step name.
//!
//! Format: `{source}:{event id}:{step name}`, for example
//! `stripe:evt_1NG8Du2eZvKYlo2CUI79vXWy:send_receipt`. It is the same on every
//! attempt of the step, in every worker, before and after a crash, so an external
//! service that deduplicates on it (an `Idempotency-Key` header, a file name)
//! absorbs a re-run. The step-status view computes the same string in SQL.

/// The idempotency key of step `step` of event `event_id` from `source`.
///
/// ```
/// assert_eq!(
///     tickmark::idempotency_key("stripe", "evt_1", "send_receipt"),
///     "stripe:evt_1:send_receipt"
/// );
/// ```
pub fn idempotency_key(source: &str, event_id: &str, step: &str) -> String {
    let mut key = String::with_capacity(source.len() + event_id.len() + step.len() + 2);
    key.push_str(source);
    key.push(':');
    key.push_str(event_id);
    key.push(':');
    key.push_str(step);
    key
}
