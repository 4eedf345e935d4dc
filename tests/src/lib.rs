//! Test support for tickmark: a fresh database per test (a SQLite file, or a
//! PostgreSQL schema), a probe that records what steps did, the steps the
//! tests run, the shared store conformance suite, and [`per_backend!`], which
//! stamps a test out once per backend.
//!
//! PostgreSQL tests read `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). They fail when it is
//! unreachable; `TICKMARK_SKIP_POSTGRES=1` skips them instead, except when
//! `CI=true`. Every skip is recorded ([`skip::record`]) so that `scripts/test`
//! reports it.

pub mod announced;
pub mod cargo_bin;
pub mod chaos;
pub mod conformance;
pub mod db;
pub mod fault_queue;
pub mod github_api;
pub mod http_client;
pub mod meeting;
pub mod otlp_collector;
pub mod per_backend;
pub mod pg_auto_failover;
pub mod pg_cluster;
pub mod pg_replica;
pub mod pgbouncer;
pub mod probe;
pub mod shopify_api;
pub mod skip;
pub mod stripe_api;
pub mod terminate;
pub mod test_steps;
pub mod wait;

/// docs/existing_service.md's code blocks, compiled as doctests: the names,
/// paths and Cargo features a new adopter reads there must be the ones that
/// build.
#[cfg(doctest)]
#[doc = include_str!("../../docs/existing_service.md")]
mod existing_service_guide {}

pub use cargo_bin::cargo_bin;
pub use db::TestDb;
pub use probe::Probe;
