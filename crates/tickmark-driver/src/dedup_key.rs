//! The dedup key of an event whose provider gives no id: `sha256:` of the raw body.

use sha2::{Digest, Sha256};

/// Prefix of a body-hash dedup key.
pub const BODY_HASH_PREFIX: &str = "sha256:";

/// `sha256:<lowercase hex>` of the raw body bytes, exactly as received.
///
/// ```
/// assert_eq!(
///     tickmark::inbox::body_hash(b""),
///     "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/// );
/// ```
pub fn body_hash(raw_body: &[u8]) -> String {
    let digest = Sha256::digest(raw_body);
    let mut key = String::with_capacity(BODY_HASH_PREFIX.len() + 64);
    key.push_str(BODY_HASH_PREFIX);
    key.push_str(&hex::encode(digest));
    key
}
