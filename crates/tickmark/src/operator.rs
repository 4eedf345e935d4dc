//! The operator's actions (retry, cancel, skip, mark done by hand, feed or
//! time out a wait, re-plan ignored events) and the rules they follow. Each
//! is one fenced, audited transition; a refused one changes nothing and says
//! why. They are methods of an [`Engine`](crate::Engine) through
//! [`Operations`]:
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

pub use tickmark_core::operator::{
    Actor, AdminError, Operations, ReplanIgnored, ReplanReport, RetryRequest,
};
