//! The benchmark's parts: the naive hand-written SQL ceiling, dispatch
//! latency, where a worker's time goes, and this process's CPU and memory,
//! each in its own file.
//! `src/bin/bench.rs` runs them and prints the figures.

pub mod database;
pub mod dispatch;
pub mod naive;
pub mod otlp_sink;
pub mod phases;
pub mod process;
pub mod server_cost;
pub mod stats;
