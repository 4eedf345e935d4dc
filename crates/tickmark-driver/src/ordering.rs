//! Ordering: providers do not keep order, so a handler can say which resource
//! an event is about (a JSON pointer into the payload), run that resource's
//! events one at a time in acceptance order, and skip events whose sequence is
//! not newer than the last one applied. See docs/ordering.md.

use chrono::DateTime;
use serde_json::Value;

use crate::flow::scalar_text;

/// A handler's ordering rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordering {
    /// JSON pointer to the resource id.
    pub key: String,
    /// JSON pointer to the sequence, when stale events are skipped.
    pub sequence: Option<String>,
}

/// What the inbox stores for an ordered event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OrderingKeys {
    /// `{source}:{resource id}`: events with the same key run one at a time.
    pub resource_key: Option<String>,
    /// The event's sequence for its resource.
    pub resource_seq: Option<i64>,
}

impl Ordering {
    #[doc(hidden)]
    pub fn serial(key: String) -> Self {
        Self {
            key,
            sequence: None,
        }
    }

    #[doc(hidden)]
    pub fn with_sequence(key: String, sequence: String) -> Self {
        Self {
            key,
            sequence: Some(sequence),
        }
    }

    /// The keys of an event from `source` with this payload. A payload without
    /// the resource id is not ordered (it runs like any other event); one with
    /// an id but no readable sequence runs in order but is never judged stale.
    pub fn keys(&self, source: &str, payload: &Value) -> OrderingKeys {
        let Some(id) = payload.pointer(&self.key).and_then(scalar_text) else {
            return OrderingKeys::default();
        };
        OrderingKeys {
            resource_key: Some(format!("{source}:{id}")),
            resource_seq: self
                .sequence
                .as_deref()
                .and_then(|pointer| payload.pointer(pointer))
                .and_then(sequence_number),
        }
    }
}

/// An integer, an integer in a string, or an RFC 3339 time (as microseconds
/// since the epoch).
fn sequence_number(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64(),
        Value::String(text) => text.parse::<i64>().ok().or_else(|| {
            DateTime::parse_from_rfc3339(text)
                .ok()
                .map(|time| time.timestamp_micros())
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_come_from_json_pointers_and_are_namespaced_by_source() {
        let ordering =
            Ordering::with_sequence("/data/object/id".into(), "/data/object/version".into());
        let keys = ordering.keys(
            "stripe",
            &json!({"data": {"object": {"id": "cus_1", "version": 7}}}),
        );
        assert_eq!(keys.resource_key.as_deref(), Some("stripe:cus_1"));
        assert_eq!(keys.resource_seq, Some(7));
    }

    #[test]
    fn sequences_may_be_numeric_strings_or_times() {
        assert_eq!(sequence_number(&json!("42")), Some(42));
        let early = sequence_number(&json!("2026-11-30T06:31:34Z")).unwrap();
        let late = sequence_number(&json!("2026-11-30T06:31:35.5+00:00")).unwrap();
        assert!(early < late);
        assert_eq!(sequence_number(&json!("yesterday")), None);
        assert_eq!(sequence_number(&json!(1.5)), None);
    }

    #[test]
    fn a_payload_without_the_resource_id_is_not_ordered() {
        let ordering = Ordering::serial("/id".into());
        assert_eq!(
            ordering.keys("s", &json!({"other": 1})),
            OrderingKeys::default()
        );
        assert_eq!(
            ordering
                .keys("s", &json!({"id": 12}))
                .resource_key
                .as_deref(),
            Some("s:12")
        );
    }
}
