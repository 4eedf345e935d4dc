//! Verification of incoming webhook deliveries, one module per provider.
//!
//! Everything here is pure and synchronous: a [`Provider`] is given one
//! [`Delivery`] (headers, the raw body bytes, the public URL the provider
//! posted to, and the current time) and answers with a [`Verdict`] or a typed
//! [`Rejection`]. Nothing touches a database, the network or a clock of its
//! own.
//!
//! Rules every provider follows:
//!
//! * the signature is checked on the raw bytes before the body is parsed
//!   (Twilio's form variant signs the decoded parameters, so there the form is
//!   decoded leniently for the signature and strictly afterwards);
//! * every provider takes several secrets (rotation): a delivery verifies when
//!   any secret matches, and where a header carries several signatures, when
//!   any of them matches. Every secret/signature pair is compared in constant
//!   time, without stopping at the first match;
//! * a header that the verification reads and that appears more than once is
//!   rejected ([`Rejection::DuplicateHeader`], 401) rather than picking one;
//! * the signature header (and whatever else the signature needs from the
//!   headers) is checked for presence and shape by [`Provider::check_headers`]
//!   before the body is read, so an unsigned body is never buffered;
//!   [`Provider::verify`] checks the same again, in the same order, so the two
//!   always agree;
//! * where the signature does not cover the event id (GitHub, Shopify, Twilio,
//!   a generic source with the id in a header), the verdict carries a
//!   [`VerifiedEvent::replay_key`] derived from the verified signature, which
//!   the inbox deduplicates on as well, so a captured delivery sent again
//!   with a new id is a duplicate (Shopify's is scoped by the topic, for the
//!   topics a handler takes: [`ReplayScope::HandledKind`]);
//! * where the scheme has a timestamp, the signature is checked first and the
//!   tolerance second, so a stale/future verdict is only ever given for a
//!   delivery that was genuinely signed (a replay or a skewed clock, not a
//!   forgery);
//! * nothing panics on attacker input: no `unwrap`, `expect` or indexing in
//!   non-test code (enforced by the clippy lints below).

// Module-level lints: the crate forbids `unsafe` already; here, every public
// item is documented and nothing that can panic on attacker input compiles.
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::string_slice
    )
)]

use std::time::Duration;

use http::StatusCode;

mod body;
pub mod generic_hmac;
pub mod github;
pub mod shopify;
mod signature;
pub mod slack;
pub mod standard_webhooks;
pub mod stripe;
#[cfg(test)]
mod test_support;
pub mod twilio;

pub use generic_hmac::{Algorithm, Encoding, FieldSource, GenericHmac, GenericHmacConfig};
pub use github::GitHub;
pub use shopify::Shopify;
pub use slack::Slack;
pub use standard_webhooks::StandardWebhooks;
pub use stripe::Stripe;
pub use twilio::Twilio;

pub(crate) use signature::kind_scoped_replay_key;

/// The id and kind limits live below the receiver: the reconciler's pulled
/// events meet them too.
pub use tickmark_core::event_limits::{MAX_ID_BYTES, MAX_KIND_BYTES};

/// Most signatures of one scheme accepted in a single signature header
/// (Stripe `v1=` entries, Standard Webhooks `v1,` entries). More is treated
/// as a malformed header, so a forged header cannot make us do unbounded work.
pub const MAX_SIGNATURES_PER_HEADER: usize = 16;

/// Most fields accepted in an `application/x-www-form-urlencoded` body
/// (PHP's `max_input_vars` default). Twilio's requests carry a few dozen;
/// a form with more is refused with 413 `too_many_form_fields` after a
/// count that decodes nothing, so an unsigned body of `a&a&a…` costs no
/// more than reading it.
pub const MAX_FORM_FIELDS: usize = 1_000;

/// Most digits accepted in a Unix-seconds timestamp header or field.
pub const MAX_TIMESTAMP_DIGITS: usize = 12;

/// Default timestamp tolerance (both directions) for the timestamped schemes
/// (Stripe, Standard Webhooks, Slack): five minutes, as each provider documents.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// One incoming HTTP delivery, as the receiver saw it.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// The request headers, exactly as received.
    pub headers: &'a http::HeaderMap,
    /// The raw request body bytes, unmodified.
    pub body: &'a [u8],
    /// The public URL the provider posted to, including query string (Twilio signs it; the receiver sits behind proxies so this is configured, not read from the request).
    pub public_url: &'a str,
    /// The current time, used for timestamp tolerance checks.
    pub now: chrono::DateTime<chrono::Utc>,
}

