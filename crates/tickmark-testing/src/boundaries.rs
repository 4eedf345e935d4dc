//! The kit's side of the runner's step boundaries: what it saw (each step
//! that started, in order; which step is running now) and where it has been
//! asked to crash the worker.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use tickmark_core::runner::faults::{Boundary, Faults, Reached};

use super::ledger::EffectOwner;

/// Where, in a step's run, a crash stops the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Crash {
    /// The step's effect happened (it returned), its mark is not written:
    /// the step runs again, on the same idempotency key. A transactional
    /// step's transaction rolls back with the crash.
    BeforeMark,
    /// The step's mark is durable, the next step has not started: the
    /// run resumes at the next step with this one's stored output.
    AfterMark,
}

impl Crash {
    fn boundary(self) -> Boundary {
        match self {
            Crash::BeforeMark => Boundary::BeforeMark,
            Crash::AfterMark => Boundary::AfterMark,
        }
    }
}

/// One crash, armed: the first time any event's step `step` reaches `at`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CrashPoint {
    pub step: String,
    pub at: Crash,
}

/// One step that started running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepStarted {
    pub owner: EffectOwner,
    pub transactional: bool,
}

#[derive(Debug, Default)]
struct Seen {
    started: Vec<StepStarted>,
    running: Option<EffectOwner>,
    armed: Vec<CrashPoint>,
    crashed: Vec<CrashPoint>,
    always_replay: bool,
    /// Steps already run twice by `always_replay`.
    replayed: HashSet<EffectOwner>,
}

/// Shared by the runner's fault hook and the test engine.
#[derive(Debug, Default)]
pub(crate) struct BoundaryLog {
    seen: Mutex<Seen>,
    /// Notified at each crash: the drive loop then kills the worker.
    crash: Notify,
}

impl BoundaryLog {
    /// The resource the engine's workers consult at each boundary.
    pub(crate) fn faults(self: &Arc<Self>) -> Faults {
        let log = Arc::clone(self);
        Faults::new(move |reached| log.reached(reached))
    }

    /// Record `reached`; `true` when the worker must die here.
    fn reached(&self, reached: &Reached<'_>) -> bool {
        let owner = EffectOwner {
            source: reached.event.source.clone(),
            event_id: reached.event.id.clone(),
            step: reached.step.to_owned(),
        };
        let mut seen = self.lock();
        let die = match reached.boundary {
            Boundary::Starting => {
                seen.started.push(StepStarted {
                    owner: owner.clone(),
                    transactional: reached.transactional,
                });
                seen.running = Some(owner);
                false
            }
            boundary => {
                let armed = seen.armed.iter().position(|point| {
                    point.step == reached.step && point.at.boundary() == boundary
                });
                if let Some(index) = armed {
                    let point = seen.armed.remove(index);
                    seen.crashed.push(point);
                    true
                } else {
                    seen.always_replay
                        && boundary == Boundary::BeforeMark
                        && !reached.transactional
                        && seen.replayed.insert(owner)
                }
            }
        };
        if die {
            seen.running = None;
            drop(seen);
            self.crash.notify_one();
        }
        die
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn arm(&self, point: CrashPoint) {
        self.lock().armed.push(point);
    }

    pub(crate) fn set_always_replay(&self, on: bool) {
        self.lock().always_replay = on;
    }

    /// Wait for the next crash.
    pub(crate) async fn crashed(&self) {
        self.crash.notified().await;
    }

    /// The crashes that happened, in order.
    pub(crate) fn crashes(&self) -> Vec<CrashPoint> {
        self.lock().crashed.clone()
    }

    /// Every step that started, in order.
    pub(crate) fn started(&self) -> Vec<StepStarted> {
        self.lock().started.clone()
    }

    /// The step running now (the last to start, unless it crashed).
    pub(crate) fn running(&self) -> Option<EffectOwner> {
        self.lock().running.clone()
    }

    /// No step runs once its worker is gone.
    pub(crate) fn worker_stopped(&self) {
        self.lock().running = None;
    }
}
