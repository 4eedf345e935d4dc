//! The wall clock a store reads. The SQLite store keeps times as the
//! process's UTC (PostgreSQL reads its own `now()`), so a simulation that
//! controls time gives the store its clock; everything else uses the system's.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// Where a store reads "now": the system clock unless told otherwise.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use tickmark::store::sqlite::Clock;
///
/// let fixed = Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap();
/// let clock = Clock::from_fn(move || fixed);
/// assert_eq!(clock.now(), fixed);
/// assert!(Clock::system().now() > fixed - chrono::Duration::days(36500));
/// ```
#[derive(Clone, Default)]
pub struct Clock {
    read: Option<Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>>,
}

impl Clock {
    /// The system clock (`Utc::now()`).
    pub fn system() -> Self {
        Self::default()
    }

    /// A clock that reads `now` (a simulated or a fixed time).
    pub fn from_fn(now: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        Self {
            read: Some(Arc::new(now)),
        }
    }

    /// The time now.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.read {
            Some(read) => read(),
            None => Utc::now(),
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.read {
            Some(_) => "Clock(given)",
            None => "Clock(system)",
        })
    }
}
