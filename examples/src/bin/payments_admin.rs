//! `tickmark`, the operator's command line, built with the payments app's
//! step types linked in — so `plans check` can tell whether this build runs
//! every plan still in the database.
//!
//! ```text
//! cargo run -p tickmark-examples --bin payments-admin -- --database-url sqlite://payments.db plans check
//! cargo run -p tickmark-examples --bin payments-admin -- --help
//! ```
//!
//! Your own app does the same: a small binary that links your steps and
//! calls `tickmark::cli::main()` (see docs/deploying.md).

fn main() -> std::process::ExitCode {
    // Building the handlers references every step type, so the linker keeps
    // their typetag registrations.
    drop(tickmark_examples::payments::handlers());
    tickmark::cli::main()
}
