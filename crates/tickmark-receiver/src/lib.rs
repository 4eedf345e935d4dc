//! The webhook receiver: an axum router that verifies each delivery on its
//! raw bytes, records it in the inbox once, and answers at once. Steps never
//! run inside the request; a worker runs them.
//!
//! | route | answer |
//! |---|---|
//! | `POST /hooks/{source}` (the [path template](Receiver::path)) | 200 `{"status":"new"…}`, `"duplicate"` or `"ignored"` (no handler for the kind: recorded, nothing runs); a handshake's own JSON (Slack `url_verification`, nothing recorded) |
//! | | 401 missing or wrong signature, timestamp out of tolerance; 400 malformed body, missing id or kind; 413 over the body limit; 408 body not sent within the body-read timeout; 404 unknown source; 405 another method |
//! | | 503 with `Retry-After` when the store is unavailable, or too many deliveries are in flight or queued (`overloaded`), or the same event is being recorded by an application's open transaction (`accept_in_progress`); 500 on other store errors |
//! | `GET /healthz` ([standalone](Receiver::standalone_router) only) | 200 `{"status":"ok"}` |
//! | any other path or method ([standalone](Receiver::standalone_router) only) | 404 `not_found`, 405 `method_not_allowed` |
//!
//! [`Receiver::router`] is the plain router an application merges or nests
//! into its own: the delivery route alone, no `/healthz`, no router-wide
//! fallback, so the application's own fallback answers the paths it does
//! not know. [`Receiver::standalone_router`] adds `/healthz` and JSON
//! answers for every other path, for a receiver served alone;
//! [`Receiver::serve`] serves that one.
//!
//! Every answer has a JSON body that says why ([`response`]); nothing is
//! written for a refused request. The declared length and the signature
//! header's shape are checked before the body is read, so an unsigned or
//! oversized body is never buffered. [`Receiver::serve`] serves the router
//! with connection and time [`Limits`] for the internet; `axum::serve` or an
//! application's own server work too, with only the router's own limits. Each request runs in a `webhook` span with
//! the source and, once verified, the event id (dedup key) and kind; payloads
//! and secrets are never logged.
//!
//! The router is an [`axum`] 0.8 [`Router`]; this module re-exports the axum
//! it is built with (`tickmark::receiver::axum`), so an application that
//! uses it builds its own routes on the same version.
//!
//! ```
//! use tickmark::receiver::axum::{self, routing::get, Router};
//! use tickmark::receiver::providers::Stripe;
//! use tickmark::{Engine, Handlers, Receiver};
//! use tower::ServiceExt as _;
//! # use hmac::Mac as _;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("receiver.db").display());
//! let engine = Engine::new(tickmark::connect(&url).await?, Handlers::new())?;
//! let receiver = Receiver::new(engine)
//!     .path("/webhooks/{source}")? // the default is /hooks/{source}
//!     .source("stripe", Stripe::new(["whsec_test"])?)?;
//! // The application's own routes and fallback, and the receiver's route:
//! let app = Router::new()
//!     .route("/", get(|| async { "my app" }))
//!     .merge(receiver.router())
//!     .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "no such page") });
//! // axum::serve(listener, app).await? — or, in-process:
//! let body = r#"{"id":"evt_1","type":"invoice.paid"}"#;
//! # let t = chrono::Utc::now().timestamp();
//! # let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"whsec_test")?;
//! # mac.update(format!("{t}.{body}").as_bytes());
//! # let signature = format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()));
//! let request = axum::http::Request::post("/webhooks/stripe")
//!     .header("stripe-signature", signature)
//!     .body(axum::body::Body::from(body))?;
//! let response = app.oneshot(request).await?;
//! assert_eq!(response.status(), 200); // {"status":"ignored",…}: no handler for the kind
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

mod body_limit;
mod config_error;
mod path_template;
pub mod providers;
mod public_url;
mod receive;
mod replay_scope;
pub mod response;
mod router;
mod startup;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// The axum this crate is built with (0.8): build the application's routes
/// with it, so that [`Receiver::router`] merges or nests into them without a
/// second axum in the build.
pub use axum;

use axum::Router;

pub use body_limit::DEFAULT_BODY_LIMIT;
pub use config_error::ReceiverConfigError;
pub use path_template::DEFAULT_PATH;
pub use providers::Provider;
pub use public_url::{PublicBaseUrl, PublicUrlError};
pub use response::{Answer, DedupMatch, ReceiverRejection};
pub use startup::{StartupWarning, MIN_SECRET_BYTES};
/// The limits live with the accept loop every listener shares
/// ([`tickmark_serve`]); they are the receiver's too.
pub use tickmark_serve::{
    Limits, DEFAULT_ACCEPT_BACKLOG, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, DEFAULT_MAX_CONNECTION_AGE,
    DEFAULT_MAX_IN_FLIGHT, OVERLOAD_RETRY_AFTER,
};

