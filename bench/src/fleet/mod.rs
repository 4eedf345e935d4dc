//! `fleet_bench`'s parts: a fleet of worker and receiver processes on one
//! PostgreSQL database, and the coordinator that starts them, loads a
//! backlog, drains it, kills a worker under load and checks the result.
//! `src/bin/fleet_bench.rs` is both the coordinator and, re-executed with a
//! hidden `--role`, each child process.
//!
//! - `steps`: the three steps every event runs, and the application table;
//! - `deliveries`: signed Stripe-like deliveries, some of them redelivered;
//! - `roles`: what a worker or receiver child process does;
//! - `children`: starting, signalling and hearing from child processes;
//! - `sampler`: the database's wait events, sampled during a drain;
//! - `run`: one run (N workers) from a fresh schema to its checked figures;
//! - `report`: the table.

pub mod children;
pub mod deliveries;
pub mod report;
pub mod roles;
pub mod run;
pub mod sampler;
pub mod steps;

/// The source name, and the event type every delivery carries.
pub const SOURCE: &str = "stripe";
/// The event type of every delivery.
pub const KIND: &str = "invoice.payment_succeeded";
/// The Stripe signing secret shared by the coordinator and the receivers.
pub const SECRET: &str = "whsec_fleet_bench";
