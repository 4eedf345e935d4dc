//! The operators' web page: overview, event list, step-status table, retry
//! button (the `tickmark-dashboard` crate). Serve it with
//! [`ops::router`](crate::ops::router) on a private address. The guide is
//! docs/dashboard.md.

pub use tickmark_dashboard::{Dashboard, FailureLimits, StartupWarning};
