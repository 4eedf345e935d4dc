//! The test kit: prove your own handler idempotent (the `testing` feature).
//!
//! Work in progress; see docs/testing.md.

mod ledger;

pub use ledger::{EffectLedger, EffectOwner, LedgerCall, LedgerViolation};
