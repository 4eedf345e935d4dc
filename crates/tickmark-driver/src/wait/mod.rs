//! Durable waits (docs/long_handlers.md): a step that waits for another
//! accepted event, or for a time, for as long as days, holding nothing.
//!
//! | wait | declared with | settles |
//! |---|---|---|
//! | for an event: a later (or recent) accepted event of a source and kind whose key equals this event's | `Handler::wait` with [`WaitFor::event`] | matched (its output names the event) or timed out |
//! | for a time: a duration, or a time read from the payload | `Handler::sleep`, `Handler::sleep_until` | when the time comes |
//!
//! A waiting event is an ordinary pending event whose due time is its
//! deadline: it holds no lease and no worker slot, and no worker polls it.
//! The accept of a matching event makes it due at once, in the accept's own
//! transaction. Whether it matched or timed out is decided once, in one
//! transaction that looks the match up in the inbox, on both backends.
//!
//! What a timeout means is declared in the plan: steps marked
//! `Handler::if_matched` or
//! `Handler::if_timed_out` form the two
//! branches (the branch not taken is recorded `skipped`); a wait with no
//! `if_timed_out` step dead-letters the event on timeout.

mod branch;
mod match_key;
mod outcome;
mod spec;

pub use branch::Branch;
pub use match_key::match_key;
pub use outcome::{WaitOutcome, WaitOutput};
pub use spec::{EventWait, OnTimeout, Timer, Wait, WaitFor};
