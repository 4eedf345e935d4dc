//! `existing_app`: a shop service that had its own axum router, its own
//! sqlx pool, migrations and tables before it added tickmark — and keeps
//! them. What it adds (docs/existing_service.md walks through it):
//!
//! - tickmark's tables in the same database, migrated explicitly
//!   (`tickmark::migrate(&pool)`), their history in tickmark's own table,
//!   beside the service's `sqlx::migrate!` (`_sqlx_migrations`);
//! - the store on the service's own pool (`PostgresStore::from_pool`);
//! - `POST /orders` records its event in the order's own transaction
//!   (`Engine::accept_in`);
//! - the receiver's plain router merged into the service's, at
//!   `/webhooks/{source}`, beside the service's own fallback;
//! - steps that decode payloads into the service's types.

pub mod handlers;
pub mod orders;

use axum::routing::{get, post};
use axum::Router;
use tickmark::receiver::providers::{Shopify, Stripe};
use tickmark::{Engine, Receiver};

/// The service's migrations: its own, run by its own migrator.
pub static APP_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/existing_app");

/// What the service's own handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The service's pool; tickmark's store is on it too.
    pub pool: sqlx::PgPool,
    /// The engine, to record events and read their status.
    pub engine: Engine,
    /// A test hook: abort after committing the order with this key, before
    /// answering.
    pub crash_after_commit: Option<String>,
}

/// The signing secrets of the two providers.
#[derive(Debug, Clone)]
pub struct Secrets {
    /// Stripe's endpoint secret (`whsec_…`).
    pub stripe: String,
    /// The Shopify app's client secret.
    pub shopify: String,
}

/// The service's router, with tickmark's receiver merged in.
pub fn router(app: AppState, secrets: &Secrets) -> Result<Router, Box<dyn std::error::Error>> {
    let receiver = Receiver::new(app.engine.clone())
        .path("/webhooks/{source}")?
        .source(
            handlers::STRIPE_SOURCE,
            Stripe::new([secrets.stripe.as_str()])?,
        )?
        .source(
            handlers::SHOPIFY_SOURCE,
            Shopify::new([secrets.shopify.as_str()])?,
        )?;
    Ok(Router::new()
        .route("/orders", post(orders::create))
        .route("/orders/{id}", get(orders::show))
        .fallback(orders::not_found)
        .with_state(app)
        .merge(receiver.router()))
}
