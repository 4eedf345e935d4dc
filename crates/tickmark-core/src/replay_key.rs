//! The replay key of a signed delivery: what the inbox also deduplicates on
//! when a provider's signature does not cover the event id (GitHub,
//! Shopify, Twilio; see [`NewEvent::replay_key`](tickmark_driver::event::NewEvent::replay_key)).
//!
//! Below both the receiver, which derives it from a delivery's verified
//! signature, and the reconciler, which derives it from the signature a
//! provider's delivery log shows for a delivery it fetches: one function,
//! so that the two copies of one delivery carry one key.

/// Prefix of a replay key.
pub const REPLAY_KEY_PREFIX: &str = "sig:";

/// The replay key of a delivery whose signature verified: `sig:` + the hex
/// SHA-256 of `context` (what else the scheme needs to tell events apart,
/// each part length-prefixed) and the signature's decoded bytes. Decoded, so
/// that re-encoding the same signature (hex case, base64 padding) does not
/// make a new key; hashed, so that the stored key is no signature anyone can
/// present.
pub fn replay_key(context: &[&[u8]], signature: &[u8]) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    for part in context.iter().chain([&signature]) {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    format!("{REPLAY_KEY_PREFIX}{}", hex::encode(hash.finalize()))
}
