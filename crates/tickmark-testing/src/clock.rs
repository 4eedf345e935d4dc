//! The fake clock of a SQLite test engine: time stands still until the test
//! moves it, so a wait, a snooze or a retry comes due when the test says.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};

#[cfg(feature = "sqlite")]
use tickmark_driver::store::Clock;

/// A clock that moves only when told ([`TestEngine::advance`](super::TestEngine::advance)).
#[derive(Debug, Clone)]
pub(crate) struct FakeClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl FakeClock {
    /// Stopped at the system's time now.
    #[cfg(feature = "sqlite")]
    pub(crate) fn starting_now() -> Self {
        Self {
            now: Arc::new(Mutex::new(Utc::now())),
        }
    }

    /// The store's clock, reading this one.
    #[cfg(feature = "sqlite")]
    pub(crate) fn store_clock(&self) -> Clock {
        let now = Arc::clone(&self.now);
        Clock::from_fn(move || *now.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn advance(&self, by: Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now.checked_add_signed(by).unwrap_or(*now);
    }
}