/// The outcome of a successful verification.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// A verified event to record.
    Event(VerifiedEvent),
    /// A verified handshake to answer with this JSON body and record nothing (Slack url_verification).
    Handshake(serde_json::Value),
}

/// A delivery whose signature verified, ready to be recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedEvent {
    /// The provider's own event id, when the provider gives one; None means the engine will use `sha256:` of the raw body.
    pub id: Option<String>,
    /// The event type ("invoice.payment_succeeded", "push", "orders/create", ...).
    pub kind: String,
    /// The body as JSON (form-encoded bodies become a JSON object of string fields).
    pub payload: serde_json::Value,
    /// For schemes whose signature does not cover the id: a key derived from
    /// what the signature does cover (`sig:` + SHA-256 of the verified
    /// signature), so that the inbox refuses the same signed content under a
    /// second id. `None` where the id is signed (in the body or the signed
    /// headers) and replays are bounded by a signed timestamp.
    pub replay_key: Option<String>,
    /// How far `replay_key` reaches: over every kind, or once per kind a
    /// handler takes (see [`ReplayScope`]).
    pub replay_scope: ReplayScope,
}

/// Which deliveries of one signed content are one event: what the receiver
/// does with [`VerifiedEvent::replay_key`] before the inbox decides on it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayScope {
    /// One event per signed content, whatever kind it comes with: the
    /// replay key is used as it is (GitHub, Twilio, a generic source).
    #[default]
    Content,
    /// One event per signed content *and* kind, for the kinds this source's
    /// handlers name; the provider sends one body under several kinds, and
    /// the kind is not signed (Shopify: `orders/create` and `orders/paid`
    /// of an order paid at checkout). The receiver scopes the key by the
    /// kind when a handler of the source names it (or a wait waits for it);
    /// for any other kind the key stays as it is. So one signed body makes
    /// at most one event per named kind, plus one for every other kind
    /// together; and a copy under a kind no handler takes records nothing
    /// while its content is in the inbox under any kind (receiver.md,
    /// "Byte-identical bodies").
    HandledKind,
}

