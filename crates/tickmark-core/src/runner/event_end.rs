//! How one event's run ended, for the worker that ran it.

/// How an event's run ended (for this worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventEnd {
    /// Every step is done.
    Done,
    /// A step failed; its retry is scheduled.
    RetryScheduled,
    /// Dead-lettered.
    Dead,
    /// Parked on a plan this build cannot run.
    Parked,
    /// Recorded as stale: not newer than its resource's last applied event.
    Stale,
    /// Its step asked to run again later.
    Snoozed,
    /// Its step's rate-limit bucket was empty: it waits for the next token.
    Throttled,
    /// Its wait step waits (for another event, or a time), holding nothing.
    Waiting,
    /// Given back on shutdown.
    Released,
    /// The lease was taken over or expired: this worker changed nothing more.
    LeaseLost,
    /// The store kept failing; the lease will expire and another claim resumes.
    Abandoned,
}

impl EventEnd {
    /// How a step attempt that ended the run this way is named on its span
    /// (`outcome`): `done` for a step marked done that did not end it.
    pub fn name(self) -> &'static str {
        match self {
            EventEnd::Done => "done",
            EventEnd::RetryScheduled => "retry_scheduled",
            EventEnd::Dead => "dead",
            EventEnd::Parked => "parked",
            EventEnd::Stale => "stale",
            EventEnd::Snoozed => "snoozed",
            EventEnd::Throttled => "throttled",
            EventEnd::Waiting => "waiting",
            EventEnd::Released => "released",
            EventEnd::LeaseLost => "lease_lost",
            EventEnd::Abandoned => "abandoned",
        }
    }
}
