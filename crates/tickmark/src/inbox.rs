//! Accepting events: the dedup decision. Events without an id of their own
//! are deduplicated by a hash of their body, [`body_hash`].

pub use tickmark_driver::dedup_key::body_hash;
