//! A Shopify id (a product's, an order's) as one segment of an Admin API
//! URL path: a positive integer, as Shopify sends it, or a short string of
//! letters, digits, `_` and `-`. Anything else could escape its path
//! segment, so it is refused (a terminal failure of the step reading it).

use serde_json::Value;

/// Longest string id accepted in a URL path, in bytes.
const MAX_ID_BYTES: usize = 64;

/// What [`path_id`] accepts, for error messages.
pub(super) const PATH_ID_RULE: &str =
    "a positive integer (or up to 64 letters, digits, `_` and `-`)";

/// The id at `value` as it appears in a URL path, when it is usable.
pub(super) fn path_id(value: &Value) -> Option<String> {
    match value {
        Value::Number(number) if number.is_u64() => Some(number.to_string()),
        Value::String(text) if is_path_safe(text) => Some(text.clone()),
        _ => None,
    }
}

/// 1 to [`MAX_ID_BYTES`] ASCII letters, digits, `_` and `-`: safe as one
/// segment of a URL path.
fn is_path_safe(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_ID_BYTES
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_path_safe_ids_are_used() {
        assert_eq!(path_id(&json!(7)).as_deref(), Some("7"));
        assert_eq!(path_id(&json!("gid-7_a")).as_deref(), Some("gid-7_a"));
        for bad in [
            json!(-7),
            json!(1.5),
            json!(""),
            json!("7/../../x"),
            json!("a".repeat(65)),
            json!(null),
            json!({"id": 7}),
        ] {
            assert_eq!(path_id(&bad), None, "{bad}");
        }
    }
}
