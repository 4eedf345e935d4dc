//! Flow control shared by a fleet: rate limits ([`RateLimit`], registered
//! with [`Handlers::rate_limit`](crate::Handlers::rate_limit) and used by
//! [`Handler::rate_limited`](crate::Handler::rate_limited)), concurrency and
//! debounce per key ([`Handler::concurrency_per`](crate::Handler::concurrency_per),
//! [`Handler::debounce_per`](crate::Handler::debounce_per)), each keyed by a
//! [`FlowKey`]: JSON pointers into the payload; fair share across tenants
//! ([`Handler::tenant_key`](crate::Handler::tenant_key),
//! [`Handler::tenant_header`](crate::Handler::tenant_header), weights as
//! [`TenantWeight`]) and priorities as a head start
//! ([`Handler::head_start`](crate::Handler::head_start)). The guide is
//! docs/flow_control.md.

pub use tickmark_core::handler::MAX_HEAD_START;
pub use tickmark_core::tenant::MAX_TENANT_BYTES;
pub use tickmark_driver::flow::{FlowKey, RateLimit, RateLimitError, TenantWeight, WeightError};
