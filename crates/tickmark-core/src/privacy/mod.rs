//! Personal data in payloads (docs/privacy.md): payloads and step outputs
//! sealed at rest with keys from configuration, subjects recorded as keyed
//! hashes, and erasure by subject that keeps what dedup needs.
//!
//! The engine seals a payload when it plans the event and a step's output
//! when it marks it, and opens them when a worker claims the event: a store
//! only ever sees sealed text, which is still JSON
//! ([`envelope`](self::sealed_with)). Dedup keys, states and the step-status
//! table stay in clear and queryable.

mod envelope;
mod erase;
mod error;
mod keyring;
mod rotate;
mod shown;
mod subject;

use tickmark_driver::store::{Store, StoreError};

pub use envelope::{sealed_with, SEALED_PREFIX};
pub use erase::{erase_subject, EraseReport, EraseRequest};
pub use error::PrivacyError;
pub use keyring::{Keyring, KEYS_VAR};
pub use rotate::{rotate_keys, RotateProgress, RotateReport};
pub use shown::{shown, Shown};
pub use subject::{Subject, SubjectKey, SubjectRule, SUBJECT_KEY_VAR};

/// An engine's keys: the encryption keys that seal payloads and outputs,
/// and the key that hashes subjects. Without either, payloads are stored
/// in clear and no subject is recorded, as before.
#[derive(Debug, Default)]
pub struct Privacy {
    keys: Option<Keyring>,
    subject_key: Option<SubjectKey>,
    /// [`check`](Self::check) passed once (failures are not kept: a
    /// database that was down is asked again).
    checked: tokio::sync::OnceCell<()>,
}

impl Privacy {
    /// No keys: payloads in clear, no subjects.
    pub fn new() -> Self {
        Self::default()
    }

    /// The keys in `TICKMARK_KEYS` and `TICKMARK_SUBJECT_KEY`, each
    /// optional; a malformed one is an error.
    pub fn from_env() -> Result<Self, PrivacyError> {
        Ok(Self {
            keys: Keyring::from_env()?,
            subject_key: SubjectKey::from_env()?,
            checked: tokio::sync::OnceCell::new(),
        })
    }

    /// Seal payloads and outputs with `keys` (the first seals; all open).
    pub fn with_keys(mut self, keys: Keyring) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Record subjects as hashes under `key`.
    pub fn with_subject_key(mut self, key: SubjectKey) -> Self {
        self.subject_key = Some(key);
        self
    }

    /// The encryption keys, if any.
    pub fn keys(&self) -> Option<&Keyring> {
        self.keys.as_ref()
    }

    /// The subject key, if any.
    pub fn subject_key(&self) -> Option<&SubjectKey> {
        self.subject_key.as_ref()
    }

    /// [`check`](Self::check), once per process while it passes: before the
    /// first accept and the first claim, so nothing is written in clear
    /// beside sealed rows, or sealed with a key another process knows
    /// differently.
    pub(crate) async fn ready(
        &self,
        store: &dyn Store,
        declares_subjects: bool,
    ) -> Result<(), StoreError> {
        self.checked
            .get_or_try_init(|| self.check(store, declares_subjects))
            .await?;
        Ok(())
    }

    /// `json` as it is stored: sealed when there are keys, as it is when not.
    pub(crate) fn seal(&self, json: String) -> String {
        match &self.keys {
            Some(keys) => envelope::seal(keys, &json),
            None => json,
        }
    }

    /// A stored value opened: `value` itself when it is not sealed.
    pub fn open(&self, value: serde_json::Value) -> Result<serde_json::Value, PrivacyError> {
        Ok(envelope::open(self.keys.as_ref(), &value)?.unwrap_or(value))
    }

    /// The subjects column of an event whose handler found `subjects`.
    pub(crate) fn subjects_column(&self, subjects: &[Subject]) -> Option<String> {
        self.subject_key.as_ref()?.column(subjects)
    }

    /// Check these keys against the database before anything is written:
    /// a key registered under one of these ids with another check value
    /// ([`PrivacyError::WrongKey`]), registered keys this process lacks
    /// ([`PrivacyError::MissingKeys`]), sealed rows and no keys at all
    /// ([`PrivacyError::EncryptionOff`]), and handlers that declare subjects
    /// without a subject key ([`PrivacyError::NoSubjectKey`]) refuse to
    /// start. Registers the current key.
    pub async fn check(
        &self,
        store: &dyn Store,
        declares_subjects: bool,
    ) -> Result<(), PrivacyError> {
        if declares_subjects && self.subject_key.is_none() {
            return Err(PrivacyError::NoSubjectKey);
        }
        let registered = store.keys_registered().await?;
        let Some(keys) = &self.keys else {
            if registered.is_empty() {
                return Ok(());
            }
            return Err(PrivacyError::EncryptionOff {
                key_ids: registered.into_iter().map(|key| key.key_id).collect(),
            });
        };
        let mut missing = Vec::new();
        for key in registered {
            match keys.get(&key.key_id) {
                None => missing.push(key.key_id),
                Some(ours) if ours.check != key.key_check => {
                    return Err(PrivacyError::WrongKey { key_id: key.key_id });
                }
                Some(_) => {}
            }
        }
        if !missing.is_empty() {
            return Err(PrivacyError::MissingKeys { key_ids: missing });
        }
        let current = keys.current();
        let recorded = store.key_register(&current.id, &current.check).await?;
        if recorded != current.check {
            return Err(PrivacyError::WrongKey {
                key_id: current.id.clone(),
            });
        }
        Ok(())
    }
}
