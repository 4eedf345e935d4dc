//! Deterministic simulation of tickmark (docs/simulation.md).
//!
//! The real engine (runner, claim loop, heartbeat, settle, inbox, operator
//! actions) runs on real SQLite under a paused tokio clock, with several
//! simulated worker processes. One seed decides everything: deliveries and
//! their duplicates, step durations and failures, crashes, pauses past the
//! lease, failing store calls, clock jumps and operator actions. The same
//! seed replays the same run, trace and all.
//!
//! ```no_run
//! let report = tickmark_sim::run(42, tickmark_sim::Variant::Correct)?;
//! assert!(report.violations.is_empty(), "{:?}", report.violations);
//! # Ok::<(), tickmark_sim::SimError>(())
//! ```

mod chaos;
mod clock;
mod db;
mod deliveries;
mod dice;
mod invariants;
mod journal;
mod process;
mod sim_store;
mod steps;
mod variant;
mod world;

use std::collections::BTreeMap;
use std::time::Duration;

pub use deliveries::Workload;
pub use journal::Fault;
pub use variant::Variant;
pub use world::{run, run_with};

/// What one run did and found.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Its seed.
    pub seed: u64,
    /// The store variant it ran.
    pub variant: Variant,
    /// A digest of its trace: a replay must match it.
    pub digest: String,
    /// Broken invariants (empty: none).
    pub violations: Vec<String>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, u64>,
    /// How many invariant checks were made.
    pub invariants_checked: u64,
    /// How many events were delivered.
    pub events: usize,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// The trace, one line per thing that happened.
    pub trace: Vec<String>,
}

/// Why a run could not be made (not a violation: the harness failed).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The database.
    #[error("database: {0}")]
    Store(#[from] tickmark::store::StoreError),
    /// A query of the simulator's own.
    #[error("query: {0}")]
    Query(#[from] sqlx::Error),
    /// The handlers.
    #[error("handlers: {0}")]
    Config(#[from] tickmark::HandlerConfigError),
    /// The worker settings.
    #[error("worker settings: {0}")]
    Worker(#[from] tickmark::WorkerConfigError),
    /// The runtime or the temporary directory.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
