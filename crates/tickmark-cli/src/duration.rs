//! Durations as operators type and read them: `90s`, `15m`, `4h`, `3d`, `1w`,
//! and sums such as `1h30m`.

use std::time::Duration;

/// The units [`human`] prints, largest first.
const UNITS: [(&str, u64); 5] = [
    ("w", 7 * 24 * 3600),
    ("d", 24 * 3600),
    ("h", 3600),
    ("m", 60),
    ("s", 1),
];

/// The longest duration accepted: 100 years, far past any retention.
const MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

const HINT: &str = "write a number and a unit: 90s, 15m, 4h, 3d, 1w (or a sum: 1h30m)";

/// Parse `90s`, `15m`, `4h`, `3d`, `1w` or a sum like `1d12h` (clap value
/// parser). `humantime` reads it (so `1h 30m`, `2days` and `500ms` work
/// too); whole numbers only, and at most 100 years.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration; {HINT}"));
    }
    if !text.starts_with(|c: char| c.is_ascii_digit()) || text.contains('.') {
        return Err(format!("`{text}` is not a duration; {HINT}"));
    }
    let duration = humantime::parse_duration(text).map_err(|error| match error {
        humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
            format!("`{text}` has no unit; {HINT}")
        }
        humantime::DurationError::UnknownUnit { unit, .. } => {
            format!("unknown unit `{unit}` in `{text}`; {HINT}")
        }
        humantime::DurationError::NumberOverflow => format!("`{text}` is too long a duration"),
        _ => format!("`{text}` is not a duration; {HINT}"),
    })?;
    if duration > MAX {
        return Err(format!("`{text}` is longer than 100 years"));
    }
    Ok(duration)
}

/// A duration for people: its two largest units (`3d 4h`, `15m 10s`, `42s`, `850ms`).
///
/// Hand-written: `humantime::format_duration` prints every unit down to the
/// nanosecond (`3days 4h 5s 120ms`), where an operator wants two.
pub(crate) fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds == 0 {
        return format!("{}ms", duration.as_millis());
    }
    let mut parts = Vec::new();
    let mut rest = seconds;
    for (name, size) in UNITS {
        if rest >= size {
            parts.push(format!("{}{name}", rest / size));
            rest %= size;
        }
        if parts.len() == 2 || (rest == 0 && !parts.is_empty()) {
            break;
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit_and_sums() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("4h"), Ok(Duration::from_secs(4 * 3600)));
        assert_eq!(parse("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert_eq!(parse("1w"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse(" 2d12h "), Ok(Duration::from_secs(216_000)));
    }

    #[test]
    fn refuses_what_is_not_a_duration_with_a_hint() {
        for bad in [
            "",
            "90",
            "h",
            "3x",
            "-1d",
            "1.5h",
            "99999999999999999999s",
            "200000w",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(!error.is_empty(), "{bad}");
        }
        assert!(parse("90").unwrap_err().contains("no unit"));
        assert!(parse("3x").unwrap_err().contains("unknown unit `x`"));
    }

    #[test]
    fn reads_what_humantime_reads_in_whole_numbers() {
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("2days"), Ok(Duration::from_secs(2 * 86_400)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse("99y").is_ok());
        assert!(parse("101y").unwrap_err().contains("100 years"));
    }

    #[test]
    fn reads_back_in_two_units() {
        assert_eq!(
            human(Duration::from_secs(3 * 86_400 + 4 * 3600 + 5)),
            "3d 4h"
        );
        assert_eq!(human(Duration::from_secs(910)), "15m 10s");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_secs(14 * 86_400)), "2w");
    }
}
