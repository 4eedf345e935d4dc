//! The runner: a worker's claim loop, and the execution of one event's steps.

mod config;
mod limits;
mod pace;
mod plan_cache;
mod run_event;
mod run_step;
mod settle;
mod signals;
mod worker;

pub use config::WorkerConfig;
pub(crate) use signals::WorkerSignals;
pub use signals::WorkerStats;
pub use worker::Worker;
