//! Debounce per key: a burst of events of one key runs its handler once,
//! for the latest, after the burst has been quiet for a window.

use std::time::Duration;

use super::key::FlowKey;

/// How a handler coalesces bursts (`Handler::debounce_per`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    /// Where the key is in the payload (namespaced by source).
    pub key: FlowKey,
    /// Run once the key has been quiet this long.
    pub window: Duration,
    /// But never later than this after the first event of the burst.
    pub max_wait: Duration,
}
