//! Dedup tombstones: what `tickmark prune` keeps of an event it deletes, so
//! that a redelivery within the dedup window is still a duplicate.
//!
//! A tombstone is `(source, key hash, accepted at)`: a few dozen bytes where
//! the event held its payload, its plan and a row per step. It stands for one
//! key the event was accepted under, its dedup key and, when it had one, its
//! replay key; the hash keeps the row small whatever the key's length.
//!
//! Every accept consults the tombstones of its keys. On PostgreSQL it does so
//! *after* its insert, in the insert's transaction: an accept racing the prune
//! of its own key waits on the unique index until the prune commits, and only
//! a statement started after that commit sees the tombstone the prune wrote
//! in the same transaction (docs/operations.md, "Pruning"). On SQLite every
//! write holds the one write lock, so the accept looks before it inserts.

use sha2::{Digest, Sha256};

/// Bytes of SHA-256 a tombstone keeps: 128 bits, so that two keys of one
/// source collide with a probability of about n² / 2¹²⁹ (under 10⁻¹⁸ for a
/// billion events).
pub const KEY_HASH_LEN: usize = 16;

/// Which of an event's keys a tombstone stands for. The two are hashed
/// apart, so a dedup key never matches a replay key that happens to be
/// spelled the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// The provider's event id, or `sha256:` of the body.
    Dedup,
    /// The key derived from the verified signature (docs/receiver.md).
    Replay,
}

impl KeyKind {
    /// The prefix hashed before the key (`tickmark_key_hash`'s `kind` on
    /// PostgreSQL).
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Dedup => "dedup",
            KeyKind::Replay => "replay",
        }
    }
}

/// The hash a tombstone stores for `key`: the first [`KEY_HASH_LEN`] bytes of
/// SHA-256 over `<kind>:<key>`. PostgreSQL computes the same in SQL
/// (`tickmark_key_hash`, migration 0010); the conformance suite checks both
/// agree.
pub fn key_hash(kind: KeyKind, key: &str) -> [u8; KEY_HASH_LEN] {
    let digest = Sha256::new()
        .chain_update(kind.as_str())
        .chain_update(":")
        .chain_update(key)
        .finalize();
    let mut hash = [0; KEY_HASH_LEN];
    hash.copy_from_slice(&digest[..KEY_HASH_LEN]);
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_prefix_of_sha256_over_kind_and_key() {
        // sha256("dedup:evt_1") computed independently (sha256sum).
        assert_eq!(
            hex::encode(key_hash(KeyKind::Dedup, "evt_1")),
            "aa80f802f80ab5fc932b39243eef84b6"
        );
    }

    #[test]
    fn a_dedup_key_and_a_replay_key_of_the_same_text_differ() {
        assert_ne!(
            key_hash(KeyKind::Dedup, "sig:abc"),
            key_hash(KeyKind::Replay, "sig:abc")
        );
    }
}
