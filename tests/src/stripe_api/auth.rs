//! API key authentication as Stripe does it: `Authorization: Bearer <key>`,
//! or HTTP Basic with the key as the username and no password (`curl -u
//! sk_test_…:`). A missing or wrong key is a 401 `invalid_request_error`.
//! <https://docs.stripe.com/api/authentication>

use axum::http::HeaderMap;
use base64::Engine as _;

use super::errors::ApiError;

/// Check the request's `Authorization` against `api_key`.
pub fn check(headers: &HeaderMap, api_key: &str) -> Result<(), ApiError> {
    let Some(value) = headers.get("authorization") else {
        return Err(ApiError::Unauthorized {
            message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').".to_owned(),
        });
    };
    let value = value.to_str().unwrap_or_default();
    let presented = if let Some(token) = strip_scheme(value, "bearer") {
        Some(token.trim().to_owned())
    } else if let Some(encoded) = strip_scheme(value, "basic") {
        base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(|pair| match pair.split_once(':') {
                Some((user, _password)) => user.to_owned(),
                None => pair,
            })
    } else {
        None
    };
    match presented {
        Some(key) if key == api_key => Ok(()),
        Some(key) => Err(ApiError::Unauthorized {
            message: format!("Invalid API Key provided: {}", redact(&key)),
        }),
        None => Err(ApiError::Unauthorized {
            message: "Invalid Authorization header: use Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY') or Basic auth with the key as the username.".to_owned(),
        }),
    }
}

/// `Bearer xyz` → `xyz`, the scheme matched without regard to case.
fn strip_scheme<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    let (first, rest) = value.split_once(' ')?;
    first.eq_ignore_ascii_case(scheme).then_some(rest)
}

/// `sk_test_****wxyz`, as Stripe echoes a wrong key.
fn redact(key: &str) -> String {
    let tail: String = key
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let head: String = key.chars().take(8).collect();
    if key.chars().count() <= 12 {
        return "****".to_owned();
    }
    format!("{head}****{tail}")
}
