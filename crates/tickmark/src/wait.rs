//! Durable waits: a step that waits for another event (matched by key) or
//! for a time, across restarts. [`Handler::wait`](crate::Handler::wait)
//! takes an [`EventWait`] made by [`WaitFor::event`]; a wait step's output
//! reads back as a [`WaitOutcome`]. The guide is docs/waiting.md.

pub use tickmark_driver::wait::{EventWait, WaitFor, WaitOutcome};
