//! What a wait waits for, as declared on a handler and stored in its plan.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::flow::FlowKey;

/// What a wait step waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Another accepted event that matches, up to a timeout.
    Event(EventWait),
    /// A time.
    Timer(Timer),
}

/// Starts a wait for an event: `WaitFor::event(source, kind)`.
#[derive(Debug)]
pub struct WaitFor;

impl WaitFor {
    /// Wait for an accepted event of `kind` from `source` (exact names, no
    /// wildcards), matched by [`EventWait::matching`], up to
    /// [`EventWait::timeout`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tickmark::wait::WaitFor;
    /// let paid = WaitFor::event("shopify", "orders/paid")
    ///     .matching(["/shop", "/order/id"])
    ///     .timeout(Duration::from_secs(3 * 24 * 3600));
    /// assert_eq!(paid.kind, "orders/paid");
    /// ```
    pub fn event(source: impl Into<String>, kind: impl Into<String>) -> EventWait {
        EventWait {
            source: source.into(),
            kind: kind.into(),
            theirs: FlowKey::from(Vec::<String>::new()),
            ours: FlowKey::from(Vec::<String>::new()),
            timeout: Duration::ZERO,
            lookback: None,
            on_timeout: OnTimeout::DeadLetter,
        }
    }
}

/// A wait for another accepted event: one of `source` and `kind` whose
/// value at `theirs` equals the waiting event's value at `ours`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventWait {
    /// The awaited event's source.
    pub source: String,
    /// The awaited event's kind.
    pub kind: String,
    /// Where the awaited event carries the key (JSON pointers).
    pub theirs: FlowKey,
    /// Where the waiting event carries it.
    pub ours: FlowKey,
    /// How long to wait from the moment the wait starts.
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    /// How long before the waiting event was accepted a matching event may
    /// have been accepted and still count (`None`: any still in the inbox,
    /// that is within the dedup window `tickmark prune` keeps).
    #[serde(
        rename = "lookback_ms",
        default,
        with = "opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub lookback: Option<Duration>,
    /// What a timeout does; decided when the handler is compiled.
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

impl EventWait {
    /// Match on the same pointers in both events (e.g. `/order/id`, or
    /// `["/shop", "/order/id"]`).
    pub fn matching(self, key: impl Into<FlowKey>) -> Self {
        let key = key.into();
        Self {
            theirs: key.clone(),
            ours: key,
            ..self
        }
    }

    /// Match the awaited event's value at `theirs` with this event's value
    /// at `ours`, when the two payloads keep the key in different places.
    pub fn matching_on(self, theirs: impl Into<FlowKey>, ours: impl Into<FlowKey>) -> Self {
        Self {
            theirs: theirs.into(),
            ours: ours.into(),
            ..self
        }
    }

    /// Give up after `timeout` from the start of the wait.
    pub fn timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// Count matching events accepted up to `lookback` before this event
    /// was (default: any still in the inbox, that is within the dedup
    /// window `tickmark prune` keeps). This is how an `orders/paid` that
    /// arrived before its `orders/create` is found; events accepted after
    /// this one always count.
    pub fn lookback(self, lookback: Duration) -> Self {
        Self {
            lookback: Some(lookback),
            ..self
        }
    }

    /// What is wrong with this wait, if anything (checked at start-up).
    pub fn problem(&self) -> Option<&'static str> {
        if self.theirs.pointers().is_empty() || self.ours.pointers().is_empty() {
            Some("a wait for an event needs matching() or matching_on()")
        } else if self.theirs.pointers().len() != self.ours.pointers().len() {
            Some("matching_on() needs as many pointers on each side")
        } else if self.timeout.is_zero() {
            Some("a wait for an event needs a timeout() above zero")
        } else if self.source == "*" || self.kind == "*" {
            // `*` is `tickmark::ANY`, which matches handlers, not events.
            Some("a wait names one source and one kind, not `*`")
        } else {
            None
        }
    }
}

