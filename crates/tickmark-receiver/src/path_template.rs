//! Where deliveries are received: the path template (`/hooks/{source}` by
//! default) and the source names that fill it.
//!
//! Both are checked when they are set, so that building the router never
//! meets a path axum would refuse (axum panics on a malformed route).

use super::config_error::ReceiverConfigError;
use super::MAX_SOURCE_NAME_LEN;

/// The path deliveries are POSTed to unless
/// [`Receiver::path`](super::Receiver::path) says otherwise.
pub const DEFAULT_PATH: &str = "/hooks/{source}";

/// The placeholder a path template holds exactly once, as a whole segment.
pub(crate) const SOURCE_PLACEHOLDER: &str = "{source}";

/// `template` if it can route deliveries: it starts with `/`, holds
/// `{source}` exactly once as a whole segment, and is otherwise made of
/// non-empty segments of ASCII letters, digits, `-`, `_`, `.` and `~` (the
/// characters a URL path takes unescaped; no other capture or wildcard).
pub(crate) fn checked(template: &str) -> Result<String, ReceiverConfigError> {
    let problem = |problem| ReceiverConfigError::InvalidPathTemplate {
        template: template.to_owned(),
        problem,
    };
    let Some(rest) = template.strip_prefix('/') else {
        return Err(problem("must start with `/`"));
    };
    let mut placeholders = 0;
    for segment in rest.split('/') {
        if segment == SOURCE_PLACEHOLDER {
            placeholders += 1;
        } else if segment.contains(['{', '}']) {
            return Err(problem(
                "may hold `{source}` only, as a whole path segment (no other capture)",
            ));
        } else if segment.is_empty() {
            return Err(problem(
                "has an empty path segment (`//` or a trailing `/`)",
            ));
        } else if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
        {
            return Err(problem(
                "may hold only ASCII letters, digits, `-`, `_`, `.` and `~` besides `/` and `{source}`",
            ));
        }
    }
    match placeholders {
        1 => Ok(template.to_owned()),
        0 => Err(problem("must hold `{source}`, where the source name goes")),
        _ => Err(problem("must hold `{source}` exactly once")),
    }
}

/// Whether `name` can be a source: 1 to [`MAX_SOURCE_NAME_LEN`] ASCII
/// letters, digits, `_`, `-` or `.`, not starting with `.` (it is a path
/// segment: `.` and `..` would be read as directories).
pub(crate) fn is_valid_source_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SOURCE_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_are_path_segments() {
        for good in ["stripe", "shop-eu", "github.app_2"] {
            assert!(is_valid_source_name(good), "{good}");
        }
        for bad in ["", "a/b", "a b", "é", "..", ".x", &"a".repeat(65)] {
            assert!(!is_valid_source_name(bad), "{bad}");
        }
    }

    #[test]
    fn templates_hold_the_source_once_as_a_whole_segment() {
        for good in [
            DEFAULT_PATH,
            "/{source}",
            "/webhooks/{source}",
            "/api/v1/{source}/events",
            "/in~coming/{source}/hook.json",
        ] {
            assert_eq!(checked(good).as_deref(), Ok(good));
        }
        let cases = [
            ("hooks/{source}", "must start with `/`"),
            ("", "must start with `/`"),
            ("/hooks", "must hold `{source}`"),
            ("/", "empty path segment"),
            ("/{source}/{source}", "exactly once"),
            ("/hooks/{tenant}/{source}", "no other capture"),
            ("/hooks/{*source}", "no other capture"),
            ("/hooks/src-{source}", "no other capture"),
            ("/hooks/{source}/", "empty path segment"),
            ("/hooks//{source}", "empty path segment"),
            ("/hooks/:source", "only ASCII letters"),
            ("/hooks/*rest/{source}", "only ASCII letters"),
            ("/hooks/é/{source}", "only ASCII letters"),
            ("/hooks/a b/{source}", "only ASCII letters"),
            ("/hooks?x=1/{source}", "only ASCII letters"),
        ];
        for (bad, why) in cases {
            let error = checked(bad).expect_err(bad);
            let text = error.to_string();
            assert!(text.contains(why), "{bad}: {text}");
            assert!(text.contains(&format!("`{bad}`")), "{bad}: {text}");
            assert!(
                text.contains("write it like `/webhooks/{source}`"),
                "{text}"
            );
        }
    }
}
