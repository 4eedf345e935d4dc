//! How much one run of one source may do: pages, time, and what a pulled
//! event may hold. A broken or hostile provider API (a page that repeats, a
//! `has_more` that never ends) cannot keep a run, its lease, or the
//! scheduled reconciler's other sources, for ever.

use std::time::Duration;

use tickmark_core::event_limits::DEFAULT_BODY_LIMIT;

/// The most pages one run reads by default: 500 (50,000 events or
/// deliveries in pages of 100).
pub const DEFAULT_MAX_PAGES: u64 = 500;

/// The longest one run lasts by default: 10 minutes.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(10 * 60);

/// A run's caps. Hitting the page or time cap ends the run cleanly: its
/// summary says so (`complete: false` and a note), the cursor stays at what
/// was fully read, and the next run continues from there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLimits {
    /// The most pages (list requests) one run reads ([`DEFAULT_MAX_PAGES`]).
    pub max_pages: u64,
    /// The longest one run lasts, waits included ([`DEFAULT_MAX_DURATION`]).
    pub max_duration: Duration,
    /// The largest pulled event recorded, as JSON bytes: the receiver's body
    /// limit ([`DEFAULT_BODY_LIMIT`], 1 MiB). A larger one is refused
    /// (counted and logged), as the receiver refuses such a delivery.
    pub max_event_bytes: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            max_pages: DEFAULT_MAX_PAGES,
            max_duration: DEFAULT_MAX_DURATION,
            max_event_bytes: DEFAULT_BODY_LIMIT,
        }
    }
}
