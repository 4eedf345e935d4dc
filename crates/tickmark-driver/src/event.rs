//! Events and the states of events and steps, mirrored in the SQL schema.
//!
//! `docs/state_machine.md` draws the machine; each variant here says who moves a
//! row out of it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::dedup_key;

/// One accepted delivery's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The engine's own row number for the event (stable, unique per database).
    pub seq: i64,
    /// Where the event came from (`stripe`, `github`, …).
    pub source: String,
    /// The dedup key: the provider's event id, or `sha256:<hex>` of the raw body.
    pub id: String,
    /// The event type (`invoice.payment_succeeded`, `push`, …).
    pub kind: String,
    /// The delivery's body as JSON.
    pub payload: serde_json::Value,
    /// When the inbox accepted it.
    pub received_at: DateTime<Utc>,
}

/// An event about to be accepted into the inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Where the event came from.
    pub source: String,
    /// The dedup key (see [`NewEvent::with_id`] and [`NewEvent::from_body`]).
    pub dedup_key: String,
    /// The event type, which picks the handler.
    pub kind: String,
    /// The body as JSON.
    pub payload: serde_json::Value,
    /// Run not before this time (`None`: at once).
    pub not_before: Option<DateTime<Utc>>,
    /// A second dedup key, for sources whose signature does not cover the
    /// id: derived from what it does cover (the receiver's providers set it).
    /// The inbox refuses an event whose (source, replay key) it already has,
    /// as it refuses one whose (source, dedup key) it has. `None`: the dedup
    /// key alone decides.
    pub replay_key: Option<String>,
    /// The tenant whose fair share the event is claimed from, when the
    /// caller knows it (the receiver, from a handler's tenant header);
    /// `None`: the handler's tenant key finds it in the payload, if it has
    /// one. Only an event a handler takes is claimed for a tenant.
    pub tenant: Option<String>,
}

impl NewEvent {
    /// An event whose provider gives it an id: the dedup key is that id.
    pub fn with_id(
        source: impl Into<String>,
        id: impl Into<String>,
        kind: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            source: source.into(),
            dedup_key: id.into(),
            kind: kind.into(),
            payload,
            not_before: None,
            replay_key: None,
            tenant: None,
        }
    }

    /// An event with no provider id: the dedup key is `sha256:` of the raw body,
    /// so a byte-identical redelivery is a duplicate.
    pub fn from_body(
        source: impl Into<String>,
        kind: impl Into<String>,
        raw_body: &[u8],
        payload: serde_json::Value,
    ) -> Self {
        Self {
            source: source.into(),
            dedup_key: dedup_key::body_hash(raw_body),
            kind: kind.into(),
            payload,
            not_before: None,
            replay_key: None,
            tenant: None,
        }
    }

    /// Deduplicate on `key` too (see [`NewEvent::replay_key`]).
    pub fn with_replay_key(mut self, key: impl Into<String>) -> Self {
        self.replay_key = Some(key.into());
        self
    }

    /// Claim the event from `tenant`'s fair share (see [`NewEvent::tenant`]).
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Delay the event: accepted now, run not before `at`.
    pub fn not_before(mut self, at: DateTime<Utc>) -> Self {
        self.not_before = Some(at);
        self
    }
}

/// Where an event is in its life. Stored as text in `tickmark_events.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    /// Waiting for a worker, at once or at its retry time (`due_at`).
    /// Left by a claim.
    Pending,
    /// Leased by a worker until `due_at`. Left by a mark (done, failed, dead),
    /// a park, a release on shutdown, or a claim that takes over an expired lease.
    Running,
    /// Every step marked done. Final, unless an operator retries it.
    Done,
    /// A step failed terminally or ran out of attempts. Left only by an operator.
    Dead,
    /// The stored plan names a step this build does not know. Left only by an
    /// operator, after deploying a build that knows it.
    Parked,
    /// No handler was registered for its (source, kind) when accepted.
    /// Recorded so that redeliveries are duplicates. Final.
    Ignored,
    /// Cancelled by an operator. Final.
    Cancelled,
    /// Skipped as stale: its sequence was not newer than the last one applied
    /// for its resource (docs/ordering.md). Recorded, never applied. Final.
    Stale,
    /// Coalesced by debounce: a later event of its key took its place while
    /// it waited (`superseded_by` names it; docs/flow_control.md). Recorded,
    /// never run. Final.
    Superseded,
}

impl EventState {
    /// Every state, in lifecycle order.
    pub const ALL: [EventState; 9] = [
        EventState::Pending,
        EventState::Running,
        EventState::Done,
        EventState::Dead,
        EventState::Parked,
        EventState::Ignored,
        EventState::Cancelled,
        EventState::Stale,
        EventState::Superseded,
    ];

