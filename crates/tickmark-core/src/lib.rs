//! # tickmark-core: the engine, without HTTP and without SQL
//!
//! **Not for users directly.** Add [`tickmark`](https://docs.rs/tickmark):
//! it re-exports what an application writes against (`Engine`, `Step`,
//! `Handler`, …) and chooses the backends and the outer parts by its features.
//!
//! This crate is the engine core: steps and what a running step sees, plans
//! and handlers, accepting an event (the dedup decision), leases and the
//! heartbeat, the workers that claim and run events, the operator's actions,
//! and the [`Engine`] that ties them together. It talks to a database only
//! through `tickmark-driver`'s `Store` trait and knows no dialect; it serves
//! nothing. The outer crates (receiver, dashboard, reconcile, CLI, test kit)
//! build on it. Modules marked hidden are shared with those crates and are
//! outside semver.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub mod claim;
pub mod context;
mod engine;
#[doc(hidden)]
pub mod event_limits;
mod event_status;
pub mod handler;
mod idempotency;
pub mod inbox;
pub mod metrics;
pub mod operator;
// The stored plan's encoding: internal, outside semver. Public for the fuzz
// targets (fuzz/), which decode hostile plans; the one item users need is
// `StepOptions`, re-exported below.
#[doc(hidden)]
pub mod plan;
pub mod privacy;
mod redact;
#[doc(hidden)]
pub mod replay_key;
mod resources;
pub mod runner;
mod secret;
pub mod step;
pub mod tenant;
pub mod trace;

pub use context::{Output, StepContext, StepOutputs};
pub use engine::Engine;
pub use event_status::EventStatus;
pub use handler::{Handler, HandlerConfigError, Handlers, ANY};
pub use idempotency::idempotency_key;
pub use inbox::Accepted;
pub use metrics::Metrics;
pub use plan::StepOptions;
pub use redact::redact_url;
pub use resources::Resources;
pub use runner::{Worker, WorkerConfig, WorkerConfigError, WorkerStats};
pub use secret::SecretString;
pub use step::{output, FailureKind, Step, StepError, StepResult, TerminalExt};
