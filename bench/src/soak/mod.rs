//! The soak run (`src/bin/soak.rs`, `docs/performance.md`): steady signed
//! deliveries with redeliveries, prune on a schedule, and the tables watched
//! over time, each part in its own file.

pub mod handler;
pub mod plot;
pub mod pruner;
pub mod sampler;
pub mod samples;
pub mod sender;
pub mod summary;
