//! An event's trace context, as stored with the event: the W3C Trace Context
//! headers (`traceparent`, `tracestate`) of the span that accepted it.
//!
//! Every later run of the event (a retry hours later, a takeover by another
//! process, a snooze or a durable wait that resumes days later) starts its
//! spans under this context, so one event is one trace however long it
//! lives. Only the engine's `otel` feature writes and reads it; the store
//! keeps it as two short texts and never looks inside.

/// The longest `tracestate` kept. The W3C recommendation asks vendors to
/// keep at least 512 characters; a longer one is dropped whole (a cut one
/// would name half a vendor's entry).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A `traceparent` (`00-<trace id>-<parent id>-<flags>`), and the
/// `tracestate` that travels with it, checked for shape: version `00`'s
/// 55 characters, lowercase hex, neither id all zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// The context of `traceparent` (and `tracestate`, kept when it is
    /// visible ASCII of at most [`MAX_TRACESTATE_BYTES`]); `None` when the
    /// `traceparent` is not a version-00 one. A sender's header is
    /// untrusted: nothing else in it is read.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = traceparent.trim();
        let parts: Vec<&str> = traceparent.split('-').collect();
        let [version, trace_id, parent_id, flags] = parts.as_slice() else {
            return None;
        };
        let hex = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let zeros = |part: &str| part.bytes().all(|b| b == b'0');
        if *version != "00"
            || !hex(trace_id, 32)
            || !hex(parent_id, 16)
            || !hex(flags, 2)
            || zeros(trace_id)
            || zeros(parent_id)
        {
            return None;
        }
        let tracestate = tracestate
            .map(str::trim)
            .filter(|state| {
                !state.is_empty()
                    && state.len() <= MAX_TRACESTATE_BYTES
                    && state.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_owned);
        Some(Self {
            traceparent: traceparent.to_owned(),
            tracestate,
        })
    }

    /// The context as a store reads it back: its two columns, either NULL.
    pub fn from_columns(traceparent: Option<String>, tracestate: Option<String>) -> Option<Self> {
        Self::parse(&traceparent?, tracestate.as_deref())
    }

    /// The `traceparent` header value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header value, when there is one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lowercase hex digits, what a tracing backend
    /// (Jaeger, Tempo, Honeycomb) looks a trace up by.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_version_00_traceparent_is_read_whole() {
        let context = TraceContext::parse(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.traceparent(), PARENT);
        assert_eq!(context.tracestate(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn what_a_lying_sender_puts_in_the_header_is_refused() {
        let refused = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e47ä6-00f067aa0ba902b7-01",
        ];
        for header in refused {
            assert_eq!(TraceContext::parse(header, None), None, "{header:?}");
        }
    }

    #[test]
    fn a_tracestate_too_long_or_not_text_is_dropped_and_the_parent_kept() {
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE_BYTES);
        for state in [long.as_str(), "a=b\nc=d", "  "] {
            let context = TraceContext::parse(PARENT, Some(state)).unwrap();
            assert_eq!(context.tracestate(), None, "{state:?}");
            assert_eq!(context.traceparent(), PARENT);
        }
    }
}
