//! Where the test kit (`tickmark::testing`) may stop a worker dead: at the
//! boundaries of a step's run. The kit registers [`Faults`] as an engine
//! resource; at each boundary the runner asks it whether to die there, and
//! if so waits forever, holding whatever it holds (a transactional step's
//! open transaction), until the kit aborts the worker's task: a crash, in
//! process, with nothing after the boundary run.

use std::fmt;
use std::sync::Arc;

use crate::resources::Resources;
use tickmark_driver::event::Event;

/// A point in one step's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// About to run the step (nothing of this run has happened yet).
    Starting,
    /// The step returned `Ok`: its effect happened, its mark is not written
    /// (a transactional step's transaction is still open).
    BeforeMark,
    /// The step's mark is durable; the next step has not started.
    AfterMark,
}

/// A boundary reached by a running step.
#[derive(Debug)]
pub struct Reached<'a> {
    #[doc(hidden)]
    pub event: &'a Event,
    #[doc(hidden)]
    pub step: &'a str,
    #[doc(hidden)]
    pub transactional: bool,
    #[doc(hidden)]
    pub boundary: Boundary,
}

/// What to do at a boundary: `true` to die there.
type Decide = dyn Fn(&Reached<'_>) -> bool + Send + Sync;

/// The test kit's decision at each boundary (a resource of its engine).
#[derive(Clone)]
pub struct Faults(Arc<Decide>);

impl Faults {
    #[doc(hidden)]
    pub fn new(decide: impl Fn(&Reached<'_>) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(decide))
    }

    /// Tell the kit (when it is there) that `reached` happened; never return
    /// when it decides the worker dies here.
    pub async fn at(resources: &Resources, reached: Reached<'_>) {
        if let Some(faults) = resources.get::<Faults>() {
            if (faults.0)(&reached) {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Faults")
    }
}
