//! The debounce decision both backends take at accept, inside the
//! transaction that inserts the new event and locks its key's waiting ones:
//! which event of the burst runs, when, and which are superseded.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::DebounceInsert;

/// An event of the key that has not started: still supersedable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    #[doc(hidden)]
    pub seq: i64,
    /// Its sequence for its resource, when the handler skips stale events.
    pub resource_seq: Option<i64>,
    /// When the burst it waits in began (`None` for the event just inserted).
    pub burst_started_at: Option<DateTime<Utc>>,
}

/// What the accept writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coalesced {
    /// The event that runs for the whole burst.
    pub survivor: i64,
    /// When it runs.
    pub due_at: DateTime<Utc>,
    /// When its burst began.
    pub burst_started_at: DateTime<Utc>,
    /// The others, now `superseded` by the survivor.
    pub superseded: Vec<i64>,
}

/// Decide a burst: the event with the newest sequence (then the latest
/// accepted) survives; it runs once the key has been quiet for the window
/// after `now`, but no later than `max_wait` after the burst began, and
/// never before `not_before`.
pub fn coalesce(
    new: Waiting,
    waiting: &[Waiting],
    now: DateTime<Utc>,
    debounce: &DebounceInsert<'_>,
    not_before: Option<DateTime<Utc>>,
) -> Coalesced {
    let all = || waiting.iter().chain(std::iter::once(&new));
    let survivor = all()
        .max_by_key(|event| (event.resource_seq.unwrap_or(i64::MIN), event.seq))
        .map_or(new.seq, |event| event.seq);
    let burst_started_at = all()
        .filter_map(|event| event.burst_started_at)
        .min()
        .map_or(now, |first| first.min(now));
    let quiet = now + chrono_duration(debounce.window);
    let cap = burst_started_at + chrono_duration(debounce.max_wait);
    let due_at = quiet.min(cap).max(not_before.unwrap_or(now));
    Coalesced {
        survivor,
        due_at,
        burst_started_at,
        superseded: all()
            .map(|event| event.seq)
            .filter(|seq| *seq != survivor)
            .collect(),
    }
}

/// Why an event was superseded, as its `last_error` says.
pub fn superseded_note(survivor: i64, key: &str) -> String {
    format!(
        "superseded by event {survivor}: a later event of debounce key `{key}` arrived while \
         this one waited, and runs in its place"
    )
}

fn chrono_duration(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    const DEBOUNCE: DebounceInsert<'static> = DebounceInsert {
        key: "shop:a",
        window: Duration::from_secs(2),
        max_wait: Duration::from_secs(10),
    };

    fn fresh(seq: i64) -> Waiting {
        Waiting {
            seq,
            resource_seq: None,
            burst_started_at: None,
        }
    }

    #[test]
    fn the_first_event_of_a_key_waits_one_window() {
        let decided = coalesce(fresh(1), &[], at(0), &DEBOUNCE, None);
        assert_eq!(decided.survivor, 1);
        assert_eq!(decided.due_at, at(2));
        assert!(decided.superseded.is_empty());
    }

    #[test]
    fn a_later_event_supersedes_the_waiting_one_and_restarts_the_window() {
        let waiting = Waiting {
            burst_started_at: Some(at(0)),
            ..fresh(1)
        };
        let decided = coalesce(fresh(2), &[waiting], at(1), &DEBOUNCE, None);
        assert_eq!(decided.survivor, 2);
        assert_eq!(decided.superseded, vec![1]);
        assert_eq!(decided.due_at, at(3));
        assert_eq!(decided.burst_started_at, at(0));
    }

    #[test]
    fn a_constant_stream_still_runs_after_the_maximum_wait() {
        let waiting = Waiting {
            burst_started_at: Some(at(0)),
            ..fresh(7)
        };
        let decided = coalesce(fresh(8), &[waiting], at(9), &DEBOUNCE, None);
        assert_eq!(
            decided.due_at,
            at(10),
            "capped at the burst's start + max_wait"
        );
    }

    #[test]
    fn the_newest_sequence_survives_whatever_the_arrival_order() {
        let newer = Waiting {
            resource_seq: Some(20),
            burst_started_at: Some(at(0)),
            ..fresh(1)
        };
        let late_older = Waiting {
            resource_seq: Some(10),
            ..fresh(2)
        };
        let decided = coalesce(late_older, &[newer], at(1), &DEBOUNCE, None);
        assert_eq!(decided.survivor, 1);
        assert_eq!(decided.superseded, vec![2]);
    }
}
