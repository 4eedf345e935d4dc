//! Durations as operators type and read them: `90s`, `15m`, `4h`, `3d`, `1w`,
//! and sums such as `1h30m`.

use std::time::Duration;

const UNITS: [(&str, u64); 5] = [
    ("w", 7 * 24 * 3600),
    ("d", 24 * 3600),
    ("h", 3600),
    ("m", 60),
    ("s", 1),
];

/// The longest duration accepted: 100 years, far past any retention.
const MAX_SECONDS: u64 = 100 * 365 * 24 * 3600;

/// Parse `90s`, `15m`, `4h`, `3d`, `1w` or a sum like `1d12h` (clap value parser).
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let hint = "write a number and a unit: 90s, 15m, 4h, 3d, 1w (or a sum: 1h30m)";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration; {hint}"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("`{text}` is not a duration; {hint}"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}` is too long a duration"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = match UNITS.iter().find(|(name, _)| *name == unit) {
            Some((_, seconds)) => *seconds,
            None if unit.is_empty() => {
                return Err(format!("`{text}` has no unit; {hint}"));
            }
            None => return Err(format!("unknown unit `{unit}` in `{text}`; {hint}")),
        };
        total = number
            .checked_mul(seconds)
            .and_then(|s| total.checked_add(s))
            .filter(|s| *s <= MAX_SECONDS)
            .ok_or_else(|| format!("`{text}` is longer than 100 years"))?;
    }
    Ok(Duration::from_secs(total))
}

/// A duration for people: its two largest units (`3d 4h`, `15m 10s`, `42s`, `850ms`).
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
