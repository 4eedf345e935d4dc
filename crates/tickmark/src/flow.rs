//! Flow control shared by a fleet: rate limits ([`RateLimit`], registered
//! with [`Handlers::rate_limit`](crate::Handlers::rate_limit) and used by
//! [`Handler::rate_limited`](crate::Handler::rate_limited)), concurrency and
//! debounce per key ([`Handler::concurrency_per`](crate::Handler::concurrency_per),
//! [`Handler::debounce_per`](crate::Handler::debounce_per)), each keyed by a
//! [`FlowKey`]: JSON pointers into the payload. The guide is
//! docs/flow_control.md.

pub use tickmark_driver::flow::{FlowKey, RateLimit, RateLimitError, TenantWeight, WeightError};
