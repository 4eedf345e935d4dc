//! The wait decision both backends take inside the transaction that holds
//! the wait's key and the leased event's row: matched, timed out, or wait on.

use chrono::{DateTime, Utc};

use super::{AfterFailure, MarkDone, MarkFailed, WaitDeadline, WaitStep};
use crate::wait::{OnTimeout, WaitOutcome, WaitOutput};

/// What the transaction writes.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitDecision {
    /// Mark the wait done with this output, and go on.
    Done {
        #[doc(hidden)]
        output: serde_json::Value,
        #[doc(hidden)]
        outcome: Option<WaitOutcome>,
    },
    /// The wait timed out and dead-letters the event.
    Dead,
    /// Give the event back until `until`, waiting since `since`.
    Wait {
        #[doc(hidden)]
        since: DateTime<Utc>,
        #[doc(hidden)]
        until: DateTime<Utc>,
    },
}

/// Decide a wait at `now`: a match found in the inbox settles it whatever
/// the time; else the deadline (kept from when the wait began, `since`,
/// else computed now) settles it as a timeout once passed.
pub fn decide(
    wait: &WaitStep<'_>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    matched: Option<(i64, String)>,
) -> WaitDecision {
    if let Some((event_seq, event_id)) = matched {
        return WaitDecision::Done {
            output: WaitOutput::matched(event_seq, &event_id),
            outcome: Some(WaitOutcome::Matched),
        };
    }
    let since = since.unwrap_or(now);
    let until = until.unwrap_or_else(|| match wait.deadline {
        WaitDeadline::After(delay) => {
            since + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)
        }
        WaitDeadline::At(at) => at,
    });
    if now < until {
        return WaitDecision::Wait { since, until };
    }
    match (wait.key, wait.on_timeout) {
        (None, _) => WaitDecision::Done {
            output: WaitOutput::slept(until),
            outcome: None,
        },
        (Some(_), OnTimeout::Continue) => WaitDecision::Done {
            output: WaitOutput::timed_out(until),
            outcome: Some(WaitOutcome::TimedOut),
        },
        (Some(_), OnTimeout::DeadLetter) => WaitDecision::Dead,
    }
}

impl WaitStep<'_> {
    /// The mark that settles this wait done with `output_json`, timed from
    /// when it began (`since`; `now` if it never waited) to `now`.
    pub fn done_mark<'m>(
        &'m self,
        output_json: &'m str,
        since: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> MarkDone<'m> {
        MarkDone {
            lease: self.lease,
            position: self.position,
            step: self.step,
            attempt: self.attempt,
            started_at: since.unwrap_or(now),
            finished_at: now,
            output_json,
            skipped: false,
        }
    }

    /// The mark that dead-letters the event whose wait timed out.
    pub fn dead_mark(&self, since: Option<DateTime<Utc>>, now: DateTime<Utc>) -> MarkFailed<'_> {
        MarkFailed {
            lease: self.lease,
            position: self.position,
            step: self.step,
            attempt: self.attempt,
            started_at: since.unwrap_or(now),
            finished_at: now,
            error: self.timeout_error,
            then: AfterFailure::Dead,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::Lease;

    fn wait(key: Option<&'static str>, on_timeout: OnTimeout) -> WaitStep<'static> {
        WaitStep {
            lease: Lease {
                event_seq: 1,
                token: 1,
            },
            position: 1,
            step: "paid",
            attempt: 1,
            key,
            lookback: None,
            deadline: WaitDeadline::After(Duration::from_secs(60)),
            on_timeout,
            waiting_note: "waiting",
            timeout_error: "timed out",
        }
    }

    #[test]
    fn a_match_settles_the_wait_even_after_the_deadline() {
        let now = Utc::now();
        let long_ago = now - chrono::Duration::hours(1);
        let decided = decide(
            &wait(Some("k"), OnTimeout::DeadLetter),
            Some(long_ago),
            Some(long_ago),
            now,
            Some((7, "p-7".into())),
        );
        assert_eq!(
            decided,
            WaitDecision::Done {
                output: WaitOutput::matched(7, "p-7"),
                outcome: Some(WaitOutcome::Matched)
            }
        );
    }

    #[test]
    fn the_first_start_sets_the_deadline_and_later_ones_keep_it() {
        let now = Utc::now();
        let first = decide(&wait(Some("k"), OnTimeout::Continue), None, None, now, None);
        assert_eq!(
            first,
            WaitDecision::Wait {
                since: now,
                until: now + chrono::Duration::seconds(60)
            }
        );
        let later = now + chrono::Duration::seconds(30);
        let again = decide(
            &wait(Some("k"), OnTimeout::Continue),
            Some(now),
            Some(now + chrono::Duration::seconds(60)),
            later,
            None,
        );
        assert_eq!(first, again);
    }

    #[test]
    fn a_passed_deadline_times_out_as_the_plan_says() {
        let now = Utc::now();
        let past = Some(now - chrono::Duration::seconds(1));
        let go_on = decide(&wait(Some("k"), OnTimeout::Continue), past, past, now, None);
        assert!(
            matches!(
                go_on,
                WaitDecision::Done {
                    outcome: Some(WaitOutcome::TimedOut),
                    ..
                }
            ),
            "{go_on:?}"
        );
        let dead = decide(
            &wait(Some("k"), OnTimeout::DeadLetter),
            past,
            past,
            now,
            None,
        );
        assert_eq!(dead, WaitDecision::Dead);
        let timer = decide(&wait(None, OnTimeout::DeadLetter), past, past, now, None);
        assert!(
            matches!(timer, WaitDecision::Done { outcome: None, .. }),
            "{timer:?}"
        );
    }
}
