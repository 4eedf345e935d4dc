//! What can go wrong with keys, sealed values and subjects, each saying
//! what to do next.

use tickmark_driver::store::StoreError;

/// Why a value could not be sealed or opened, or why an engine's keys do
/// not fit its database.
#[derive(Debug, thiserror::Error)]
pub enum PrivacyError {
    /// `TICKMARK_KEYS` (or a keyring given in code) is not a list of
    /// `id:key` entries.
    #[error("encryption keys: {0}; expected `id:base64-key[,id:base64-key…]`, newest first, each key 32 random bytes (make one with `tickmark keys new`)")]
    BadKeys(String),
    /// `TICKMARK_SUBJECT_KEY` is not a key.
    #[error("subject key: {0}; expected the base64 of at least 32 random bytes (make one with `tickmark keys new`)")]
    BadSubjectKey(String),
    /// A value is sealed with a key this process does not have.
    #[error("a value is sealed with key `{key_id}`, which this process does not have: add it to TICKMARK_KEYS (keep each old key until `tickmark keys rotate` retires it)")]
    UnknownKey {
        /// The key named in the sealed value.
        key_id: String,
    },
    /// A sealed value failed authentication: another key under the same id,
    /// or a value changed outside tickmark.
    #[error("a value sealed with key `{key_id}` does not open with this process's key of that id: the key differs from the one that sealed it, or the stored value was altered")]
    Unreadable {
        /// The key named in the sealed value.
        key_id: String,
    },
    /// A sealed value that is not one tickmark wrote.
    #[error("a stored value looks sealed but is malformed ({0})")]
    Malformed(String),
    /// At start: the database knows this key id with another key.
    #[error("key `{key_id}` is not the key this database's rows were sealed with under that id: give this process the same key, or a new id for a new key")]
    WrongKey {
        /// The id both share.
        key_id: String,
    },
    /// At start: rows may be sealed with keys this process lacks.
    #[error("this database holds rows sealed with key(s) {} that this process does not have: add them to TICKMARK_KEYS (after the current key); `tickmark keys rotate` re-seals the rows and retires them", .key_ids.join(", "))]
    MissingKeys {
        /// The registered ids not configured.
        key_ids: Vec<String>,
    },
    /// At start: the database's rows are sealed, and this process has no keys.
    #[error("this database's payloads are encrypted (key(s) {}), and this process has no encryption keys: set TICKMARK_KEYS; it will not write payloads in clear beside them", .key_ids.join(", "))]
    EncryptionOff {
        /// The registered ids.
        key_ids: Vec<String>,
    },
    /// A handler declares subjects, and there is no key to hash them with.
    #[error("handlers declare subjects, and no subject key is set: set TICKMARK_SUBJECT_KEY (the base64 of 32 random bytes, from `tickmark keys new`) so that subjects are stored as keyed hashes")]
    NoSubjectKey,
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<PrivacyError> for StoreError {
    fn from(error: PrivacyError) -> Self {
        match error {
            PrivacyError::Store(error) => error,
            other => StoreError::Sealing(other.to_string()),
        }
    }
}
