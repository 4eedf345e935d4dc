//! tickmark-examples' integration tests, one binary: a module per example
//! or concern, each running the examples' real binaries or handlers (each
//! extra test binary would link tickmark and every dependency again). Run
//! one by its module path, e.g.
//! `cargo nextest run -p tickmark-examples --test it payments::`.

// The README's programs.
mod quickstart;
mod readme;

// payments: end to end, its start-up, its admin binary, hostile connections.
// The connection tests read /proc: Linux only.
#[cfg(target_os = "linux")]
mod hostile_connections;
mod payments;
mod payments_admin;
mod payments_startup;

// shopsync.
mod shopsync;
mod shopsync_one_body_two_topics;
mod shopsync_orders;
mod shopsync_privacy;

// The other examples.
mod existing_app;
mod media;

// The test kit on the examples' real handlers, and on broken ones.
mod broken_handlers;
mod kit_payments;
mod kit_shopsync;
