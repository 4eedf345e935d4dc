//! tickmark-tests' integration tests, one binary: a module per area (each
//! extra test binary would link tickmark and every dependency again). Run
//! one area by its module path, e.g.
//! `cargo nextest run -p tickmark-tests --test it conformance::` or
//! `cargo test -p tickmark-tests --test it dashboard::`.

// Helpers shared by several areas.
mod chaos_support;
mod receiver_support;
mod reconcile_support;

// The store.
mod conformance;
mod crash;
mod heartbeat;
mod poison;
mod prefetch;

// Traces exported to a loopback OpenTelemetry collector.
mod traces;

// Personal data: encryption at rest, erasure, key rotation.
mod privacy;

// Embedding tickmark in an application.
mod accept_in;
mod app_pool;
mod test_kit;

// The schema and upgrades.
mod migrations_source;
mod postgres_upgrade;
mod schema_snapshot;
mod sqlite_upgrade;

// The database in production: poolers and failover.
mod auto_failover;
mod chaos;
mod failover;
mod pgbouncer;

// The receiver.
mod fuzz_regressions;
mod hostile;
mod log_scan;
mod receiver_http;
mod receiver_in_an_app;
mod receiver_limits;
mod receiver_outage;
mod receiver_providers;
mod receiver_tenants;
mod replay;
mod shopify_topics;

// Reconciling with the providers, and the fake providers it runs against.
mod github_api;
mod reconcile_chaos;
mod reconcile_cli;
mod reconcile_github;
mod reconcile_guards;
mod reconcile_in_the_worker;
mod reconcile_stripe;
mod shopify_api;
mod stripe_api;

// The ready-made steps.
mod steps;

// Operators: the command line and the dashboard.
mod cli;
mod cli_version;
mod dashboard;
mod dashboard_auth;
mod dashboard_browser;