/// Why a delivery was refused.
///
/// Messages say what is wrong and what the sender should check. They never
/// contain a secret and never echo attacker-controlled bytes: only header
/// names we chose, fixed reasons and numbers.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// The header carrying the signature is absent.
    #[error("missing signature header `{header}`: check that the provider is set up to sign deliveries to this endpoint")]
    MissingSignature {
        /// The expected header name.
        header: String,
    },
    /// A header the verification reads appears more than once; we refuse to
    /// pick one of the values.
    #[error("header `{header}` appears more than once: a delivery must carry it exactly once; check for proxies that duplicate headers")]
    DuplicateHeader {
        /// The duplicated header name.
        header: String,
    },
    /// The signature header is present but cannot be parsed (wrong format,
    /// bad hex or base64, wrong digest length, too many entries).
    #[error("signature header `{header}` is malformed ({reason}): check that the header is forwarded unmodified")]
    MalformedSignature {
        /// The signature header name.
        header: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No presented signature matches any configured secret.
    #[error("signature does not match: check that the signing secret configured here is the provider's current one and that the body and URL reach us unmodified")]
    BadSignature,
    /// Twilio's `bodySHA256` URL parameter does not match the body.
    #[error("the bodySHA256 URL parameter does not match the body: check that the body is forwarded unmodified")]
    BadBodyHash,
    /// The header carrying the signed timestamp is absent.
    #[error("missing timestamp header `{header}`: the provider always sends it; check that the header is forwarded")]
    MissingTimestamp {
        /// The expected header name.
        header: String,
    },
    /// The timestamp is not a plain number of Unix seconds.
    #[error("timestamp in `{header}` is malformed: expected Unix seconds as plain digits (at most {} of them)", MAX_TIMESTAMP_DIGITS)]
    MalformedTimestamp {
        /// Where the timestamp was read from.
        header: String,
    },
    /// The signed timestamp is older than the tolerance allows.
    #[error("timestamp is {age_secs} s old, beyond the {tolerance_secs} s tolerance: check the sender's clock and retry latency; this may be a replayed delivery")]
    StaleTimestamp {
        /// How old the timestamp is, in seconds.
        age_secs: u64,
        /// The configured tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The signed timestamp is further in the future than the tolerance allows.
    #[error("timestamp is {ahead_secs} s in the future, beyond the {tolerance_secs} s tolerance: check the sender's clock")]
    FutureTimestamp {
        /// How far ahead the timestamp is, in seconds.
        ahead_secs: u64,
        /// The configured tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The body (signed correctly) cannot be parsed as the provider's format.
    #[error("body is malformed: {reason}")]
    MalformedBody {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The form body has more fields than [`MAX_FORM_FIELDS`]: refused
    /// before it is decoded (and, for Twilio, before the signature over its
    /// fields is computed).
    #[error("form body has more than {limit} fields: no provider sends that many; check what is posting to this endpoint")]
    TooManyFormFields {
        /// The most fields accepted.
        limit: usize,
    },
    /// The event id the provider always sends is absent.
    #[error("event id is missing: expected it in {location}")]
    MissingId {
        /// Where the id was expected (a header or a body field).
        location: String,
    },
    /// The event id is present but unusable.
    #[error(
        "event id is invalid ({reason}): ids must be 1 to {} bytes with no control characters",
        MAX_ID_BYTES
    )]
    InvalidId {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The event kind is absent.
    #[error("event kind is missing: expected it in {location}")]
    MissingKind {
        /// Where the kind was expected (a header or a body field).
        location: String,
    },
    /// The event kind is present but unusable.
    #[error(
        "event kind is invalid ({reason}): kinds must be 1 to {} bytes with no control characters",
        MAX_KIND_BYTES
    )]
    InvalidKind {
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Rejection {
    /// The HTTP status to answer with: 401 when the delivery is not
    /// authenticated (signature or timestamp problems, duplicated headers),
    /// 400 when it is authenticated but unusable (body, id or kind), 413 when
    /// the form has too many fields to look at.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingSignature { .. }
            | Self::DuplicateHeader { .. }
            | Self::MalformedSignature { .. }
            | Self::BadSignature
            | Self::BadBodyHash
            | Self::MissingTimestamp { .. }
            | Self::MalformedTimestamp { .. }
            | Self::StaleTimestamp { .. }
            | Self::FutureTimestamp { .. } => StatusCode::UNAUTHORIZED,
            Self::MalformedBody { .. }
            | Self::MissingId { .. }
            | Self::InvalidId { .. }
            | Self::MissingKind { .. }
            | Self::InvalidKind { .. } => StatusCode::BAD_REQUEST,
            Self::TooManyFormFields { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// A stable snake_case machine code for this rejection.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MissingSignature { .. } => "missing_signature",
            Self::DuplicateHeader { .. } => "duplicate_header",
            Self::MalformedSignature { .. } => "malformed_signature",
            Self::BadSignature => "bad_signature",
            Self::BadBodyHash => "bad_body_hash",
            Self::MissingTimestamp { .. } => "missing_timestamp",
            Self::MalformedTimestamp { .. } => "malformed_timestamp",
            Self::StaleTimestamp { .. } => "stale_timestamp",
            Self::FutureTimestamp { .. } => "future_timestamp",
            Self::MalformedBody { .. } => "malformed_body",
            Self::TooManyFormFields { .. } => "too_many_form_fields",
            Self::MissingId { .. } => "missing_id",
            Self::InvalidId { .. } => "invalid_id",
            Self::MissingKind { .. } => "missing_kind",
            Self::InvalidKind { .. } => "invalid_kind",
        }
    }
}

/// Why a provider could not be constructed from its configuration.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ProviderConfigError {
    /// No secret was given: the provider could never verify anything.
    #[error("no signing secret configured: give at least one")]
    NoSecrets,
    /// One of the secrets is the empty string.
    #[error("signing secret number {index} (from 0) is empty")]
    EmptySecret {
        /// Position of the offending secret in the list.
        index: usize,
    },
    /// One of the secrets is not in the format the scheme requires.
    #[error("signing secret number {index} (from 0) is invalid: {reason}")]
    InvalidSecret {
        /// Position of the offending secret in the list.
        index: usize,
        /// What is wrong with it (never the secret itself).
        reason: &'static str,
    },
    /// A configured header name is not a valid HTTP header name.
    #[error("`{name}` is not a valid HTTP header name")]
    InvalidHeaderName {
        /// The offending name.
        name: String,
    },
    /// A configured JSON pointer does not start with `/`.
    #[error("`{pointer}` is not a JSON pointer: it must start with `/` (e.g. `/id`)")]
    InvalidJsonPointer {
        /// The offending pointer.
        pointer: String,
    },
    /// The configured default kind would itself be rejected as a kind.
    #[error(
        "the default kind is invalid: it must be 1 to {} bytes with no control characters",
        MAX_KIND_BYTES
    )]
    InvalidDefaultKind,
}

