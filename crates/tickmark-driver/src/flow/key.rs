//! What a limit is keyed by: values read from the event's payload.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One or more JSON pointers into an event's payload (e.g. `/shop` or
/// `["/shop", "/id"]`); their values, joined with `:`, are the key.
///
/// ```
/// use tickmark::flow::FlowKey;
/// let key = FlowKey::from(["/shop", "/product/id"]);
/// let payload = serde_json::json!({"shop": "a.myshopify.com", "product": {"id": 7}});
/// assert_eq!(key.value_of(&payload).as_deref(), Some("a.myshopify.com:7"));
/// assert_eq!(key.value_of(&serde_json::json!({"shop": "a"})), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FlowKey(Vec<String>);

impl FlowKey {
    /// The key of this payload, or `None` when a pointer finds no string or
    /// number (the event is then not limited by this key: see each limit).
    pub fn value_of(&self, payload: &Value) -> Option<String> {
        let mut parts = Vec::with_capacity(self.0.len());
        for pointer in &self.0 {
            parts.push(scalar_text(payload.pointer(pointer)?)?);
        }
        Some(parts.join(":"))
    }

    /// The key of an event from `source` with this payload, namespaced by
    /// the source (`{source}:{value}`), or `None` as [`value_of`](Self::value_of).
    pub fn scoped_value(&self, source: &str, payload: &Value) -> Option<String> {
        Some(format!("{source}:{}", self.value_of(payload)?))
    }

    /// The pointers, as given.
    pub fn pointers(&self) -> &[String] {
        &self.0
    }
}

impl From<&str> for FlowKey {
    fn from(pointer: &str) -> Self {
        Self(vec![pointer.to_owned()])
    }
}

impl From<String> for FlowKey {
    fn from(pointer: String) -> Self {
        Self(vec![pointer])
    }
}

impl From<Vec<String>> for FlowKey {
    fn from(pointers: Vec<String>) -> Self {
        Self(pointers)
    }
}

impl<const N: usize> From<[&str; N]> for FlowKey {
    fn from(pointers: [&str; N]) -> Self {
        Self(pointers.iter().map(|p| (*p).to_owned()).collect())
    }
}

/// A key's text: a non-empty string as is, a number as written; anything
/// else (an object, an empty string, null) is no key. Ordering reads its
/// resource ids with it too.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn empty_strings_and_objects_are_no_key() {
        let key = FlowKey::from("/shop");
        assert_eq!(key.value_of(&json!({"shop": ""})), None);
        assert_eq!(key.value_of(&json!({"shop": {"a": 1}})), None);
        assert_eq!(key.value_of(&json!({"shop": 12})).as_deref(), Some("12"));
    }
}
