//! Test helpers. Signatures here are computed directly with the `hmac`,
//! `sha1`/`sha2`, `hex` and `base64` crates, independently of the code under
//! test.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{Delivery, Provider, Rejection, Verdict, VerifiedEvent};

/// Raw HMAC-SHA256.
pub fn hmac256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

/// Raw HMAC-SHA1.
pub fn hmac1(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<sha1::Sha1>::new_from_slice(key).unwrap();
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

/// Raw HMAC-SHA512.
pub fn hmac512(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<sha2::Sha512>::new_from_slice(key).unwrap();
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

/// Standard base64 with padding.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A header map; pairs with the same name are appended (duplicates kept).
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// The instant `secs` Unix seconds.
pub fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap()
}

/// Run `provider` on one delivery.
pub fn run(
    provider: &dyn Provider,
    headers: &HeaderMap,
    body: &[u8],
    url: &str,
    now: DateTime<Utc>,
) -> Result<Verdict, Rejection> {
    provider.verify(&Delivery {
        headers,
        body,
        public_url: url,
        now,
    })
}

/// The event of a verdict, panicking on anything else.
pub fn event(result: Result<Verdict, Rejection>) -> VerifiedEvent {
    match result {
        Ok(Verdict::Event(e)) => e,
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Assert a rejection with this code and status.
pub fn assert_rejected(result: Result<Verdict, Rejection>, code: &str, status: u16) {
    match result {
        Err(r) => {
            assert_eq!(r.code(), code, "{r}");
            assert_eq!(r.status().as_u16(), status, "{r}");
        }
        Ok(v) => panic!("expected rejection {code}, got {v:?}"),
    }
}

/// An id far beyond the limit.
pub fn ten_kb() -> String {
    "a".repeat(10 * 1024)
}

/// Bytes that `HeaderValue` accepts, from arbitrary input (for property tests).
pub fn header_value(bytes: &[u8]) -> Option<HeaderValue> {
    HeaderValue::from_bytes(bytes).ok()
}
