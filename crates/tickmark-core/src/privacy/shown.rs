//! How a stored payload or output is shown to an operator (the dashboard,
//! `tickmark events show`): opened when this process has its key, said
//! plainly when it is sealed and cannot be opened here, or erased.

use chrono::{DateTime, Utc};

use super::{envelope, sealed_with, Privacy};

/// A stored value as an operator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// The value, opened; or, sealed with a key this process lacks, a
    /// string that says so (never the ciphertext).
    pub value: serde_json::Value,
    /// What to say beside it: "encrypted at rest (key k1)", "erased …";
    /// `None` for a value stored in clear.
    pub note: Option<String>,
}

/// How to show `value`, a payload or output as stored, of an event erased
/// at `erased_at` (if it was).
pub fn shown(
    privacy: &Privacy,
    value: &serde_json::Value,
    erased_at: Option<DateTime<Utc>>,
) -> Shown {
    if let Some(at) = erased_at {
        return Shown {
            value: serde_json::Value::Null,
            note: Some(format!(
                "erased {}: its subject's data was removed; the event's keys and step states stay",
                at.format("%Y-%m-%d %H:%M:%S UTC")
            )),
        };
    }
    let Some(key_id) = sealed_with(value) else {
        return Shown {
            value: value.clone(),
            note: None,
        };
    };
    match envelope::open(privacy.keys(), value) {
        Ok(Some(opened)) => Shown {
            value: opened,
            note: Some(format!("encrypted at rest (key {key_id})")),
        },
        Ok(None) | Err(_) => Shown {
            value: serde_json::Value::String(format!("[encrypted with key {key_id}]")),
            note: Some(format!(
                "encrypted at rest (key {key_id}); not readable here: give this process \
                 TICKMARK_KEYS with key {key_id} to read it"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::Keyring;

    #[test]
    fn sealed_values_are_opened_or_named_never_shown_sealed() {
        let keys = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let privacy = Privacy::new().with_keys(Keyring::parse(keys).unwrap());
        let stored: serde_json::Value =
            serde_json::from_str(&privacy.seal(r#"{"a":1}"#.to_owned())).unwrap();
        let seen = shown(&privacy, &stored, None);
        assert_eq!(seen.value, serde_json::json!({"a": 1}));
        assert_eq!(seen.note.as_deref(), Some("encrypted at rest (key k1)"));
        let blind = shown(&Privacy::new(), &stored, None);
        assert_eq!(blind.value, serde_json::json!("[encrypted with key k1]"));
        assert!(blind.note.unwrap().contains("not readable here"));
        let clear = shown(&Privacy::new(), &serde_json::json!({"a": 1}), None);
        assert_eq!(clear.note, None);
        let erased = shown(&privacy, &serde_json::Value::Null, Some(Utc::now()));
        assert!(erased.note.unwrap().starts_with("erased "));
    }
}
