//! The dashboard's bearer token.
//!
//! Actions (retry) always need it; reading pages needs it only with
//! [`Dashboard::token_for_reads`](super::Dashboard::token_for_reads). It is
//! accepted as `Authorization: Bearer <token>`, or, for the retry button, as
//! the form field `token`. Comparison is in constant time (`subtle`) over
//! SHA-256 digests, so neither the content nor the length of the secret
//! leaks through timing.

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::html::Page;
use super::links::Base;
use super::Shared;

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

    /// Whether the request's `Authorization: Bearer …` header holds the secret.
    pub fn matches_bearer(&self, headers: &HeaderMap) -> bool {
        bearer(headers).is_some_and(|candidate| self.matches(candidate))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

/// Middleware: with `token_for_reads`, a page is shown only to a request
/// with the bearer token. Actions (POST) check the token themselves, since
/// they also accept it as a form field.
pub(crate) async fn guard_reads(
    State(shared): State<Arc<Shared>>,
    base: Base,
    request: Request,
    next: Next,
) -> Response {
    let open = !shared.token_for_reads
        || request.method() == Method::POST
        || shared
            .token
            .as_ref()
            .is_some_and(|token| token.matches_bearer(request.headers()));
    if open {
        next.run(request).await
    } else {
        unauthorized(
            &base,
            "This dashboard needs its token to show pages: send `Authorization: Bearer <token>`.",
        )
    }
}

/// 401, with the challenge that names the scheme.
pub(crate) fn unauthorized(base: &Base, message: &str) -> Response {
    let mut response =
        Page::message(&base.0, StatusCode::UNAUTHORIZED, "Token required", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tickmark\""),
    );
    response
}

/// The credentials of an `Authorization: Bearer <credentials>` header (the
/// scheme is case-insensitive, as RFC 9110 says).
fn bearer(headers: &HeaderMap) -> Option<&str> {
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
