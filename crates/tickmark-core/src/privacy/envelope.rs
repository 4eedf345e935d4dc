//! A sealed value, as it is stored: a JSON string
//! `"tickmark:sealed:1:<key id>:<base64url of nonce ‖ ciphertext>"`, so a
//! sealed payload or output is still JSON to both databases and to every
//! statement that moves it (the claim, the marks), and the key id travels
//! with the value: any key of the keyring opens it, whichever row it is in.
//!
//! XChaCha20-Poly1305 (the `chacha20poly1305` crate): a fresh random
//! 24-byte nonce per value, the header as associated data (so the key id
//! cannot be swapped). A plaintext value is never mistaken for a sealed one
//! unless it is a JSON string that starts with the prefix; tickmark's
//! providers send objects.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::XNonce;

use super::keyring::Keyring;
use super::PrivacyError;

/// What every sealed value starts with (inside its JSON string).
pub const SEALED_PREFIX: &str = "tickmark:sealed:1:";

/// Bytes in a nonce.
const NONCE_BYTES: usize = 24;

/// `json` (a JSON text) sealed with the keyring's current key, as JSON text.
pub(crate) fn seal(keys: &Keyring, json: &str) -> String {
    let key = keys.current();
    let header = format!("{SEALED_PREFIX}{}:", key.id);
    let mut nonce = [0u8; NONCE_BYTES];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
    let sealed = key
        .cipher
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: json.as_bytes(),
                aad: header.as_bytes(),
            },
        )
        .expect("XChaCha20-Poly1305 seals any message shorter than 256 GiB");
    let mut bytes = nonce.to_vec();
    bytes.extend_from_slice(&sealed);
    let text = format!("{header}{}", URL_SAFE_NO_PAD.encode(bytes));
    serde_json::Value::String(text).to_string()
}

/// The key id a stored value is sealed with; `None` when it is not sealed.
///
/// ```
/// use tickmark::privacy::sealed_with;
/// assert_eq!(sealed_with(&serde_json::json!("tickmark:sealed:1:k2:AAAA")), Some("k2"));
/// assert_eq!(sealed_with(&serde_json::json!({"id": "evt_1"})), None);
/// ```
pub fn sealed_with(value: &serde_json::Value) -> Option<&str> {
    let rest = value.as_str()?.strip_prefix(SEALED_PREFIX)?;
    rest.split_once(':').map(|(id, _)| id)
}

/// Open a sealed value with the key it names. `Ok(None)`: it is not sealed.
pub(crate) fn open(
    keys: Option<&Keyring>,
    value: &serde_json::Value,
) -> Result<Option<serde_json::Value>, PrivacyError> {
    let Some(text) = value.as_str() else {
        return Ok(None);
    };
    let Some(rest) = text.strip_prefix(SEALED_PREFIX) else {
        return Ok(None);
    };
    let (key_id, body) = rest
        .split_once(':')
        .ok_or_else(|| PrivacyError::Malformed("no key id".to_owned()))?;
    let key = keys
        .and_then(|keys| keys.get(key_id))
        .ok_or_else(|| PrivacyError::UnknownKey {
            key_id: key_id.to_owned(),
        })?;
    let bytes = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| PrivacyError::Malformed("not base64url".to_owned()))?;
    if bytes.len() < NONCE_BYTES {
        return Err(PrivacyError::Malformed("too short".to_owned()));
    }
    let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
    let header = &text[..text.len() - body.len()];
    let plain = key
        .cipher
        .decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: sealed,
                aad: header.as_bytes(),
            },
        )
        .map_err(|_| PrivacyError::Unreadable {
            key_id: key_id.to_owned(),
        })?;
    serde_json::from_slice(&plain)
        .map(Some)
        .map_err(|e| PrivacyError::Malformed(format!("opened, but not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const K2: &str = "k2:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

    fn sealed(keys: &Keyring, value: &serde_json::Value) -> serde_json::Value {
        serde_json::from_str(&seal(keys, &value.to_string())).unwrap()
    }

    #[test]
    fn a_sealed_value_opens_with_its_key_and_hides_its_text() {
        let keys = Keyring::parse(K1).unwrap();
        let value = serde_json::json!({"email": "marker@example.com"});
        let stored = sealed(&keys, &value);
        assert!(!stored.to_string().contains("marker"));
        assert_eq!(sealed_with(&stored), Some("k1"));
        assert_eq!(open(Some(&keys), &stored).unwrap(), Some(value.clone()));
        // Two seals of one value differ (a fresh nonce each).
        assert_ne!(stored, sealed(&keys, &value));
    }

    #[test]
    fn old_keys_open_what_they_sealed_and_the_newest_seals() {
        let old = Keyring::parse(K1).unwrap();
        let rotated = Keyring::parse(&format!("{K2},{K1}")).unwrap();
        let value = serde_json::json!([1, 2]);
        let stored = sealed(&old, &value);
        assert_eq!(open(Some(&rotated), &stored).unwrap(), Some(value.clone()));
        assert_eq!(sealed_with(&sealed(&rotated, &value)), Some("k2"));
    }

    #[test]
    fn a_missing_key_a_wrong_key_and_an_altered_value_are_errors() {
        let keys = Keyring::parse(K1).unwrap();
        let stored = sealed(&keys, &serde_json::json!({"a": 1}));
        assert!(matches!(
            open(None, &stored),
            Err(PrivacyError::UnknownKey { .. })
        ));
        let impostor = Keyring::parse(&K2.replace("k2", "k1")).unwrap();
        assert!(matches!(
            open(Some(&impostor), &stored),
            Err(PrivacyError::Unreadable { .. })
        ));
        // The key id is authenticated: relabelled, the value does not open.
        let relabelled = Keyring::parse(&format!("{K1},{}", K1.replace("k1", "k9"))).unwrap();
        let moved = serde_json::Value::String(stored.as_str().unwrap().replace(":k1:", ":k9:"));
        assert!(matches!(
            open(Some(&relabelled), &moved),
            Err(PrivacyError::Unreadable { .. })
        ));
        assert_eq!(
            open(Some(&keys), &serde_json::json!({"a": 1})).unwrap(),
            None
        );
    }
}
