//! The keys payloads and outputs are sealed with: the newest seals, all
//! open. Keys come from configuration (`TICKMARK_KEYS`), never from the
//! database, which holds only each key's id and check value.

use std::fmt;

use base64::Engine as _;
use chacha20poly1305::aead::KeyInit;
use chacha20poly1305::XChaCha20Poly1305;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::PrivacyError;

/// The environment variable [`Keyring::from_env`] reads.
pub const KEYS_VAR: &str = "TICKMARK_KEYS";

/// Bytes in a key.
const KEY_BYTES: usize = 32;

/// Longest key id (it is written into every sealed value).
const MAX_ID: usize = 32;

/// One key: its id, its cipher, and its check value.
pub(crate) struct DataKey {
    pub(crate) id: String,
    pub(crate) cipher: XChaCha20Poly1305,
    pub(crate) check: String,
}

/// Encryption keys, newest first: the first seals every new value; each
/// opens the values sealed with it. `Debug` shows ids, never keys.
pub struct Keyring {
    keys: Vec<DataKey>,
}

impl Keyring {
    /// Parse `id:base64-key[,id:base64-key…]`, newest first. Ids are 1 to
    /// 32 of `A-Z a-z 0-9 _ -`; each key is 32 bytes (standard base64, as
    /// `tickmark keys new` prints).
    ///
    /// ```
    /// use tickmark::privacy::Keyring;
    /// let keys = Keyring::parse("k2:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=,\
    ///                           k1:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=").unwrap();
    /// assert_eq!(keys.current_id(), "k2");
    /// assert!(Keyring::parse("k1:short").is_err());
    /// ```
    pub fn parse(spec: &str) -> Result<Self, PrivacyError> {
        let mut keys: Vec<DataKey> = Vec::new();
        for (at, entry) in spec.split(',').map(str::trim).enumerate() {
            let place = at + 1;
            let (id, key) = entry.split_once(':').ok_or_else(|| {
                PrivacyError::BadKeys(format!("entry {place} has no `:` between id and key"))
            })?;
            let (id, key) = (id.trim(), key.trim());
            if id.is_empty()
                || id.len() > MAX_ID
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(PrivacyError::BadKeys(format!(
                    "entry {place}'s id `{id}` is not 1 to {MAX_ID} of A-Z a-z 0-9 _ -"
                )));
            }
            if keys.iter().any(|known| known.id == id) {
                return Err(PrivacyError::BadKeys(format!(
                    "key id `{id}` is given twice"
                )));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(key)
                .map_err(|_| PrivacyError::BadKeys(format!("key `{id}` is not standard base64")))?;
            if bytes.len() != KEY_BYTES {
                return Err(PrivacyError::BadKeys(format!(
                    "key `{id}` is {} bytes, not {KEY_BYTES}",
                    bytes.len()
                )));
            }
            keys.push(DataKey {
                id: id.to_owned(),
                cipher: XChaCha20Poly1305::new_from_slice(&bytes)
                    .map_err(|_| PrivacyError::BadKeys(format!("key `{id}` is unusable")))?,
                check: key_check(&bytes),
            });
        }
        if keys.is_empty() {
            return Err(PrivacyError::BadKeys("no key given".to_owned()));
        }
        Ok(Self { keys })
    }

    /// The keyring in `TICKMARK_KEYS`; `None` when it is unset or empty
    /// (payloads are stored in clear, unless the database says they were
    /// sealed before: then the engine refuses to start).
    pub fn from_env() -> Result<Option<Self>, PrivacyError> {
        match std::env::var(KEYS_VAR) {
            Ok(spec) if !spec.trim().is_empty() => Self::parse(&spec).map(Some),
            _ => Ok(None),
        }
    }

    /// A new random key, as a keyring entry takes it (standard base64).
    pub fn new_key() -> String {
        let mut bytes = [0u8; KEY_BYTES];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// The id of the key that seals new values.
    pub fn current_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Every key's id, newest first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|key| key.id.as_str())
    }

    pub(crate) fn current(&self) -> &DataKey {
        &self.keys[0]
    }

    pub(crate) fn get(&self, id: &str) -> Option<&DataKey> {
        self.keys.iter().find(|key| key.id == id)
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish()
    }
}

/// A key's check value: an HMAC of a fixed text under the key, 16 bytes as
/// hex. It tells keys apart and reveals nothing of the key.
fn key_check(key: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(b"tickmark key check v1");
    hex::encode(&mac.finalize().into_bytes()[..16])
}
