//! Shared verification helpers: secrets, HMAC, constant-time matching,
//! single-valued header lookup, timestamps and id/kind validation.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use subtle::{Choice, ConstantTimeEq};

use super::{ProviderConfigError, Rejection, MAX_ID_BYTES, MAX_KIND_BYTES, MAX_TIMESTAMP_DIGITS};
use tickmark_core::event_limits::text_problem;

/// Key material for one signing secret. Its `Debug` never shows the bytes.
#[derive(Clone)]
pub(crate) struct Secret(Vec<u8>);

impl Secret {
    /// Wrap raw key bytes.
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The raw key bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Secrets whose key is the secret string's bytes as-is (Stripe, GitHub,
/// Shopify, Slack, Twilio, generic HMAC). At least one, none empty.
pub(crate) fn plain_secrets<I, S>(secrets: I) -> Result<Vec<Secret>, ProviderConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = Vec::new();
    for (index, s) in secrets.into_iter().enumerate() {
        let s = s.as_ref();
        if s.is_empty() {
            return Err(ProviderConfigError::EmptySecret { index });
        }
        out.push(Secret::new(s.as_bytes().to_vec()));
    }
    if out.is_empty() {
        return Err(ProviderConfigError::NoSecrets);
    }
    Ok(out)
}

/// The length of the shortest secret, in bytes (for the start-up warning).
pub(crate) fn shortest(secrets: &[Secret]) -> Option<usize> {
    secrets.iter().map(|secret| secret.bytes().len()).min()
}

// Below the receiver: the reconciler derives the same key for a delivery it
// fetches from the provider's log.
pub(crate) use tickmark_core::replay_key::{replay_key, REPLAY_KEY_PREFIX};

/// The replay key of the same signed content under one kind
/// ([`ReplayScope::HandledKind`](super::ReplayScope::HandledKind)): `sig:` +
/// the hex SHA-256 of `"kind"`, the kind and `replay_key`, each
/// length-prefixed. Derived from the content's key, so the receiver (which
/// knows the handlers) can scope it without the signature; never equal to a
/// key of the content alone, nor to one under another kind.
pub(crate) fn kind_scoped_replay_key(replay_key: &str, kind: &str) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    for part in [&b"kind"[..], kind.as_bytes(), replay_key.as_bytes()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    format!("{REPLAY_KEY_PREFIX}{}", hex::encode(hash.finalize()))
}

macro_rules! hmac_fn {
    ($(#[$doc:meta])* $name:ident, $hash:ty) => {
        $(#[$doc])*
        /// Returns `None` only if the MAC cannot be keyed (never, for HMAC).
        pub(crate) fn $name(key: &[u8], parts: &[&[u8]]) -> Option<Vec<u8>> {
            let mut mac = <Hmac<$hash> as Mac>::new_from_slice(key).ok()?;
            for part in parts {
                mac.update(part);
            }
            Some(mac.finalize().into_bytes().to_vec())
        }
    };
}

hmac_fn!(
    /// HMAC-SHA256 of the concatenation of `parts`.
    hmac_sha256,
    sha2::Sha256
);
hmac_fn!(
    /// HMAC-SHA1 of the concatenation of `parts`.
    hmac_sha1,
    sha1::Sha1
);
hmac_fn!(
    /// HMAC-SHA512 of the concatenation of `parts`.
    hmac_sha512,
    sha2::Sha512
);

/// Constant-time equality of two digests (for equal lengths); empty inputs
/// never match.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> Choice {
    if a.is_empty() || b.is_empty() {
        return Choice::from(0);
    }
    a.ct_eq(b)
}

/// True when any expected digest equals any presented one. Every pair is
/// compared, with no early exit, so timing does not reveal which secret or
/// which signature matched.
pub(crate) fn any_match(expected: &[Vec<u8>], presented: &[Vec<u8>]) -> bool {
    let mut found = Choice::from(0);
    for e in expected {
        for p in presented {
            found |= ct_eq(e, p);
        }
    }
    found.into()
}

/// Accept when one of `presented` is the HMAC-SHA256 of `parts` under any of
/// `secrets` (rotation): every pair is compared in constant time, with no
/// early exit. Otherwise `BadSignature`.
pub(crate) fn verify_hmac_sha256(
    secrets: &[Secret],
    parts: &[&[u8]],
    presented: &[Vec<u8>],
) -> Result<(), Rejection> {
    let expected: Vec<Vec<u8>> = secrets
        .iter()
        .filter_map(|secret| hmac_sha256(secret.bytes(), parts))
        .collect();
    if any_match(&expected, presented) {
        Ok(())
    } else {
        Err(Rejection::BadSignature)
    }
}

/// The single value of `name`, `None` when absent; a header present more
/// than once is refused rather than picking one.
pub(crate) fn one_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Rejection::DuplicateHeader {
            header: name.as_str().to_owned(),
        });
    }
    Ok(first)
}

