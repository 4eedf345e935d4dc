//! The dashboard: a small server-rendered web page over the step-status
//! table, for operators. No build step, no external assets, no scripts.
//!
//! | route | page |
//! |---|---|
//! | `GET /` | the overview: events by state and source, oldest pending age, stuck events, events done per minute, the latest dead letters |
//! | `GET /events` | the event list, newest first, filtered by `state`, `source`, `kind`, `since` (`90s`, `15m`, `24h`, `7d`) and `limit`; or found by `id` (row number or dedup key) |
//! | `GET /events/{seq}` | one event: its fields, step-status table, payload and audit trail, and the retry button |
//! | `POST /events/{seq}/retry` | re-queue the event (form fields `token`, `from_step`, `force`, `reason`); 303 to the event page, the refusal on the page (409), or 401 without the token |
//!
//! The token ([`Dashboard::token`]) is needed for the retry button, as
//! `Authorization: Bearer …` or the form's `token` field; reading pages needs
//! it too with [`Dashboard::token_for_reads`]. Without a token the dashboard
//! is read-only. Everything shown from the database is escaped
//! (`html::escape`): payloads, ids and errors arrive in webhook bodies.
//!
//! ```
//! use tickmark::dashboard::Dashboard;
//! use tickmark::{Engine, Handlers};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("dashboard.db").display());
//! let engine = Engine::new(tickmark::connect(&url).await?, Handlers::new())?;
//! let dashboard = Dashboard::new(engine.clone()).token("a long random secret");
//! // Serve it alone, nest it (`Router::new().nest("/ops", dashboard.router())`),
//! // or with `/metrics` beside it:
//! let app = tickmark::ops::router(engine, Some(dashboard));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```

// Attacker input flows through everything here: nothing that can panic
// compiles outside tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::string_slice
    )
)]

mod auth;
mod html;
mod links;
mod pages;
mod retry;

use std::fmt;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{middleware, Router};

use crate::engine::Engine;
use crate::store::StoreError;
use auth::Token;
use html::Page;
use links::Base;

pub use html::escape;

/// The largest form the retry button may post.
const FORM_LIMIT: usize = 16 * 1024;

/// Builds the dashboard's router: the engine whose store it reads, and the
/// token that guards its actions.
#[derive(Clone)]
pub struct Dashboard {
    engine: Engine,
    token: Option<Token>,
    token_for_reads: bool,
    actor: String,
}

/// What every request shares.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) token: Option<Token>,
    pub(crate) token_for_reads: bool,
    pub(crate) actor: String,
}

impl Dashboard {
    /// A read-only dashboard over `engine`'s store: no token, pages open to
    /// whoever reaches the address.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            token: None,
            token_for_reads: false,
            actor: "dashboard".to_owned(),
        }
    }

    /// The bearer token that operator actions (the retry button) need. Use a
    /// long random secret; it is compared in constant time.
    ///
    /// # Panics
    ///
    /// When `secret` is empty: a programming error (an empty secret would
    /// guard nothing), caught at start-up.
    #[allow(clippy::panic)]
    pub fn token(mut self, secret: impl AsRef<str>) -> Self {
        let secret = secret.as_ref();
        if secret.is_empty() {
            panic!("the dashboard token must not be empty");
        }
        self.token = Some(Token::new(secret));
        self
    }

    /// Require the token (as `Authorization: Bearer …`) to read pages too,
    /// not only to act. Without a token configured, every page then answers 401.
    pub fn token_for_reads(mut self, required: bool) -> Self {
        self.token_for_reads = required;
        self
    }

    /// The name recorded in the audit trail for actions taken here
    /// (default `dashboard`).
    pub fn actor(mut self, name: impl Into<String>) -> Self {
        self.actor = name.into();
        self
    }

    /// The router. Serve it with `axum::serve`, nest it under a prefix (its
    /// links follow), or merge it with [`ops::router`](crate::ops::router).
    pub fn router(&self) -> Router {
        let shared = Arc::new(Shared {
            engine: self.engine.clone(),
            token: self.token.clone(),
            token_for_reads: self.token_for_reads,
            actor: self.actor.clone(),
        });
        Router::new()
            .route("/", get(pages::overview::page))
            .route("/events", get(pages::events::page))
            .route("/events/{seq}", get(pages::event::page))
            .route("/events/{seq}/retry", post(retry::retry))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(middleware::from_fn_with_state(
                Arc::clone(&shared),
                auth::guard_reads,
            ))
            .layer(DefaultBodyLimit::max(FORM_LIMIT))
            .with_state(shared)
    }
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard")
            .field("token", &self.token)
            .field("token_for_reads", &self.token_for_reads)
            .field("actor", &self.actor)
            .finish_non_exhaustive()
    }
}

async fn not_found(base: Base) -> Page {
    Page::message(
        &base.0,
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such page.",
    )
}

async fn method_not_allowed(base: Base) -> Page {
    Page::message(
        &base.0,
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        "This page does not take that method.",
    )
}

/// The page for a store error: 503 when the database is unavailable (try
/// again), 500 otherwise. Details go to the log, not to the page.
pub(crate) fn store_failure(base: &Base, error: &StoreError) -> Page {
    if error.is_transient() {
        tracing::warn!(%error, "dashboard: database unavailable");
        Page::message(
            &base.0,
            StatusCode::SERVICE_UNAVAILABLE,
            "Database unavailable",
            "The database is unavailable right now; reload the page in a moment.",
        )
    } else {
        tracing::error!(%error, "dashboard: store error");
        Page::message(
            &base.0,
            StatusCode::INTERNAL_SERVER_ERROR,
            "Store error",
            "The store could not answer; the server's log has the details.",
        )
    }
}
