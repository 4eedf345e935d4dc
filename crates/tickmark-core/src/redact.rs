//! Passwords out of URLs before they are printed, logged or stored.
//!
//! Database URLs (`postgres://user:secret@host/db`) and endpoint URLs
//! (`https://user:token@api.example/…`) reach error messages, logs and the
//! step-status table. Every place that shows one shows [`redact_url`]'s
//! version instead.

use std::borrow::Cow;

/// What replaces a password.
const MASK: &str = "***";

/// Query parameters that carry a password in libpq-style URLs
/// (`postgres://host/db?password=…`).
const SECRET_QUERY_KEYS: &[&str] = &["password", "sslpassword"];

/// `url` with the password of its user info, and any `password=` query
/// parameter, replaced by `***`. Text that is not a URL comes back as it is,
/// except that anything between `://` and an `@` that looks like
/// `user:password` is still masked, so a URL the `url` crate cannot parse (a
/// multi-host `postgres://u:p@h1:5432,h2:5432/db`) is masked too.
///
/// ```
/// use tickmark::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/prod"), "postgres://app:***@db:5432/prod");
/// assert_eq!(redact_url("postgres://app:s3cret@h1:5432,h2:5432/db"), "postgres://app:***@h1:5432,h2:5432/db");
/// assert_eq!(redact_url("sqlite://app.db"), "sqlite://app.db");
/// ```
pub fn redact_url(url: &str) -> Cow<'_, str> {
    let masked = mask_user_info(url);
    let Some(query_start) = masked.find('?') else {
        return masked;
    };
    let (before, query) = masked.split_at(query_start + 1);
    if !query.split('&').any(is_secret_pair) {
        return masked;
    }
    let query: Vec<Cow<'_, str>> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_secret_pair(pair) => Cow::Owned(format!("{key}={MASK}")),
            _ => Cow::Borrowed(pair),
        })
        .collect();
    Cow::Owned(format!("{before}{}", query.join("&")))
}

fn is_secret_pair(pair: &str) -> bool {
    pair.split_once('=').is_some_and(|(key, _)| {
        SECRET_QUERY_KEYS
            .iter()
            .any(|secret| key.eq_ignore_ascii_case(secret))
    })
}

/// `scheme://user:password@rest` → `scheme://user:***@rest`. Written by hand
/// rather than with the `url` crate because it must also mask what that crate
/// refuses to parse (libpq's multi-host lists), and it only ever removes text.
fn mask_user_info(url: &str) -> Cow<'_, str> {
    let Some(scheme_end) = url.find("://") else {
        return Cow::Borrowed(url);
    };
    let authority_start = scheme_end + 3;
    let rest = &url[authority_start..];
    // The user info ends at the last `@` before the path, query or fragment.
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_len].rfind('@') else {
        return Cow::Borrowed(url);
    };
    match rest[..at].split_once(':') {
        Some((user, password)) if !password.is_empty() => Cow::Owned(format!(
            "{}{user}:{MASK}{}",
            &url[..authority_start],
            &rest[at..]
        )),
        _ => Cow::Borrowed(url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_everything_else_is_kept() {
        let cases = [
            ("postgres://u:p@h/db", "postgres://u:***@h/db"),
            (
                "postgresql://u:p%40x@h:1/db?sslmode=require",
                "postgresql://u:***@h:1/db?sslmode=require",
            ),
            (
                "postgres://u@h/db?password=p&sslmode=off",
                "postgres://u@h/db?password=***&sslmode=off",
            ),
            (
                "postgres://h/db?application_name=a&PASSWORD=p",
                "postgres://h/db?application_name=a&PASSWORD=***",
            ),
            (
                "https://key:tok@api.example/a@b",
                "https://key:***@api.example/a@b",
            ),
            (
                "https://api.example/path?q=1",
                "https://api.example/path?q=1",
            ),
            ("http://u:@h/", "http://u:@h/"),
            ("not a url", "not a url"),
            ("mysql://u:p@h/db", "mysql://u:***@h/db"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_url(input), expected, "{input}");
        }
    }

    #[test]
    fn a_password_with_an_at_sign_is_masked_whole() {
        assert_eq!(
            redact_url("postgres://u:p@ss@h/db"),
            "postgres://u:***@h/db"
        );
    }
}
