//! SQLite keeps times as fixed-width UTC text, `2026-11-30T06:31:34.123Z`:
//! readable in plain SQL, and ordered correctly by text comparison (the same
//! format as `strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`).

use chrono::{DateTime, SecondsFormat, Utc};

use tickmark_driver::store::StoreError;

/// Format a time for storage.
pub fn format_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Parse a stored time.
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|error| StoreError::Corrupt(format!("time `{text}`: {error}")))
}

/// Parse a stored time that may be NULL.
pub fn parse_time_opt(text: Option<String>) -> Result<Option<DateTime<Utc>>, StoreError> {
    text.as_deref().map(parse_time).transpose()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn format_is_fixed_width_and_sorts_as_text() {
        let a = Utc.with_ymd_and_hms(2026, 11, 30, 6, 31, 34).unwrap();
        let b = a + chrono::Duration::milliseconds(5);
        assert_eq!(format_time(a), "2026-11-30T06:31:34.000Z");
        assert_eq!(format_time(b), "2026-11-30T06:31:34.005Z");
        assert!(format_time(a) < format_time(b));
        assert_eq!(parse_time(&format_time(b)).unwrap(), b);
    }
}
