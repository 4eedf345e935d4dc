//! Serving a router on the internet within connection and time limits: the
//! accept loop the receiver and the dashboard share (the `tickmark-serve`
//! crate). [`Limits::default`] is what to run; each field says its default.

pub use tickmark_serve::{bind, serve, Limits};
