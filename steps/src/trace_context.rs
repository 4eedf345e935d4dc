//! Outbound calls carry the event's trace: the W3C `traceparent` and
//! `tracestate` of the running step attempt (docs/observability.md), so the
//! service called continues the trace. Only while traces are exported (the
//! `tickmark` crate's `otel` feature, a collector configured); otherwise
//! nothing is added.

use http::{HeaderMap, HeaderName, HeaderValue};

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Add the current span's trace context to `headers`, unless the step set
/// its own `traceparent`.
pub(crate) fn send_trace_context(headers: &mut HeaderMap) {
    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let Some(context) = tickmark::trace::current() else {
        return;
    };
    // Checked for shape when read (visible ASCII): always a header value.
    if let Ok(value) = HeaderValue::from_str(context.traceparent()) {
        headers.insert(TRACEPARENT, value);
    }
    if let Some(Ok(value)) = context.tracestate().map(HeaderValue::from_str) {
        headers.insert(TRACESTATE, value);
    }
}
