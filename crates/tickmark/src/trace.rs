//! An event's trace context (W3C `traceparent` / `tracestate`), stored with
//! it when it is accepted and continued by every run of it. Without the
//! `otel` feature, or while no OpenTelemetry layer records spans, these
//! functions do nothing and nothing is stored.
//!
//! [`current`] is what an outbound call sends: `HttpCall` and the outbox do
//! so themselves.

pub use tickmark_core::trace::{continue_under, current, link_to, recording};
pub use tickmark_driver::trace_context::{TraceContext, MAX_TRACESTATE_BYTES};
