//! The database side of a simulation: a runtime of its own, on real threads,
//! where the SQLite stores live and every store call runs to completion while
//! the simulated world waits.
//!
//! Why: sqlx runs each SQLite connection on a thread of its own. Awaited from
//! the simulation's paused-clock runtime, a query would let that runtime go
//! idle and jump its clock to the next timer while the query ran: when it
//! finished would depend on real time, and no seed could replay a run. Run
//! here instead, a call is one indivisible step of the simulation, taking
//! no simulated time; the simulation chooses, from its seed, what happens
//! between calls.

use std::future::Future;

use tokio::runtime::{Builder, Runtime};

use crate::clock::SimClock;

/// The runtime the stores' own tasks (group commits, the pools) run on.
pub struct DbThread {
    runtime: Runtime,
    clock: SimClock,
}

impl DbThread {
    /// Start it: one worker thread (the stores' background tasks). Every
    /// call observes `clock` first, so the store reads simulated time.
    pub fn start(clock: SimClock) -> std::io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sim-db")
            .enable_all()
            .build()?;
        Ok(Self { runtime, clock })
    }

    /// Run `work` to completion on a thread inside the database runtime,
    /// blocking the calling (simulation) thread until it is done. `work` may
    /// borrow: the thread is scoped to this call.
    pub fn block<F>(&self, work: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        self.clock.elapsed();
        let handle = self.runtime.handle();
        std::thread::scope(|scope| {
            let worker = scope.spawn(|| handle.block_on(work));
            match worker.join() {
                Ok(output) => output,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

impl std::fmt::Debug for DbThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DbThread")
    }
}
