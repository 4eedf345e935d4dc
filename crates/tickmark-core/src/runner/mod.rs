//! The runner: a worker's claim loop, and the execution of one event's steps.

mod alone_gate;
mod claim_loop;
mod config;
mod event_end;
mod event_task;
#[cfg(feature = "testing")]
pub mod faults;
mod limits;
mod pace;
mod plan_cache;
mod run_event;
mod run_step;
mod run_wait;
mod settle;
mod shared;
mod signals;
mod slots;
mod worker;

pub use alone_gate::AloneGate;
pub use config::{WorkerConfig, WorkerConfigError};
pub use signals::WorkerSignals;
pub use signals::WorkerStats;
pub use worker::Worker;
