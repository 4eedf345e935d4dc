//! tickmark's benchmarks and soak run (docs/performance.md), in a crate of
//! their own so that neither the examples nor the tests build them. Each
//! binary in `src/bin/` says how to run it; its parts are here:
//!
//! - [`bench`](mod@bench): `bench` and `wait_bench` (and `pooler_bench`'s dispatch
//!   timing): the naive SQL ceiling, dispatch latency, where a worker's time
//!   goes, the process's CPU and memory;
//! - [`fleet`]: `fleet_bench`, a fleet of worker and receiver processes on
//!   one PostgreSQL database;
//! - [`soak`]: `soak`, an hour of steady deliveries with prune on a schedule
//!   (`scripts/soak`; its one-minute version is this crate's test).

pub mod bench;
pub mod fleet;
pub mod soak;