/// A provider's verification scheme.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// Stable short name ("stripe", "github", ...).
    fn name(&self) -> &'static str;

    /// Verify one delivery: the verified event or handshake, or why it was refused.
    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection>;

    /// Check, before the body is read, what [`Provider::verify`] reads from
    /// the headers ahead of the body: the signature header's presence and
    /// shape (and, where the scheme signs them, the timestamp and id
    /// headers), with the same rejection `verify` would give. The default
    /// checks nothing.
    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        let _ = headers;
        Ok(())
    }

    /// The length in bytes of the shortest configured secret, for the
    /// start-up warning about short secrets. The default is `None` (unknown).
    fn shortest_secret_bytes(&self) -> Option<usize> {
        None
    }

    /// Whether the signature covers the URL the provider posted to (Twilio),
    /// so the receiver must know its public URL. The default is `false`.
    fn signs_public_url(&self) -> bool {
        false
    }
}

/// A provider chosen at run time (from configuration) is a provider too.
impl<P: Provider + ?Sized> Provider for Box<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        (**self).verify(delivery)
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        (**self).check_headers(headers)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        (**self).shortest_secret_bytes()
    }

    fn signs_public_url(&self) -> bool {
        (**self).signs_public_url()
    }
}

/// A shared provider is a provider too.
impl<P: Provider + ?Sized> Provider for std::sync::Arc<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        (**self).verify(delivery)
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        (**self).check_headers(headers)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        (**self).shortest_secret_bytes()
    }

    fn signs_public_url(&self) -> bool {
        (**self).signs_public_url()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes_are_consistent() {
        let all = [
            Rejection::MissingSignature { header: "h".into() },
            Rejection::DuplicateHeader { header: "h".into() },
            Rejection::MalformedSignature {
                header: "h".into(),
                reason: "r",
            },
            Rejection::BadSignature,
            Rejection::BadBodyHash,
            Rejection::MissingTimestamp { header: "h".into() },
            Rejection::MalformedTimestamp { header: "h".into() },
            Rejection::StaleTimestamp {
                age_secs: 1,
                tolerance_secs: 0,
            },
            Rejection::FutureTimestamp {
                ahead_secs: 1,
                tolerance_secs: 0,
            },
            Rejection::MalformedBody { reason: "r" },
            Rejection::TooManyFormFields { limit: 1 },
            Rejection::MissingId {
                location: "l".into(),
            },
            Rejection::InvalidId { reason: "r" },
            Rejection::MissingKind {
                location: "l".into(),
            },
            Rejection::InvalidKind { reason: "r" },
        ];
        let mut codes = std::collections::HashSet::new();
        for r in &all {
            let code = r.code();
            assert!(codes.insert(code), "duplicate code {code}");
            assert!(code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            assert!(!r.to_string().is_empty());
            let expect_400 = matches!(
                code,
                "malformed_body" | "missing_id" | "invalid_id" | "missing_kind" | "invalid_kind"
            );
            let want = if expect_400 {
                StatusCode::BAD_REQUEST
            } else if code == "too_many_form_fields" {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::UNAUTHORIZED
            };
            assert_eq!(r.status(), want, "{code}");
        }
    }

    #[test]
    fn providers_are_object_safe_and_named() {
        let list: Vec<Box<dyn Provider>> = vec![
            Box::new(Stripe::new(["whsec_x"]).unwrap()),
            Box::new(GitHub::new(["x"]).unwrap()),
            Box::new(Shopify::new(["x"]).unwrap()),
            Box::new(StandardWebhooks::new(["whsec_eHl6"]).unwrap()),
            Box::new(Slack::new(["x"]).unwrap()),
            Box::new(Twilio::new(["x"]).unwrap()),
        ];
        let names: Vec<_> = list.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "stripe",
                "github",
                "shopify",
                "standard_webhooks",
                "slack",
                "twilio"
            ]
        );
        // Debug never shows secrets.
        let dbg = format!("{:?}", Stripe::new(["whsec_topsecret"]).unwrap());
        assert!(!dbg.contains("topsecret"), "{dbg}");
    }
}
