//! The dedup key as the receiver derives it: any provider's `verify`, then
//! `NewEvent::with_id` (the provider's id) or `NewEvent::from_body`
//! (`sha256:` of the raw body). The key is the id or a well-formed body hash,
//! and the same delivery always gives the same key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tickmark_fuzz::{check_dedup_key, AnyDelivery};

fuzz_target!(|input: AnyDelivery| {
    check_dedup_key(&input);
});
