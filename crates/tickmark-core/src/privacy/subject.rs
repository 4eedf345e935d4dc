//! Subjects: whom an event is about (a customer id, an email, a shop
//! domain), found in its payload by rules its handler declares, and stored
//! as keyed hashes (HMAC-SHA256 under the subject key), never in clear. To
//! erase a subject, the engine hashes it the same way and finds its events.

use std::fmt;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::PrivacyError;

/// The environment variable [`SubjectKey::from_env`] reads.
pub const SUBJECT_KEY_VAR: &str = "TICKMARK_SUBJECT_KEY";

/// Fewest bytes in a subject key.
const MIN_KEY_BYTES: usize = 32;

/// One subject: a kind (`customer`, `email`, `shop`) and its value as the
/// payload gives it (hashed as it is: normalise emails in a
/// [`SubjectRule::Function`] if your sources differ in case).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    /// What kind of subject: names the rule, and keeps equal values of two
    /// kinds apart.
    pub kind: String,
    /// Its value.
    pub value: String,
}

impl Subject {
    /// The subject `value` of `kind`.
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            value: value.into(),
        }
    }

    /// `kind=value`, as `tickmark erase --subject` takes it.
    pub fn parse(text: &str) -> Option<Self> {
        let (kind, value) = text.split_once('=')?;
        (!kind.is_empty() && !value.is_empty()).then(|| Self::new(kind, value))
    }
}

/// How a handler finds an event's subjects in its payload.
#[derive(Clone)]
pub enum SubjectRule {
    /// The value at a JSON pointer (`/customer/id`), a string or a number;
    /// an array's elements each. Nothing there: no subject.
    Pointer {
        /// The subject's kind.
        kind: String,
        /// Where its value is.
        pointer: String,
    },
    /// Any subjects a function finds.
    Function(fn(&serde_json::Value) -> Vec<Subject>),
}

impl fmt::Debug for SubjectRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectRule::Pointer { kind, pointer } => write!(f, "{kind} at {pointer}"),
            SubjectRule::Function(_) => f.write_str("a function"),
        }
    }
}

impl SubjectRule {
    /// The subjects this rule finds in `payload`.
    pub fn subjects_of(&self, payload: &serde_json::Value) -> Vec<Subject> {
        match self {
            SubjectRule::Pointer { kind, pointer } => {
                let mut found = Vec::new();
                let mut take = |value: &serde_json::Value| match value {
                    serde_json::Value::String(text) if !text.is_empty() => {
                        found.push(Subject::new(kind, text));
                    }
                    serde_json::Value::Number(number) => {
                        found.push(Subject::new(kind, number.to_string()));
                    }
                    _ => {}
                };
                match payload.pointer(pointer) {
                    Some(serde_json::Value::Array(items)) => items.iter().for_each(&mut take),
                    Some(value) => take(value),
                    None => {}
                }
                found
            }
            SubjectRule::Function(find) => find(payload),
        }
    }
}

/// The key subjects are hashed with (HMAC-SHA256). Keep it as long as any
/// event may need erasing: a new key finds none of the events hashed with
/// the old one. `Debug` never shows it.
#[derive(Clone)]
pub struct SubjectKey {
    mac: Hmac<Sha256>,
}

impl SubjectKey {
    /// A key from the base64 of at least 32 bytes.
    pub fn parse(base64_key: &str) -> Result<Self, PrivacyError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(base64_key.trim())
            .map_err(|_| PrivacyError::BadSubjectKey("not standard base64".to_owned()))?;
        if bytes.len() < MIN_KEY_BYTES {
            return Err(PrivacyError::BadSubjectKey(format!(
                "{} bytes, fewer than {MIN_KEY_BYTES}",
                bytes.len()
            )));
        }
        Ok(Self {
            mac: <Hmac<Sha256> as Mac>::new_from_slice(&bytes).expect("HMAC takes any key length"),
        })
    }

    /// The key in `TICKMARK_SUBJECT_KEY`; `None` when unset or empty.
    pub fn from_env() -> Result<Option<Self>, PrivacyError> {
        match std::env::var(SUBJECT_KEY_VAR) {
            Ok(key) if !key.trim().is_empty() => Self::parse(&key).map(Some),
            _ => Ok(None),
        }
    }

    /// `subject`'s keyed hash, 64 hex digits: what is stored with its events.
    pub fn hash(&self, subject: &Subject) -> String {
        let mut mac = self.mac.clone();
        mac.update(subject.kind.as_bytes());
        mac.update(&[0]);
        mac.update(subject.value.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// The hashes of `subjects`, sorted, without repeats, separated by
    /// spaces, as the events table stores them; `None` when there are none.
    pub(crate) fn column(&self, subjects: &[Subject]) -> Option<String> {
        let mut hashes: Vec<String> = subjects.iter().map(|s| self.hash(s)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        (!hashes.is_empty()).then(|| hashes.join(" "))
    }
}

impl fmt::Debug for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SubjectKey(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_rules_find_strings_numbers_and_array_elements() {
        let payload = serde_json::json!({
            "customer": {"id": 191167, "email": "a@example.com"},
            "orders_to_redact": [1, 2],
            "blank": ""
        });
        let rule = |kind: &str, pointer: &str| SubjectRule::Pointer {
            kind: kind.to_owned(),
            pointer: pointer.to_owned(),
        };
        assert_eq!(
            rule("customer", "/customer/id").subjects_of(&payload),
            [Subject::new("customer", "191167")]
        );
        assert_eq!(
            rule("order", "/orders_to_redact")
                .subjects_of(&payload)
                .len(),
            2
        );
        assert!(rule("x", "/blank").subjects_of(&payload).is_empty());
        assert!(rule("x", "/missing").subjects_of(&payload).is_empty());
    }

    #[test]
    fn hashes_are_keyed_and_kinds_kept_apart() {
        let key = SubjectKey::parse("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=").unwrap();
        let other = SubjectKey::parse("ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=").unwrap();
        let subject = Subject::new("email", "a@example.com");
        assert_eq!(key.hash(&subject).len(), 64);
        assert_ne!(key.hash(&subject), other.hash(&subject));
        assert_ne!(
            key.hash(&subject),
            key.hash(&Subject::new("customer", "a@example.com"))
        );
        let column = key.column(&[subject.clone(), subject.clone()]).unwrap();
        assert_eq!(column, key.hash(&subject));
        assert!(key.column(&[]).is_none());
        assert!(SubjectKey::parse("c2hvcnQ=").is_err());
    }
}
