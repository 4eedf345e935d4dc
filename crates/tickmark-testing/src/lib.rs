// The guide is docs/testing.md (linked here, so the package carries it):
// its examples are this module's doctests.
#![doc = include_str!("guide.md")]
// Without a backend feature this crate still compiles (each crate is
// verified alone when packaged), but it has no database to open: the code
// that would use one is unused, which is not worth a warning. The facade
// always builds it with a backend.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unreachable_code)
)]

mod boundaries;
mod clock;
mod crash;
mod database;
mod deliveries;
mod error;
mod extra_calls;
mod findings;
mod ledger;
mod lock_wait;
mod per_run;
mod test_engine;

pub use boundaries::Crash;
pub use crash::{CrashReport, CrashTest};
pub use deliveries::{Deliveries, Order};
pub use error::{BoxError, TestError};
pub use findings::{Finding, Findings};
pub use ledger::{EffectLedger, EffectOwner, LedgerCall, LedgerViolation};
pub use per_run::PerRun;
pub use test_engine::{RunReport, TestEngine};
