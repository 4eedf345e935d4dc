//! Flow control across the fleet: limits that hold for every worker process
//! on one database, kept in the database itself (docs/flow_control.md).
//!
//! | limit | declared on | decided |
//! |---|---|---|
//! | [`RateLimit`]: a token bucket per key (capacity B, refilling at R per period) | `Handlers::rate_limit`, used by `Handler::rate_limited` | before the step runs: an empty bucket gives the event back until the next token is due, spending no attempt |
//! | concurrency per key: at most N events of a key running at once | `Handler::concurrency_per` | in the claim: an event of a full key is not leased |
//! | debounce per key: a burst of a key's events runs once, for the latest | `Handler::debounce_per` | at accept: the newest waiting event supersedes the older ones |
//!
//! Keys are values read from the event's payload with JSON pointers
//! ([`FlowKey`]).

mod debounce;
mod key;
mod rate_limit;
mod tenant;

pub use debounce::Debounce;
pub use key::scalar_text;
pub use key::FlowKey;
pub use rate_limit::{RateLimit, RateLimitError, RateLimitUse};
pub use tenant::{TenantWeight, WeightError, MAX_WEIGHT};