    /// The state's name as stored in SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::Running => "running",
            EventState::Done => "done",
            EventState::Dead => "dead",
            EventState::Parked => "parked",
            EventState::Ignored => "ignored",
            EventState::Cancelled => "cancelled",
            EventState::Stale => "stale",
            EventState::Superseded => "superseded",
        }
    }

    /// Whether a worker may still claim the event.
    pub fn is_active(self) -> bool {
        matches!(self, EventState::Pending | EventState::Running)
    }
}

/// The state of one step of one event, as the step-status view derives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not started yet.
    Pending,
    /// Running under a live lease.
    Running,
    /// Its worker died or lost the lease before marking it: the outcome is
    /// unknown and it runs again with the same idempotency key. Derived from an
    /// expired lease, not written.
    Interrupted,
    /// Failed; a retry is scheduled at `retry_at`.
    Retrying,
    /// The step asked to be run again later, without spending an attempt;
    /// it runs again at `retry_at`.
    Snoozed,
    /// Its fleet-wide rate limit's bucket was empty: it waits, without
    /// spending an attempt, until `retry_at`, when a token is due for it
    /// (`last_error` names the limit and the key).
    Throttled,
    /// A wait step waiting, holding nothing, for another accepted event that
    /// matches (or for a time) until `retry_at`, its deadline; `last_error`
    /// says what it waits for.
    Waiting,
    /// Marked done, with its output.
    Done,
    /// Failed terminally or ran out of attempts: the event is dead.
    Dead,
    /// Skipped by an operator, or on the branch of a wait's outcome that
    /// was not taken.
    Skipped,
    /// The event is parked on an unknown step name.
    Parked,
    /// The event was cancelled before this step ran.
    Cancelled,
    /// The event was skipped as stale before this step ran.
    Stale,
    /// The event was coalesced into a later one (debounce) before this step ran.
    Superseded,
    /// The event ended (dead, parked, cancelled) before reaching this step.
    NotRun,
}

impl StepState {
    /// The state's name as the view spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Running => "running",
            StepState::Interrupted => "interrupted",
            StepState::Retrying => "retrying",
            StepState::Snoozed => "snoozed",
            StepState::Throttled => "throttled",
            StepState::Waiting => "waiting",
            StepState::Done => "done",
            StepState::Dead => "dead",
            StepState::Skipped => "skipped",
            StepState::Parked => "parked",
            StepState::Cancelled => "cancelled",
            StepState::Stale => "stale",
            StepState::Superseded => "superseded",
            StepState::NotRun => "not_run",
        }
    }
}

/// A state name that tickmark does not know (a newer schema, or a typo).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state `{0}`")]
pub struct UnknownState(pub String);

impl FromStr for EventState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

impl FromStr for StepState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use StepState::*;
        [
            Pending,
            Running,
            Interrupted,
            Retrying,
            Snoozed,
            Throttled,
            Waiting,
            Done,
            Dead,
            Skipped,
            Parked,
            Cancelled,
            Stale,
            Superseded,
            NotRun,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
        .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

impl fmt::Display for EventState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl fmt::Display for StepState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_sql_names() {
        for state in EventState::ALL {
            assert_eq!(state.as_str().parse::<EventState>(), Ok(state));
        }
        assert_eq!(
            "interrupted".parse::<StepState>(),
            Ok(StepState::Interrupted)
        );
        assert!("exploded".parse::<EventState>().is_err());
    }

    #[test]
    fn an_event_without_id_is_keyed_by_its_body() {
        let a = NewEvent::from_body("twilio", "message", b"Body=hi", serde_json::json!({}));
        let b = NewEvent::from_body("twilio", "message", b"Body=hi", serde_json::json!({}));
        assert_eq!(a.dedup_key, b.dedup_key);
        assert!(a.dedup_key.starts_with("sha256:"));
    }
}

/// The inbox's answer to a delivery: the dedup decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Accepted {
    /// First delivery: recorded, and its handler's steps will run.
    New {
        /// The event's row number.
        seq: i64,
    },
    /// First delivery of a (source, kind) with no handler: recorded as ignored,
    /// so redeliveries are duplicates and the provider can stop retrying.
    Ignored {
        /// The event's row number.
        seq: i64,
    },
    /// Already accepted earlier: nothing was written, nothing will run again.
    Duplicate,
}

impl Accepted {
    /// Whether this delivery was the first.
    pub fn is_new(&self) -> bool {
        !matches!(self, Accepted::Duplicate)
    }
}
