//! `GitHub::verify` on structured deliveries (header values + body, signed
//! correctly or not): it never panics, an unsigned delivery never verifies,
//! and what it accepts or refuses obeys the rules in `tickmark_fuzz::check`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tickmark_fuzz::{check, FuzzDelivery, Scheme};

fuzz_target!(|input: FuzzDelivery| {
    let _ = check(Scheme::GitHub, &input);
});
