//! The test kit: prove your own handler idempotent (the `testing` feature).
//!
//! See docs/testing.md.

mod boundaries;
mod clock;
mod crash;
mod database;
mod deliveries;
mod error;
mod ledger;
mod test_engine;

pub use boundaries::Crash;
pub use crash::{CrashReport, CrashTest, Finding, Findings};
pub use deliveries::{Deliveries, Order};
pub use error::{BoxError, TestError};
pub use ledger::{EffectLedger, EffectOwner, LedgerCall, LedgerViolation};
pub use test_engine::{RunReport, TestEngine};