/// What a wait for an event does when its deadline passes with no match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Dead-letter the event, saying what it waited for: the handler
    /// declared no `if_timed_out` step.
    #[default]
    DeadLetter,
    /// Mark the wait done as timed out and go on: steps `if_matched` are
    /// skipped, steps `if_timed_out` run.
    Continue,
}

/// A wait for a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Timer {
    /// This long after the wait starts.
    #[serde(rename = "after_ms", with = "millis")]
    After(Duration),
    /// The time in the event's payload at this JSON pointer (RFC 3339 text,
    /// or seconds since the epoch).
    Until(String),
}

impl Timer {
    /// When a timer started at `started` fires, for an event with `payload`;
    /// `Err` says why the payload gives no time.
    pub fn fires_at(
        &self,
        started: DateTime<Utc>,
        payload: &serde_json::Value,
    ) -> Result<DateTime<Utc>, String> {
        match self {
            Timer::After(delay) => {
                Ok(started + chrono::Duration::from_std(*delay).unwrap_or(chrono::Duration::MAX))
            }
            Timer::Until(pointer) => match payload.pointer(pointer) {
                Some(serde_json::Value::String(text)) => DateTime::parse_from_rfc3339(text)
                    .map(|time| time.with_timezone(&Utc))
                    .map_err(|error| {
                        format!(
                            "the payload's `{pointer}` ({text:?}) is not an RFC 3339 time: {error}"
                        )
                    }),
                Some(serde_json::Value::Number(secs)) => secs
                    .as_i64()
                    .and_then(|secs| DateTime::from_timestamp(secs, 0))
                    .ok_or_else(|| format!("the payload's `{pointer}` ({secs}) is not a time")),
                _ => Err(format!(
                    "the payload has no time at `{pointer}` (RFC 3339 text or epoch seconds)"
                )),
            },
        }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => super::millis::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_wait_round_trips_through_the_plan_format() {
        let wait = Wait::Event(
            WaitFor::event("shopify", "orders/paid")
                .matching_on("/id", "/order/id")
                .timeout(Duration::from_secs(60)),
        );
        let json = serde_json::to_value(&wait).unwrap();
        assert_eq!(json["event"]["timeout_ms"], 60_000);
        assert_eq!(json["event"]["theirs"], json!(["/id"]));
        assert_eq!(json["event"]["on_timeout"], "dead_letter");
        assert_eq!(serde_json::from_value::<Wait>(json).unwrap(), wait);

        let timer = Wait::Timer(Timer::After(Duration::from_secs(5)));
        let json = serde_json::to_value(&timer).unwrap();
        assert_eq!(json, json!({"timer": {"after_ms": 5000}}));
        assert_eq!(serde_json::from_value::<Wait>(json).unwrap(), timer);
    }

    #[test]
    fn a_wait_without_a_key_or_a_timeout_is_a_problem() {
        let bare = WaitFor::event("shopify", "orders/paid");
        assert!(bare.problem().is_some());
        let keyed = bare.matching("/id");
        assert!(keyed.problem().unwrap().contains("timeout"));
        assert!(keyed.timeout(Duration::from_secs(1)).problem().is_none());
    }

    #[test]
    fn a_timer_reads_its_time_from_the_payload() {
        let started = Utc::now();
        let at = Timer::Until("/remind_at".into());
        let fires = at
            .fires_at(started, &json!({"remind_at": "2030-01-02T03:04:05Z"}))
            .unwrap();
        assert_eq!(fires.to_rfc3339(), "2030-01-02T03:04:05+00:00");
        assert_eq!(
            at.fires_at(started, &json!({"remind_at": 1_900_000_000}))
                .unwrap()
                .timestamp(),
            1_900_000_000
        );
        assert!(at
            .fires_at(started, &json!({}))
            .unwrap_err()
            .contains("/remind_at"));
        let after = Timer::After(Duration::from_secs(10));
        assert_eq!(
            after.fires_at(started, &json!({})).unwrap() - started,
            chrono::Duration::seconds(10)
        );
    }
}
