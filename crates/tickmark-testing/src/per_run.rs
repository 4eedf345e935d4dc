//! [`PerRun`]: what a [`CrashTest`](super::CrashTest)'s `setup` makes for
//! each run and its `end_state` gets back: the run's test engine, alone or
//! with a context of the test's own.

use super::test_engine::TestEngine;

/// What a [`CrashTest`](super::CrashTest)'s `setup` returns for each run,
/// handed whole to its `end_state` once the run is over:
///
/// - a [`TestEngine`], when the end state is read from the engine alone
///   (its database, its attached ledger);
/// - `(TestEngine, C)`, when `end_state` needs more of what `setup` made
///   for this run (the run's own [`EffectLedger`](super::EffectLedger), a
///   temp dir your steps write files into, a pool of your application's):
///   `C` is yours, and each run's `end_state` gets its own run's.
///
/// Sealed: those two are the shapes a run can have.
pub trait PerRun: sealed::Sealed {
    /// The run's test engine.
    fn test_engine(&self) -> &TestEngine;
}

impl PerRun for TestEngine {
    fn test_engine(&self) -> &TestEngine {
        self
    }
}

impl<C> PerRun for (TestEngine, C) {
    fn test_engine(&self) -> &TestEngine {
        &self.0
    }
}

mod sealed {
    use super::TestEngine;

    pub trait Sealed {}
    impl Sealed for TestEngine {}
    impl<C> Sealed for (TestEngine, C) {}
}
