//! The chaos run's machinery (the binaries are `src/bin/chaos.rs`, the
//! driver, and `src/bin/chaos_node.rs`, the nodes it kills; the guide is
//! `docs/chaos.md`).
//!
//! | module | what |
//! |---|---|
//! | [`plan`] | the seeded plan: events, customers, amounts, and when each delivery starts |
//! | [`provider`] | the sender: signs like Stripe and retries a delivery until it gets a 2xx |
//! | [`receipts`] | the stand-in receipt service: every call and every distinct `Idempotency-Key` |
//! | [`nodes`] | node processes: start, SIGKILL, SIGSTOP/SIGCONT, SIGTERM, and what their logs say |
//! | [`auto_failover`] | `--failover auto`: pg_auto_failover fails the database over; the old primary rejoins |
//! | [`database`] | the chaos database (a throwaway PostgreSQL cluster or a SQLite file) and the queries that judge the run |
//! | [`orphans`] | how long events held by a killed node waited until another node claimed them |
//! | [`report`] | the figures, the checks, the table and the JSON line |

pub mod auto_failover;
pub mod database;
pub mod nodes;
pub mod orphans;
pub mod plan;
pub mod provider;
pub mod receipts;
pub mod report;

/// The Stripe signing secret the driver signs with and the nodes verify.
pub const STRIPE_SECRET: &str = "whsec_chaos_run_signing_secret";
