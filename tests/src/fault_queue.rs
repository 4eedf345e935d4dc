//! The faults a loopback provider fake answers its next requests with, in
//! the order a test queued them (`fail_next`, `rate_limit_next`): one queue
//! shape for the Stripe, GitHub and Shopify fakes, each with its own kinds
//! of fault.

use std::collections::VecDeque;

/// Faults still to answer, first queued first served.
#[derive(Debug)]
pub struct FaultQueue<F> {
    queue: VecDeque<F>,
}

impl<F> Default for FaultQueue<F> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
        }
    }
}

impl<F: Clone> FaultQueue<F> {
    /// Queue `fault` for the next `n` requests, after those already queued.
    pub fn push(&mut self, n: usize, fault: F) {
        self.queue.extend(std::iter::repeat_n(fault, n));
    }

    /// Drop every fault still queued: the provider is healthy again.
    pub fn clear(&mut self) {
        self.queue.clear();
    }

    /// The fault for this request, if one is queued.
    pub fn take_next(&mut self) -> Option<F> {
        self.queue.pop_front()
    }
}
