//! The operator's actions on events — retry, cancel, skip, mark done by hand,
//! re-plan ignored events after a deploy adds their handler —
//! and the rules they follow: which action each event state allows, the words
//! an operator reads when one is refused, and what goes into the audit trail.
//!
//! The rules decide; the store enforces. Each action hands its decision to
//! [`Admin::event_transition`](tickmark_driver::store::admin::Admin::event_transition),
//! which reads the event locked, asks the decision, and applies it with an
//! `UPDATE` that filters on the states the transition allows and bumps the
//! fencing token, writing the audit row in the same transaction. The actions
//! are methods of an [`Engine`](crate::Engine) through [`Operations`]:
//!
//! ```no_run
//! # async fn demo(engine: &tickmark::Engine) -> Result<(), tickmark::operator::AdminError> {
//! use tickmark::operator::{Actor, Operations};
//!
//! let actor = Actor { who: "ops@example", reason: Some("customer asked") };
//! engine.event_cancel(42, actor).await?;
//! # Ok(())
//! # }
//! ```

mod actions;
mod error;
pub mod replan;
mod request;
mod rules;

pub use actions::Operations;
pub use error::AdminError;
pub use replan::{ReplanIgnored, ReplanReport};
pub use request::{Actor, RetryRequest};
