//! Times as the CLI prints them: UTC to the second, with how long ago (or how
//! soon) when that helps at 3 a.m.

use chrono::{DateTime, Utc};

use super::duration::human;

/// `2026-11-30T06:31:34Z`.
pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `3m 2s ago`, `in 40s`, or `now`.
pub(crate) fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let delta = at - now;
    if delta.num_seconds() == 0 {
        return "now".to_owned();
    }
    match (now - at).to_std() {
        Ok(ago) => format!("{} ago", human(ago)),
        Err(_) => format!("in {}", human(delta.to_std().unwrap_or_default())),
    }
}

/// `2026-11-30T06:31:34Z (3m 2s ago)`.
pub(crate) fn time_and_relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ({})", time(at), relative(at, now))
}

/// An optional time, blank when absent.
pub(crate) fn time_opt(at: Option<DateTime<Utc>>) -> String {
    at.map(time).unwrap_or_default()
}

/// How long from `start` to `end`, blank unless both are known.
pub(crate) fn took(start: Option<DateTime<Utc>>, end: Option<DateTime<Utc>>) -> String {
    match (start, end) {
        (Some(start), Some(end)) => (end - start).to_std().map(human).unwrap_or_default(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn times_read_in_utc_with_their_distance() {
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 6, 31, 34).unwrap();
        let before = now - chrono::Duration::seconds(182);
        assert_eq!(time(now), "2026-11-30T06:31:34Z");
        assert_eq!(relative(before, now), "3m 2s ago");
        assert_eq!(relative(now + chrono::Duration::seconds(40), now), "in 40s");
        assert_eq!(relative(now, now), "now");
        assert_eq!(took(Some(before), Some(now)), "3m 2s");
        assert_eq!(took(None, Some(now)), "");
    }
}
