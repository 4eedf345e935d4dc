//! One trace per event, however long it lives: the W3C trace context of the
//! span that accepted an event is stored with it
//! ([`TraceContext`]), and every later run of the event (a retry hours
//! later, a takeover by another process after a crash, a snooze, a durable
//! wait that resumes days later) starts its span under that context. A
//! duplicate delivery's span links to the event's trace; outbound calls
//! carry the current context in `traceparent`.
//!
//! With the `otel` feature the spans are `tracing` spans bridged to
//! OpenTelemetry by `tracing-opentelemetry` (the exporter is set up by
//! `tickmark::otel`); the W3C headers are read and written by the SDK's
//! `TraceContextPropagator`. Without it, and while no OpenTelemetry layer
//! records the spans, every function here does nothing: nothing is stored,
//! nothing is sent.

use tickmark_driver::trace_context::TraceContext;

/// The trace context of the current span, when an OpenTelemetry layer
/// records it: what an event accepted now stores, and what an outbound
/// call sends as `traceparent` / `tracestate`.
pub fn current() -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    {
        otel::context_of(&tracing::Span::current())
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}

/// Start `span` under `parent` (an event's stored context, or a sender's
/// `traceparent`): the span joins that trace as its child. Call it before
/// the span is first entered; a span already started keeps its parent.
pub fn continue_under(span: &tracing::Span, parent: Option<&TraceContext>) {
    #[cfg(feature = "otel")]
    if let Some(parent) = parent {
        otel::set_parent(span, parent);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, parent);
}

/// Link `span` to the trace of `other` (a duplicate delivery to the trace
/// of the event it repeats): the span stays in its own trace.
pub fn link_to(span: &tracing::Span, other: &TraceContext) {
    #[cfg(feature = "otel")]
    otel::add_link(span, other);
    #[cfg(not(feature = "otel"))]
    let _ = (span, other);
}

/// Whether spans are being exported here: an OpenTelemetry layer records
/// the current span. Work done only for traces (looking up the trace of
/// the event a duplicate repeats) is skipped when not.
pub fn recording() -> bool {
    current().is_some()
}

#[cfg(feature = "otel")]
mod otel {
    use std::collections::HashMap;

    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    const TRACEPARENT: &str = "traceparent";
    const TRACESTATE: &str = "tracestate";

    pub(super) fn context_of(span: &tracing::Span) -> Option<TraceContext> {
        if span.is_disabled() {
            return None;
        }
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&context, &mut carrier);
        TraceContext::parse(
            carrier.get(TRACEPARENT)?,
            carrier.get(TRACESTATE).map(String::as_str),
        )
    }

    fn extract(context: &TraceContext) -> opentelemetry::Context {
        let mut carrier =
            HashMap::from([(TRACEPARENT.to_owned(), context.traceparent().to_owned())]);
        if let Some(state) = context.tracestate() {
            carrier.insert(TRACESTATE.to_owned(), state.to_owned());
        }
        TraceContextPropagator::new().extract(&carrier)
    }

    pub(super) fn set_parent(span: &tracing::Span, parent: &TraceContext) {
        if span.is_disabled() {
            return;
        }
        // Refused only when no OpenTelemetry layer records the span, or it
        // already started: either way it keeps the parent it has.
        if let Err(error) = span.set_parent(extract(parent)) {
            tracing::trace!(%error, "span kept its own parent");
        }
    }

    pub(super) fn add_link(span: &tracing::Span, other: &TraceContext) {
        if span.is_disabled() {
            return;
        }
        let linked = extract(other).span().span_context().clone();
        if linked.is_valid() {
            span.add_link(linked);
        }
    }
}
