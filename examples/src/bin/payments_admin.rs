//! `tickmark`, the operator's command line, built with the payments app's
//! handlers linked in — so `plans check` can tell whether this build runs
//! every plan still in the database, and `reconcile` can record the Stripe
//! events the receiver missed with their handlers' plans.
//!
//! ```text
//! cargo run -p tickmark-examples --bin payments-admin -- --database-url sqlite://payments.db plans check
//! STRIPE_API_KEY=rk_live_… cargo run -p tickmark-examples --bin payments-admin -- \
//!     --database-url sqlite://payments.db reconcile --source stripe --since 3d --dry-run
//! cargo run -p tickmark-examples --bin payments-admin -- --help
//! ```
//!
//! Your own app does the same: a small binary that calls
//! `tickmark::cli::main_with(your_handlers())` (see docs/deploying.md).

fn main() -> std::process::ExitCode {
    tickmark::cli::main_with(tickmark_examples::payments::handlers())
}
