//! The test kit for your own handlers (the `tickmark-testing` crate): a
//! [`TestEngine`] on a temp SQLite file or a PostgreSQL schema, a
//! [`CrashTest`] that crashes a worker at every step boundary, deliveries as
//! providers send them ([`Deliveries`]), and an [`EffectLedger`] that
//! records each outbound call with its idempotency key. The guide is
//! docs/testing.md.

pub use tickmark_testing::{
    BoxError, Crash, CrashReport, CrashTest, Deliveries, EffectLedger, EffectOwner, Finding,
    Findings, LedgerCall, LedgerViolation, Order, PerRun, RunReport, TestEngine, TestError,
};