use tickmark_core::Engine;

/// Longest source name accepted by [`Receiver::source`].
pub const MAX_SOURCE_NAME_LEN: usize = 64;

/// Builds the webhook router: path, sources, body limit, connection and
/// time limits, public URL.
///
/// The methods that can meet a wrong value ([`Receiver::source`],
/// [`Receiver::path`]) return a [`ReceiverConfigError`] that says what to
/// change; building the router cannot fail.
///
/// Cheap to build; [`Receiver::router`] can be called more than once.
#[derive(Clone)]
pub struct Receiver {
    engine: Engine,
    path: String,
    sources: BTreeMap<String, Arc<dyn Provider>>,
    in_process: BTreeSet<String>,
    body_limit: usize,
    limits: Limits,
    public_base_url: Option<PublicBaseUrl>,
}

/// What every request shares.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) sources: BTreeMap<String, Arc<dyn Provider>>,
    pub(crate) body_limit: usize,
    pub(crate) limits: Limits,
    pub(crate) public_base_url: Option<PublicBaseUrl>,
}

impl Receiver {
    /// A receiver that accepts events into `engine` at [`DEFAULT_PATH`]
    /// (`/hooks/{source}`), with no sources yet, a [`DEFAULT_BODY_LIMIT`]
    /// body limit, the default [`Limits`], and no public base URL.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            path: DEFAULT_PATH.to_owned(),
            sources: BTreeMap::new(),
            in_process: BTreeSet::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            limits: Limits::default(),
            public_base_url: None,
        }
    }

    /// Mount `provider` at `POST /hooks/{name}` (or where the
    /// [path template](Receiver::path) puts `{source}`). `name` becomes the
    /// events' source (what [`Handlers::on`](tickmark_core::Handlers::on) matches).
    ///
    /// # Errors
    ///
    /// [`ReceiverConfigError::InvalidSourceName`] when `name` is not 1 to
    /// [`MAX_SOURCE_NAME_LEN`] ASCII letters, digits, `_`, `-` or `.` (not
    /// first); [`ReceiverConfigError::DuplicateSource`] when it is mounted
    /// already.
    pub fn source(
        mut self,
        name: impl Into<String>,
        provider: impl Provider + 'static,
    ) -> Result<Self, ReceiverConfigError> {
        let name = name.into();
        if !path_template::is_valid_source_name(&name) {
            return Err(ReceiverConfigError::InvalidSourceName { name });
        }
        if self.sources.contains_key(&name) {
            return Err(ReceiverConfigError::DuplicateSource { name });
        }
        self.sources.insert(name, Arc::new(provider));
        Ok(self)
    }

    /// Declare that the application accepts events of `source` itself
    /// ([`Engine::accept`](tickmark_core::Engine::accept), `Engine::accept_in` in
    /// its own transaction) rather than through this receiver: its handlers
    /// then draw no start-up notice to mount it
    /// ([`StartupWarning::UnmountedSource`]). Nothing is mounted, and a
    /// delivery to its path is still answered 404.
    ///
    /// ```
    /// # async fn example(engine: tickmark::Engine) {
    /// // Orders come from the shop's own code through `accept_in`; Stripe's
    /// // webhooks through the receiver.
    /// let receiver = tickmark::Receiver::new(engine).in_process_source("app");
    /// # let _ = receiver;
    /// # }
    /// ```
    pub fn in_process_source(mut self, source: impl Into<String>) -> Self {
        self.in_process.insert(source.into());
        self
    }

    /// Receive deliveries at `template` instead of [`DEFAULT_PATH`]
    /// (`/hooks/{source}`): a path that starts with `/` and holds
    /// `{source}` exactly once, as a whole segment, where the source's name
    /// goes (`/webhooks/{source}`, `/api/{source}/events`). Behind
    /// `Router::nest("/prefix", …)` the prefix comes in front of it.
    ///
    /// # Errors
    ///
    /// [`ReceiverConfigError::InvalidPathTemplate`] when `template` does
    /// not start with `/`, does not hold `{source}` once as a whole
    /// segment, holds another capture, an empty segment, or a character
    /// other than ASCII letters, digits, `-`, `_`, `.` and `~`.
    pub fn path(mut self, template: &str) -> Result<Self, ReceiverConfigError> {
        self.path = path_template::checked(template)?;
        Ok(self)
    }

    /// Refuse bodies larger than `bytes` with 413 (default
    /// [`DEFAULT_BODY_LIMIT`], 1 MiB). A `Content-Length` over the limit is
    /// refused before reading; a chunked body as soon as it passes it.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The connection and time limits (default [`Limits::default`]): the
    /// body-read timeout and the in-flight cap hold for [`Receiver::router`]
    /// however it is served; the header-read (and idle) timeout and the
    /// connection cap for [`Receiver::serve`].
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits.sanitised();
        self
    }

    /// The scheme and host (and path prefix, if a proxy strips one) under which
    /// providers reach this receiver. Twilio signs the URL it posted to, so
    /// behind a proxy or TLS terminator this must be set: the public URL of a
    /// delivery is this base + the request's path and query. Without it, the
    /// receiver uses `http://` + the `Host` header, right only when providers
    /// talk to this process directly.
    pub fn public_base_url(mut self, url: PublicBaseUrl) -> Self {
        self.public_base_url = Some(url);
        self
    }

    /// The mounted source names, in order.
    pub fn source_names(&self) -> impl Iterator<Item = &str> {
        self.sources.keys().map(String::as_str)
    }

    /// What in this configuration deserves an operator's attention at
    /// start-up: a short signing secret, a Twilio source without a public
    /// URL, a mounted source no handler takes (its events are all recorded
    /// as `ignored`), and — [informational](StartupWarning::is_informational)
    /// — a source the handlers name that this receiver does not mount.
    /// Building a router logs each (at `warn`, or `info` for the
    /// informational ones), naming the source, never a secret.
    pub fn startup_warnings(&self) -> Vec<StartupWarning> {
        startup::warnings(
            &self.sources,
            &self.in_process,
            self.public_base_url.is_some(),
            self.engine.registry(),
        )
    }

    /// The plain router, to merge or nest into an application's own:
    /// `POST /hooks/{source}` (the [path template](Receiver::path)) alone,
    /// with the body-read timeout and the in-flight cap of [`Limits`]. It
    /// answers its own requests in JSON — an unknown source 404, another
    /// method on its path 405 — and sets no router-wide fallback and no
    /// `/healthz`, so the application's fallback answers every other path
    /// and `Router::merge` works next to it. Logs the mounted sources with
    /// the kinds a handler takes, and the
    /// [start-up warnings](Receiver::startup_warnings).
    ///
    /// Serve it with the application's server, or alone with
    /// [`Receiver::standalone_router`] or [`Receiver::serve`].
    pub fn router(&self) -> Router {
        self.log_startup();
        router::routes(self.shared(), &self.path)
    }

    /// The router for a receiver served alone: [`Receiver::router`] plus
    /// `GET /healthz` (200 `{"status":"ok"}`, outside the in-flight cap)
    /// and JSON answers for every other path (404 `not_found`) and method
    /// (405 `method_not_allowed`). What [`Receiver::serve`] serves; hand it
    /// to `axum::serve` to serve it without the connection limits.
    pub fn standalone_router(&self) -> Router {
        self.log_startup();
        router::standalone(self.shared(), &self.path)
    }

    fn shared(&self) -> Arc<Shared> {
        Arc::new(Shared {
            engine: self.engine.clone(),
            sources: self.sources.clone(),
            body_limit: self.body_limit,
            limits: self.limits,
            public_base_url: self.public_base_url.clone(),
        })
    }

    /// Log each mounted source with the kinds a handler takes, then the
    /// start-up warnings.
    fn log_startup(&self) {
        let registry = self.engine.registry();
        for name in self.sources.keys() {
            let path = self.path.replace(path_template::SOURCE_PLACEHOLDER, name);
            tracing::info!(
                source = name.as_str(),
                path,
                handled_kinds = startup::kinds_handled_text(registry, name),
                "webhook source mounted"
            );
        }
        for warning in self.startup_warnings() {
            if warning.is_informational() {
                tracing::info!(source = warning.source_name(), "{warning}");
            } else {
                tracing::warn!(source = warning.source_name(), "{warning}");
            }
        }
    }

    /// Serve [`Receiver::standalone_router`] on `listener` with all the [`Limits`]
    /// ([`tickmark_serve::serve`], as every listener tickmark serves):
    /// at `max_connections`, or `max_connections_per_address` from one
    /// client, a newcomer replaces an idle connection or is refused at once, a
    /// connection that does not send a complete request head within
    /// `header_read_timeout` (or stays idle that long between requests) is
    /// closed. When `shutdown` completes, stop accepting, let the requests in
    /// flight finish, and return. [`tickmark_serve::bind`] makes a listener
    /// with the limits' accept queue.
    ///
    /// ```no_run
    /// # async fn run(receiver: tickmark::Receiver) -> std::io::Result<()> {
    /// let listener = tickmark::serve::bind("0.0.0.0:8080".parse().unwrap(), &Default::default()).await?;
    /// receiver.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// None today: errors accepting one connection are logged and accepting
    /// goes on. The `io::Result` leaves room for set-up errors.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        tickmark_serve::serve(listener, self.standalone_router(), self.limits, shutdown).await
    }
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("path", &self.path)
            .field("sources", &self.sources)
            .field("body_limit", &self.body_limit)
            .field("limits", &self.limits)
            .field("public_base_url", &self.public_base_url)
            .finish_non_exhaustive()
    }
}
