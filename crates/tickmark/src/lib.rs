//! # tickmark
//!
//! Long webhook handlers, safe under at-least-once delivery.
//!
//! Providers retry a webhook until they see a 2xx, and a receiver can crash
//! between doing the work and answering. tickmark records each event once
//! (deduplicated by the provider's event id, or by a hash of the body), runs its
//! handler as **ordered steps outside any lock**, and **marks each step done**
//! in its own short transaction. A crash resumes at the first unfinished step;
//! every step has an idempotency key (`{source}:{event id}:{step}`) to pass to
//! external services, so a re-run is absorbed by the far side.
//!
//! ## Quick start
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use tickmark::{Engine, Handler, Handlers, NewEvent, Step, StepContext, StepResult, WorkerConfig};
//!
//! /// A step is a plain struct; its fields are stored in the event's plan.
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Greet {
//!     greeting: String,
//! }
//!
//! /// The part of the payload the step reads.
//! #[derive(Deserialize)]
//! struct Order {
//!     name: String,
//! }
//!
//! #[typetag::serde(name = "greet")] // a stable name: the plan stores it
//! #[async_trait::async_trait]
//! impl Step for Greet {
//!     async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
//!         // A payload that does not decode parks the event with serde's message.
//!         let order: Order = ctx.payload()?;
//!         // Pass ctx.idempotency_key() to anything external.
//!         Ok(serde_json::json!({ "said": format!("{}, {}", self.greeting, order.name) }))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("quickstart.db").display());
//! // SQLite by default; `postgres://…` for many machines.
//! let store = tickmark::connect(&url).await?;
//! let handlers = Handlers::new().on(
//!     "shop",
//!     "order.paid",
//!     Handler::new().step(Greet { greeting: "Thanks".into() }),
//! );
//! let engine = Engine::new(store, handlers)?;
//!
//! // The receiver calls accept() for every verified delivery.
//! let first = engine
//!     .accept(NewEvent::with_id("shop", "evt_1", "order.paid", serde_json::json!({"name": "Ada"})))
//!     .await?;
//! let again = engine
//!     .accept(NewEvent::with_id("shop", "evt_1", "order.paid", serde_json::json!({"name": "Ada"})))
//!     .await?;
//! assert!(first.is_new());
//! assert_eq!(again, tickmark::Accepted::Duplicate);
//!
//! // A worker runs the steps (usually forever: `worker.run(shutdown_token)`).
//! engine.worker(WorkerConfig::default())?.run_until_idle().await?;
//!
//! // The step-status table.
//! let status = engine.event_status("shop", "evt_1").await?.expect("accepted");
//! assert_eq!(status.state(), tickmark::EventState::Done);
//! let greet = status.step("greet").expect("a step of the plan");
//! assert_eq!(greet.state, tickmark::StepState::Done);
//! assert_eq!(greet.idempotency_key, "shop:evt_1:greet");
//! assert_eq!(greet.output.as_ref().unwrap()["said"], "Thanks, Ada");
//! # Ok(())
//! # }
//! ```
//!
//! ## Where things are
//!
//! The root holds what a handler and its application write: [`Engine`],
//! [`Handler`] and [`Handlers`], [`Step`] and [`StepContext`], [`NewEvent`],
//! the [`EventStatus`] (step-status table) an engine reads back, and
//! [`Worker`] with its [`WorkerConfig`]. Around it:
//!
//! | module | what |
//! |---|---|
//! | [`store`] | connecting to SQLite or PostgreSQL; a backend's options; migrating an application's own pool |
//! | [`wait`] | durable waits for another event or a time |
//! | [`flow`] | fleet-wide rate limits, concurrency and debounce per key |
//! | [`inbox`] | the dedup decision's body hash, for events without an id |
//! | [`operator`] | the operator's actions (retry, cancel, skip, mark done by hand) as methods of an engine |
//! | [`receiver`] | the axum webhook receiver; one verifier per provider in `receiver::providers` |
//! | [`serve`] | serving a router within connection and time limits |
//! | [`dashboard`], [`ops`] | the operators' web page, and `GET /metrics` with it |
//! | [`reconcile`] | recovering what a provider gave up on, from its own API |
//! | [`cli`] | the operator's command line, to embed with an application's handlers |
//! | `testing` | the test kit for your own handlers (feature `testing`) |
//!
//! Each module is one of tickmark's crates (`tickmark-receiver`, …), chosen
//! by a feature; docs/architecture.md draws them. The guarantees, and the
//! tests that prove them, are listed in `docs/guarantees.md`.
//!
//! ## Cargo features
//!
//! All but `testing` on by default. An application that embeds only the engine turns the
//! rest off: `tickmark = { version = "0.1", default-features = false,
//! features = ["postgres"] }` builds no HTTP stack, no SQLite and no CLI.
//!
//! | feature | what it adds |
//! |---|---|
//! | `sqlite` | the embedded backend, [`store::sqlite`] (one file, no server) |
//! | `postgres` | the multi-machine backend, [`store::postgres`] |
//! | `receiver` | [`receiver`]: the axum webhook receiver and its providers' verifiers |
//! | `dashboard` | [`dashboard`] and [`ops`]: the operators' pages and `GET /metrics` |
//! | `serve` | [`serve`]: serving a router with connection and time limits (on with `receiver` or `dashboard`) |
//! | `cli` | [`cli`] and the `tickmark` binary |
//! | `reconcile` | [`reconcile`] and `tickmark reconcile`: an HTTPS client (rustls) for the providers' APIs |
//! | `testing` | `tickmark::testing`, the test kit for your own handlers (off by default: a `[dev-dependencies]` feature) |
//! | `otel` | [`otel`]: traces exported over OTLP/HTTP, one trace per event across retries and crashes (off by default) |
//!
//! At least one backend is needed. The engine itself (steps, handlers, the
//! inbox, workers, operator actions, metrics counters) is in every build.

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs` on nightly and every feature on
// (`[package.metadata.docs.rs]` in Cargo.toml). `doc_cfg` labels each
// feature-gated item "Available on crate feature … only"; a feature-gated
// public item also says so itself, for readers of the source:
// `#[cfg_attr(docsrs, doc(cfg(feature = "…")))]` next to its `#[cfg]`, as
// `cli` below. (`doc_auto_cfg` was folded into `doc_cfg` and no longer exists.)
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
compile_error!(
    "tickmark needs a database: enable its `sqlite` feature, its `postgres` feature, or both \
     (both are on by default; with `default-features = false`, add e.g. `features = [\"postgres\"]`)"
);

#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;
#[cfg(feature = "dashboard")]
#[cfg_attr(docsrs, doc(cfg(feature = "dashboard")))]
pub mod dashboard;
mod error;
pub mod flow;
pub mod inbox;
pub mod operator;
#[cfg(feature = "dashboard")]
#[cfg_attr(docsrs, doc(cfg(feature = "dashboard")))]
pub mod ops;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;
#[cfg(feature = "receiver")]
#[cfg_attr(docsrs, doc(cfg(feature = "receiver")))]
pub mod receiver;
#[cfg(feature = "reconcile")]
#[cfg_attr(docsrs, doc(cfg(feature = "reconcile")))]
pub mod reconcile;
#[cfg(feature = "serve")]
#[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
pub mod serve;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod trace;
pub mod wait;

pub use error::Error;
pub use store::{connect, migrate, Backend, StepTransaction, Store, StoreError};
/// Personal data in payloads: encryption at rest, subjects, erasure
/// (docs/privacy.md).
pub use tickmark_core::privacy;
pub use tickmark_core::{
    idempotency_key, output, redact_url, Accepted, Engine, EventStatus, FailureKind, Handler,
    HandlerConfigError, Handlers, Output, Resources, SecretString, Step, StepContext, StepError,
    StepOptions, StepOutputs, StepResult, TerminalExt, Worker, WorkerConfig, WorkerConfigError,
    WorkerStats, ANY,
};
pub use tickmark_driver::store::admin::EventFilter;
pub use tickmark_driver::store::{EventCounts, EventRecord, StepStatus};
pub use tickmark_driver::{Event, EventState, NewEvent, RetryPolicy, StepState};
#[cfg(feature = "receiver")]
#[cfg_attr(docsrs, doc(cfg(feature = "receiver")))]
pub use tickmark_receiver::Receiver;

/// The sqlx this crate is built with, for steps that reach the backend's own
/// connection ([`StepTransaction::postgres`], [`StepTransaction::sqlite`]) with
/// the same version.
#[doc(no_inline)]
pub use sqlx;

/// The shutdown signal [`Worker::run`] takes (and the one the receiver's
/// and the dashboard's servers can share): `tokio_util`'s, re-exported so an
/// application needs no `tokio-util` dependency of its own. Cancel it to let
/// the worker finish its running steps and return.
#[doc(no_inline)]
pub use tokio_util::sync::CancellationToken;
