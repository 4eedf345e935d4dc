//! The dashboard's secret token, kept only as its SHA-256 digest.
//!
//! It is accepted as `Authorization: Bearer <token>` (scripts, Prometheus),
//! as the login form's password field, or as the retry form's `token` field.
//! Comparison is in constant time (`subtle`) over SHA-256 digests, so
//! neither the content nor the length of the secret leaks through timing.

use std::fmt;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The configured secret, kept only as its digest.
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    /// A token for `secret` (must not be empty: checked by the builder).
    pub fn new(secret: &str) -> Self {
        Self {
            digest: Sha256::digest(secret.as_bytes()).into(),
        }
    }

    /// Whether `candidate` is the secret. Constant time in the candidate's
    /// content and length.
    pub fn matches(&self, candidate: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(candidate.as_bytes()).into();
        // An empty candidate hashes to a fixed value; refuse it explicitly,
        // though the builder never accepts an empty secret anyway.
        !candidate.is_empty() && bool::from(self.digest.ct_eq(&digest))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

/// The credentials of an `Authorization: Bearer <credentials>` header (the
/// scheme is case-insensitive, as RFC 9110 says): what a request presents
/// as the token, right or wrong. `None` without one (no header, another
/// scheme, no credentials).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    impl Token {
        fn matches_bearer(&self, headers: &HeaderMap) -> bool {
            bearer(headers).is_some_and(|candidate| self.matches(candidate))
        }
    }

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_the_exact_secret_matches() {
        let token = Token::new("s3cret-token");
        assert!(token.matches("s3cret-token"));
        for wrong in ["", "s3cret-toke", "s3cret-token ", "S3CRET-TOKEN", "x"] {
            assert!(!token.matches(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn the_bearer_header_is_read_case_insensitively_by_scheme_only() {
        let token = Token::new("abc");
        assert!(token.matches_bearer(&with_authorization("Bearer abc")));
        assert!(token.matches_bearer(&with_authorization("bearer  abc")));
        assert!(!token.matches_bearer(&with_authorization("Bearer ABC")));
        assert!(!token.matches_bearer(&with_authorization("Basic abc")));
        assert!(!token.matches_bearer(&with_authorization("Bearer")));
        assert!(!token.matches_bearer(&HeaderMap::new()));
    }

    #[test]
    fn the_secret_is_not_printed() {
        assert_eq!(format!("{:?}", Token::new("abc")), "Token(***)");
    }
}
