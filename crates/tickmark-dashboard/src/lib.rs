//! The dashboard: a small server-rendered web page over the step-status
//! table, for operators. No build step, no external assets, no scripts.
//!
//! | route | page |
//! |---|---|
//! | `GET /` | the overview: events by state and source, oldest pending age, stuck events, events done per minute, the latest dead letters |
//! | `GET /events` | the event list, newest first, filtered by `state`, `source`, `kind`, `since` (`90s`, `15m`, `24h`, `7d`) and `limit`; or found by `id` (row number or dedup key) |
//! | `GET /events/{seq}` | one event: its fields, step-status table, payload and audit trail, and the retry button |
//! | `POST /events/{seq}/retry` | re-queue the event (form fields `token` or `csrf`, `from_step`, `force`, `reason`); 303 to the event page, the refusal on the page (409), 401 without the token, 403 with a session but without its CSRF token, 429 after too many wrong tokens |
//! | `GET /login`, `POST /login`, `POST /logout` | signing a browser in (the token in a password field sets a session cookie; 429 after too many wrong tokens) and out (which revokes every session issued so far) |
//!
//! **Private by default.** With a token ([`Dashboard::token`]) every page
//! needs it: `Authorization: Bearer <token>`, or a browser session from the
//! login form (an `HttpOnly`, `Secure`, `SameSite=Strict` cookie; its forms
//! carry a CSRF token). A request without it gets 401, with the login form
//! as the body. Next to it in [`ops::router`],
//! `/metrics` needs the token too, unless [`Dashboard::metrics_public`].
//! Without a token the dashboard shows nothing and does nothing (every page
//! answers 401 saying how to configure one): it cannot leak payloads by
//! being left unconfigured.
//!
//! **Guessing is throttled.** Every wrong token (login form, retry form,
//! bearer header on a page or `/metrics`) counts against the client's
//! address (an IPv6 client is its /64) and a global budget
//! ([`FailureLimits`]: by default 10 per address and 100 in all per minute).
//! Over budget, the request is answered 429 with `Retry-After` and its token
//! is not checked at all, so a right guess is not revealed either. Signed-in
//! browsers are not throttled. A token shorter than [`MIN_TOKEN_BYTES`] is
//! warned about when the router is built ([`Dashboard::startup_warnings`]).
//! **Signing out revokes**: `POST /logout` (or [`Dashboard::revoke_sessions`])
//! invalidates every session issued so far, in every browser.
//!
//! Everything shown from the database (payloads, ids, errors: they arrive
//! in webhook bodies) goes through `maud` templates, which escape every
//! spliced value.
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
//! // or with `/metrics` beside it (which then needs the token too):
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
mod form_body;
mod html;
mod links;
mod login;
pub mod ops;
mod pages;
mod retry;
mod startup;
mod viewer;

use std::fmt;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{middleware, Router};

pub(crate) use auth::guard_metrics;
use auth::Auth;
pub use auth::{FailureLimits, DEFAULT_GLOBAL, DEFAULT_PER_CLIENT, DEFAULT_WINDOW, MAX_CLIENTS};
use html::Page;
pub use startup::{StartupWarning, MIN_TOKEN_BYTES};
use tickmark_core::Engine;
use tickmark_driver::store::StoreError;
use viewer::Viewer;

/// The largest form the retry button or the login form may post.
const FORM_LIMIT: usize = 16 * 1024;

/// Builds the dashboard's router: the engine whose store it reads, and the
/// token that guards it.
#[derive(Clone)]
pub struct Dashboard {
    engine: Engine,
    auth: Option<Arc<Auth>>,
    token_bytes: Option<usize>,
    failure_limits: FailureLimits,
    metrics_public: bool,
    actor: String,
}

/// What every request shares.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) auth: Option<Arc<Auth>>,
    pub(crate) actor: String,
}

