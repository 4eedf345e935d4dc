//! The operations router: `GET /metrics` and, when given one, the
//! [`Dashboard`](crate::dashboard::Dashboard)'s pages, to serve on a private
//! address beside the receiver.

pub use tickmark_dashboard::ops::router;
