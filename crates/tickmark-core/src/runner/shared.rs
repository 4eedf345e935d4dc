//! What a worker's event tasks share: the store, the handlers, the lease book,
//! the limits, the slots, and the two stop signals.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::limits::Limits;
use super::pace::Pace;
use super::plan_cache::PlanCache;
use super::slots::Slots;
use super::{AloneGate, WorkerConfig, WorkerSignals};
use crate::claim::LeaseBook;
use crate::handler::Registry;
use crate::metrics::Metrics;
use crate::privacy::Privacy;
use crate::resources::Resources;
use tickmark_driver::store::Store;

/// What a worker's event tasks share.
#[derive(Debug)]
pub struct RunnerShared {
    pub store: Arc<dyn Store>,
    pub registry: Arc<Registry>,
    /// The keys that seal outputs and open payloads (docs/privacy.md).
    pub privacy: Arc<Privacy>,
    pub resources: Resources,
    pub metrics: Arc<Metrics>,
    pub config: WorkerConfig,
    pub signals: WorkerSignals,
    pub book: Arc<LeaseBook>,
    pub limits: Arc<Limits>,
    /// How many events run steps at once, and which wait for their final mark.
    pub slots: Arc<Slots>,
    pub plans: PlanCache,
    pub pace: Pace,
    /// Shared by the engine's workers: who claims alone (`alone_gate.rs`).
    pub gate: Arc<AloneGate>,
    /// Stop claiming; running events stop at their next step boundary.
    pub shutdown: CancellationToken,
    /// The grace period is over: cancel running steps.
    pub hard_stop: CancellationToken,
}