/// The signature header's value as text: absent is `MissingSignature`,
/// non-visible-ASCII is `MalformedSignature`.
pub(crate) fn signature_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<&'h str, Rejection> {
    let value = one_header(headers, name)?.ok_or_else(|| Rejection::MissingSignature {
        header: name.as_str().to_owned(),
    })?;
    value.to_str().map_err(|_| Rejection::MalformedSignature {
        header: name.as_str().to_owned(),
        reason: "not visible ASCII",
    })
}

/// The timestamp header's text (as signed) and its Unix seconds. Absent,
/// duplicated or malformed are all 401s.
pub(crate) fn timestamp_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<(&'h str, i64), Rejection> {
    let value = one_header(headers, name)?.ok_or_else(|| Rejection::MissingTimestamp {
        header: name.as_str().to_owned(),
    })?;
    value
        .to_str()
        .ok()
        .and_then(|text| parse_unix_seconds(text).map(|secs| (text, secs)))
        .ok_or_else(|| Rejection::MalformedTimestamp {
            header: name.as_str().to_owned(),
        })
}

/// Plain ASCII digits, 1 to [`MAX_TIMESTAMP_DIGITS`] of them, as Unix seconds.
pub(crate) fn parse_unix_seconds(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > MAX_TIMESTAMP_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Accept `timestamp` only within `tolerance` of `now`, in both directions.
pub(crate) fn check_tolerance(
    timestamp: i64,
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<(), Rejection> {
    let tolerance_secs = tolerance.as_secs();
    let tol = i64::try_from(tolerance_secs).unwrap_or(i64::MAX);
    let age = now.timestamp().saturating_sub(timestamp);
    if age > tol {
        return Err(Rejection::StaleTimestamp {
            age_secs: age.unsigned_abs(),
            tolerance_secs,
        });
    }
    if age < tol.saturating_neg() {
        return Err(Rejection::FutureTimestamp {
            ahead_secs: age.unsigned_abs(),
            tolerance_secs,
        });
    }
    Ok(())
}

/// An event id: non-empty, at most [`MAX_ID_BYTES`], no control characters
/// (ASCII or C1).
pub(crate) fn validate_id(s: &str) -> Result<String, Rejection> {
    match text_problem(s, MAX_ID_BYTES) {
        Some(reason) => Err(Rejection::InvalidId { reason }),
        None => Ok(s.to_owned()),
    }
}

/// An event kind: non-empty, at most [`MAX_KIND_BYTES`], no control characters.
pub(crate) fn validate_kind(s: &str) -> Result<String, Rejection> {
    match text_problem(s, MAX_KIND_BYTES) {
        Some(reason) => Err(Rejection::InvalidKind { reason }),
        None => Ok(s.to_owned()),
    }
}

/// True when `s` is acceptable as a kind (for configuration checks).
pub(crate) fn is_valid_kind(s: &str) -> bool {
    text_problem(s, MAX_KIND_BYTES).is_none()
}

/// The id carried in header `name`: absent is `MissingId`, duplicated is
/// `DuplicateHeader`, non-visible-ASCII or otherwise unusable is `InvalidId`.
pub(crate) fn id_from_header(headers: &HeaderMap, name: &HeaderName) -> Result<String, Rejection> {
    optional_id_header(headers, name)?.ok_or_else(|| Rejection::MissingId {
        location: format!("header `{}`", name.as_str()),
    })
}

/// Like [`id_from_header`], but an absent header is `None`.
pub(crate) fn optional_id_header(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<String>, Rejection> {
    match one_header(headers, name)? {
        None => Ok(None),
        Some(v) => {
            let s = v.to_str().map_err(|_| Rejection::InvalidId {
                reason: "header is not visible ASCII",
            })?;
            validate_id(s).map(Some)
        }
    }
}

/// The kind carried in header `name` (absent is `MissingKind`).
pub(crate) fn kind_from_header(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<String, Rejection> {
    let value = one_header(headers, name)?.ok_or_else(|| Rejection::MissingKind {
        location: format!("header `{}`", name.as_str()),
    })?;
    let s = value.to_str().map_err(|_| Rejection::InvalidKind {
        reason: "header is not visible ASCII",
    })?;
    validate_kind(s)
}

/// The id in a JSON string field: absent or null is `MissingId`, a non-string
/// is `InvalidId`.
pub(crate) fn id_from_json(
    value: Option<&serde_json::Value>,
    location: &str,
) -> Result<String, Rejection> {
    match value {
        None | Some(serde_json::Value::Null) => Err(Rejection::MissingId {
            location: location.to_owned(),
        }),
        Some(serde_json::Value::String(s)) => validate_id(s),
        Some(_) => Err(Rejection::InvalidId {
            reason: "not a string",
        }),
    }
}

/// The kind in a JSON string field: absent or null is `MissingKind`, a
/// non-string is `InvalidKind`.
pub(crate) fn kind_from_json(
    value: Option<&serde_json::Value>,
    location: &str,
) -> Result<String, Rejection> {
    match value {
        None | Some(serde_json::Value::Null) => Err(Rejection::MissingKind {
            location: location.to_owned(),
        }),
        Some(serde_json::Value::String(s)) => validate_kind(s),
        Some(_) => Err(Rejection::InvalidKind {
            reason: "not a string",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::at;
    use super::*;

    #[test]
    fn any_match_needs_equal_nonempty() {
        assert!(any_match(&[vec![1, 2]], &[vec![9], vec![1, 2]]));
        assert!(!any_match(&[vec![1, 2]], &[vec![1, 2, 3]]));
        assert!(!any_match(&[vec![]], &[vec![]]));
        assert!(!any_match(&[], &[vec![1]]));
    }

    /// A kind-scoped key differs from the content's own key and from the
    /// same content's under any other kind, and is a `sig:` key like it.
    #[test]
    fn kind_scoped_keys_are_apart_from_each_other_and_the_content_key() {
        let content = replay_key(&[], &[7; 32]);
        let create = kind_scoped_replay_key(&content, "orders/create");
        let paid = kind_scoped_replay_key(&content, "orders/paid");
        assert!(create.starts_with(REPLAY_KEY_PREFIX) && create.len() == content.len());
        assert_ne!(create, content);
        assert_ne!(create, paid);
        assert_eq!(create, kind_scoped_replay_key(&content, "orders/create"));
        let other = replay_key(&[], &[8; 32]);
        assert_ne!(create, kind_scoped_replay_key(&other, "orders/create"));
    }

    #[test]
    fn tolerance_both_ways() {
        let now = at(1_000_000);
        let tol = Duration::from_secs(300);
        assert!(check_tolerance(1_000_000 - 300, now, tol).is_ok());
        assert!(check_tolerance(1_000_000 + 300, now, tol).is_ok());
        assert_eq!(
            check_tolerance(1_000_000 - 301, now, tol)
                .unwrap_err()
                .code(),
            "stale_timestamp"
        );
        assert_eq!(
            check_tolerance(1_000_000 + 301, now, tol)
                .unwrap_err()
                .code(),
            "future_timestamp"
        );
        assert!(check_tolerance(i64::MAX, now, Duration::MAX).is_ok());
        assert!(check_tolerance(0, now, Duration::ZERO).is_err());
    }

    #[test]
    fn timestamps_are_plain_digits() {
        assert_eq!(parse_unix_seconds("1531420618"), Some(1_531_420_618));
        for bad in ["", "+1", "-1", " 1", "1.5", "1e9", "9999999999999", "١٢"] {
            assert_eq!(parse_unix_seconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn id_and_kind_rules() {
        assert!(validate_id("evt_1").is_ok());
        assert!(validate_id(&"a".repeat(MAX_ID_BYTES)).is_ok());
        for bad in [
            String::new(),
            "a".repeat(MAX_ID_BYTES + 1),
            "a\nb".into(),
            "a\u{85}".into(),
        ] {
            assert_eq!(validate_id(&bad).unwrap_err().code(), "invalid_id");
            assert_eq!(validate_kind(&bad).unwrap_err().code(), "invalid_kind");
        }
    }

    #[test]
    fn duplicate_header_is_refused() {
        let mut h = HeaderMap::new();
        let name = HeaderName::from_static("x-sig");
        h.append(&name, HeaderValue::from_static("a"));
        assert_eq!(signature_header(&h, &name).unwrap(), "a");
        h.append(&name, HeaderValue::from_static("a"));
        assert_eq!(
            signature_header(&h, &name).unwrap_err().code(),
            "duplicate_header"
        );
    }

    #[test]
    fn secret_debug_is_redacted() {
        let s = plain_secrets(["hunter2"]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(matches!(
            plain_secrets(Vec::<String>::new()),
            Err(ProviderConfigError::NoSecrets)
        ));
        assert!(matches!(
            plain_secrets(["a", ""]),
            Err(ProviderConfigError::EmptySecret { index: 1 })
        ));
    }
}
