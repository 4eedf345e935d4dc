//! # tickmark-steps
//!
//! Ready-made [`tickmark`] steps: the ones every webhook application ends up
//! writing, written once with the idempotency key passed on and the failure
//! semantics (retryable, terminal, `Retry-After`) worked out.
//!
//! | step | stable name | what it does |
//! |---|---|---|
//! | [`HttpCall`] | `tickmark.http_call` | an HTTP request that sends the step's `Idempotency-Key`; the response is the output |
//! | [`WriteFile`] | `tickmark.write_file` | writes a file named after the event id, atomically; a re-run overwrites |
//! | [`outbox::EnqueueWebhook`] | `tickmark.enqueue_webhook` | puts an outbound webhook in the inbox, once |
//! | [`outbox::DeliverWebhook`] | `tickmark.deliver_webhook` | POSTs it, signed per Standard Webhooks, with the engine's durable retries |
//!
//! Each step is a plain struct whose fields (its configuration) are stored in
//! the event's plan under the stable name above. What must not be stored in a
//! plan — clients, secrets, base directories — is registered once as an
//! engine resource ([`Engine::with_resource`](tickmark::Engine::with_resource)):
//! [`HttpClient`], [`HttpCredentials`], [`OutputDir`],
//! [`outbox::OutboxEndpoints`].
//!
//! Steps that take a JSON value (a request body, a file's content, a webhook
//! payload) say where it comes from with a [`ValueFrom`]: a fixed value, the
//! event payload, an earlier step's output (with a JSON pointer), or a
//! template.
//!
//! ```
//! use tickmark::{Engine, Handler, Handlers};
//! use tickmark_steps::outbox::{self, EnqueueWebhook, OutboxEndpoints};
//! use tickmark_steps::{HttpCall, HttpClient, OutputDir, ValueFrom, WriteFile};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("steps.db").display());
//! let handlers = Handlers::new()
//!     .on(
//!         "shop",
//!         "order.paid",
//!         Handler::new()
//!             // POST the order to the warehouse, with Idempotency-Key: shop:<id>:reserve
//!             .named_step(
//!                 "reserve",
//!                 HttpCall::post("http://warehouse.internal/reservations")
//!                     .body(ValueFrom::event_at("/order")),
//!             )
//!             // Keep the warehouse's answer next to the order: receipts/<id>.json
//!             .step(
//!                 WriteFile::new(ValueFrom::output("reserve", "/body"))
//!                     .subdir("receipts")
//!                     .extension("json"),
//!             )
//!             // Tell the customer's system, signed, with durable retries.
//!             .step(EnqueueWebhook::new(
//!                 "customer",
//!                 "order.reserved",
//!                 ValueFrom::output("reserve", "/body"),
//!             )),
//!     )
//!     .on(outbox::SOURCE, outbox::KIND, outbox::handler());
//!
//! let engine = Engine::new(tickmark::connect(&url).await?, handlers)?
//!     .with_resource(HttpClient::default())
//!     .with_resource(OutputDir::new(dir.path().join("out")))
//!     .with_resource(OutboxEndpoints::new().endpoint(
//!         "customer",
//!         "http://customer.internal/hooks",
//!         "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
//!     )?);
//! # let _ = engine;
//! # Ok(())
//! # }
//! ```
//!
//! ## Cargo features
//!
//! - `rustls` (off by default): `https://` URLs, through rustls with the
//!   `ring` provider and the WebPKI (Mozilla) root certificates. Without it an
//!   `https://` URL is a terminal error that says to enable the feature.
//!
//! The guide is `docs/steps.md`.

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs` on nightly and every feature on
// (`[package.metadata.docs.rs]` in Cargo.toml); `doc_cfg` labels each
// feature-gated item with the feature it needs. A feature-gated public item
// also says so itself: `#[cfg_attr(docsrs, doc(cfg(feature = "…")))]` next to
// its `#[cfg]`. (`rustls` gates no public item today: it changes what
// `HttpClient` can reach, as the list above says.)
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
pub mod http_call;
pub mod http_client;
pub mod outbox;
pub mod shopify_compliance;
#[cfg(test)]
mod test_support;
mod trace_context;
mod value_from;
pub mod write_file;

pub use error::ConfigError;
pub use http_call::{HttpCall, HttpCredentials};
pub use http_client::HttpClient;
pub use value_from::ValueFrom;
pub use write_file::{OutputDir, WriteFile};