impl Dashboard {
    /// A dashboard over `engine`'s store. It shows nothing until it has a
    /// [`token`](Self::token).
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            auth: None,
            token_bytes: None,
            failure_limits: FailureLimits::default(),
            metrics_public: false,
            actor: "dashboard".to_owned(),
        }
    }

    /// The token that every page, every action and (in
    /// [`ops::router`]) `/metrics` need. Use a long
    /// random secret, at least [`MIN_TOKEN_BYTES`] long (a shorter one is a
    /// [start-up warning](Self::startup_warnings)); it is compared in
    /// constant time, and wrong guesses are throttled
    /// ([`failure_limits`](Self::failure_limits)). Browser sessions signed
    /// in with it are signed with a key drawn now, at random.
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
        self.auth = Some(Arc::new(Auth::new(secret, self.failure_limits)));
        self.token_bytes = Some(secret.len());
        self
    }

    /// How many wrong tokens are tolerated, per client address and from
    /// everyone, before token checks are answered 429 (default
    /// [`FailureLimits::default`]: [`DEFAULT_PER_CLIENT`] and
    /// [`DEFAULT_GLOBAL`] per [`DEFAULT_WINDOW`]).
    pub fn failure_limits(mut self, limits: FailureLimits) -> Self {
        self.failure_limits = limits;
        self.auth = self.auth.map(|auth| Arc::new(auth.with_limits(limits)));
        self
    }

    /// What in this configuration deserves an operator's attention: a token
    /// shorter than [`MIN_TOKEN_BYTES`]. [`Dashboard::router`] logs each as
    /// a warning (never the token).
    ///
    /// ```
    /// # use tickmark::dashboard::{Dashboard, StartupWarning};
    /// # use tickmark::{Engine, Handlers};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}", dir.path().join("warn.db").display());
    /// # let engine = Engine::new(tickmark::connect(&url).await?, Handlers::new())?;
    /// let dashboard = Dashboard::new(engine).token("hunter2");
    /// assert_eq!(dashboard.startup_warnings(), [StartupWarning::ShortToken { bytes: 7 }]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn startup_warnings(&self) -> Vec<StartupWarning> {
        startup::warnings(self.token_bytes)
    }

    /// Sign every browser out: every session issued so far (by this
    /// dashboard, its clones and the routers built from them) is refused
    /// from now on, as after `POST /logout`. Nothing happens without a
    /// token. Bearer tokens are unaffected: change the token for that.
    pub fn revoke_sessions(&self) {
        if let Some(auth) = &self.auth {
            auth.revoke_sessions();
        }
    }

    /// Serve `/metrics` without the token (default: it needs it, like the
    /// pages). For a Prometheus that scrapes over a private network and
    /// cannot send a bearer token: the metrics show counts, source and step
    /// names, never payloads. The pages stay private.
    pub fn metrics_public(mut self, public: bool) -> Self {
        self.metrics_public = public;
        self
    }

    /// The name recorded in the audit trail for actions taken here
    /// (default `dashboard`).
    pub fn actor(mut self, name: impl Into<String>) -> Self {
        self.actor = name.into();
        self
    }

    /// What guards `/metrics` beside this dashboard: its token, unless
    /// there is none or [`metrics_public`](Self::metrics_public) opened it.
    pub(crate) fn metrics_auth(&self) -> Option<Arc<Auth>> {
        self.auth.clone().filter(|_| !self.metrics_public)
    }

    /// The router. Serve it with `axum::serve`, nest it under a prefix (its
    /// links and its session cookie follow), or merge it with
    /// [`ops::router`]. Logs the
    /// [start-up warnings](Self::startup_warnings).
    ///
    /// Wrong tokens are counted per client address when the server puts
    /// `axum::extract::ConnectInfo<SocketAddr>` in the request's extensions
    /// (`router.into_make_service_with_connect_info::<SocketAddr>()`);
    /// otherwise only the global budget applies.
    pub fn router(&self) -> Router {
        for warning in self.startup_warnings() {
            tracing::warn!("{warning}");
        }
        let shared = Arc::new(Shared {
            engine: self.engine.clone(),
            auth: self.auth.clone(),
            actor: self.actor.clone(),
        });
        Router::new()
            .route("/", get(pages::overview::page))
            .route("/events", get(pages::events::page))
            .route("/events/{seq}", get(pages::event::page))
            .route("/events/{seq}/retry", post(retry::retry))
            .route("/login", get(login::show).post(login::sign_in))
            .route("/logout", post(login::sign_out))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(middleware::from_fn_with_state(
                Arc::clone(&shared),
                auth::guard,
            ))
            .layer(DefaultBodyLimit::max(FORM_LIMIT))
            .with_state(shared)
    }
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard")
            .field("auth", &self.auth)
            .field("failure_limits", &self.failure_limits)
            .field("metrics_public", &self.metrics_public)
            .field("actor", &self.actor)
            .finish_non_exhaustive()
    }
}

async fn not_found(viewer: Viewer) -> Page {
    Page::message(
        &viewer,
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such page.",
    )
}

async fn method_not_allowed(viewer: Viewer) -> Page {
    Page::message(
        &viewer,
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        "This page does not take that method.",
    )
}

/// The page for a store error: 503 when the database is unavailable (try
/// again), 500 otherwise. Details go to the log, not to the page.
pub(crate) fn store_failure(viewer: &Viewer, error: &StoreError) -> Page {
    if error.is_transient() {
        tracing::warn!(%error, "dashboard: database unavailable");
        Page::message(
            viewer,
            StatusCode::SERVICE_UNAVAILABLE,
            "Database unavailable",
            "The database is unavailable right now; reload the page in a moment.",
        )
    } else {
        tracing::error!(%error, "dashboard: store error");
        Page::message(
            viewer,
            StatusCode::INTERNAL_SERVER_ERROR,
            "Store error",
            "The store could not answer; the server's log has the details.",
        )
    }
}
