//! `tickmark_core::plan::Plan::decode` on any bytes: it never panics, and a plan
//! it decodes encodes and decodes again to the same steps.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tickmark_fuzz::check_plan;

fuzz_target!(|data: &[u8]| {
    check_plan(data);
});
