//! Stripe webhook signatures.
//!
//! Scheme: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…][,v0=<hex>]`,
//! where each `v1` is the hex HMAC-SHA256 of `"{t}.{raw body}"` keyed with the
//! endpoint's whole `whsec_…` secret string (its bytes as-is, the prefix is
//! part of the key). Stripe sends several `v1` entries while a secret is being
//! rolled; any match is accepted. `v0` and other schemes are ignored. The
//! timestamp must be within the tolerance (default 300 s, both ways).
//!
//! The event id is the body's `id`, the kind its `type`; both are required.
//!
//! Documentation: <https://docs.stripe.com/webhooks#verify-manually>

use std::time::Duration;

use http::HeaderName;
use serde_json::Value;

use super::body::parse_json_object;
use super::signature::{
    check_tolerance, id_from_json, kind_from_json, parse_unix_seconds, plain_secrets, shortest,
    signature_header, verify_hmac_sha256, Secret,
};
use super::{
    Delivery, Provider, ProviderConfigError, Rejection, Verdict, VerifiedEvent, DEFAULT_TOLERANCE,
    MAX_SIGNATURES_PER_HEADER,
};

/// The header carrying Stripe's timestamp and signatures.
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("stripe-signature");

/// Length of an HMAC-SHA256 digest, in bytes.
const DIGEST_BYTES: usize = 32;

/// Verifies Stripe deliveries.
#[derive(Debug, Clone)]
pub struct Stripe {
    secrets: Vec<Secret>,
    tolerance: Duration,
}

impl Stripe {
    /// A verifier for these endpoint signing secrets (`whsec_…`, used as-is).
    /// Several secrets support rotation: a delivery verifies if any matches.
    pub fn new<I, S>(secrets: I) -> Result<Self, ProviderConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            secrets: plain_secrets(secrets)?,
            tolerance: DEFAULT_TOLERANCE,
        })
    }

    /// Replace the timestamp tolerance (default [`DEFAULT_TOLERANCE`]).
    #[must_use]
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The timestamp tolerance in force.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }
}

/// The parts of a `Stripe-Signature` header we use.
#[derive(Debug)]
struct ParsedHeader<'a> {
    /// The `t` value as sent (it is signed as text).
    timestamp_text: &'a str,
    /// The `t` value as Unix seconds.
    timestamp: i64,
    /// The decoded `v1` signatures.
    v1: Vec<Vec<u8>>,
}

fn malformed(reason: &'static str) -> Rejection {
    Rejection::MalformedSignature {
        header: SIGNATURE_HEADER.as_str().to_owned(),
        reason,
    }
}

/// Parse `t=…,v1=…,…`. Exactly one `t`; one or more well-formed `v1`; other
/// keys and entries without `=` ignored.
fn parse_header(value: &str) -> Result<ParsedHeader<'_>, Rejection> {
    let mut timestamp_text = None;
    let mut v1 = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        // Entries without `=` are ignored, like unknown schemes (as Stripe's
        // own libraries do).
        let Some((key, val)) = item.split_once('=') else {
            continue;
        };
        match key {
            "t" => {
                let previous = timestamp_text.replace(val);
                if previous.is_some() {
                    return Err(malformed("more than one `t=` entry"));
                }
            }
            "v1" => {
                if v1.len() >= MAX_SIGNATURES_PER_HEADER {
                    return Err(malformed("too many `v1=` entries"));
                }
                let sig = hex::decode(val).map_err(|_| malformed("a `v1=` entry is not hex"))?;
                if sig.len() != DIGEST_BYTES {
                    return Err(malformed("a `v1=` entry is not 64 hex digits"));
                }
                v1.push(sig);
            }
            _ => {}
        }
    }
    let timestamp_text = timestamp_text.ok_or_else(|| Rejection::MissingTimestamp {
        header: format!("{} (t=)", SIGNATURE_HEADER.as_str()),
    })?;
    let timestamp =
        parse_unix_seconds(timestamp_text).ok_or_else(|| Rejection::MalformedTimestamp {
            header: format!("{} (t=)", SIGNATURE_HEADER.as_str()),
        })?;
    if v1.is_empty() {
        return Err(malformed("no `v1=` signature"));
    }
    Ok(ParsedHeader {
        timestamp_text,
        timestamp,
        v1,
    })
}

impl Provider for Stripe {
    fn name(&self) -> &'static str {
        "stripe"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let parsed = parse_header(signature_header(delivery.headers, &SIGNATURE_HEADER)?)?;
        verify_hmac_sha256(
            &self.secrets,
            &[parsed.timestamp_text.as_bytes(), b".", delivery.body],
            &parsed.v1,
        )?;
        check_tolerance(parsed.timestamp, delivery.now, self.tolerance)?;

        let object = parse_json_object(delivery.body)?;
        let id = id_from_json(object.get("id"), "body field `id`")?;
        let kind = kind_from_json(object.get("type"), "body field `type`")?;
        Ok(Verdict::Event(VerifiedEvent {
            id: Some(id),
            kind,
            payload: Value::Object(object),
            // The id is in the signed body; the signed timestamp bounds replays.
            replay_key: None,
            replay_scope: super::ReplayScope::Content,
        }))
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        parse_header(signature_header(headers, &SIGNATURE_HEADER)?).map(drop)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        shortest(&self.secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        assert_rejected, at, event, header_value, headers, hmac256, run, ten_kb,
    };
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const SECRET: &str = "whsec_test_secret_1";
    const OLD_SECRET: &str = "whsec_old_secret_0";
    const NOW: i64 = 1_700_000_000;
    const BODY: &str = r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"invoice.payment_succeeded","data":{"object":{"id":"in_1"}}}"#;

    /// Independent signer: hex HMAC-SHA256 of "{t}.{body}".
    fn sig(secret: &str, t: i64, body: &[u8]) -> String {
        let mut msg = format!("{t}.").into_bytes();
        msg.extend_from_slice(body);
        hex::encode(hmac256(secret.as_bytes(), &msg))
    }

    fn go(p: &Stripe, header: &str, body: &[u8]) -> Result<Verdict, Rejection> {
        run(
            p,
            &headers(&[("Stripe-Signature", header)]),
            body,
            "https://x/",
            at(NOW),
        )
    }

    fn provider() -> Stripe {
        Stripe::new([SECRET]).unwrap()
    }

    #[test]
    fn valid_delivery_verifies() {
        let h = format!("t={NOW},v1={}", sig(SECRET, NOW, BODY.as_bytes()));
        let e = event(go(&provider(), &h, BODY.as_bytes()));
        assert_eq!(e.id.as_deref(), Some("evt_1NG8Du2eZvKYlo2CUI79vXWy"));
        assert_eq!(e.kind, "invoice.payment_succeeded");
        assert_eq!(e.payload["data"]["object"]["id"], json!("in_1"));
        assert_eq!(e.payload, serde_json::from_str::<Value>(BODY).unwrap());
    }

    #[test]
    fn any_of_several_secrets_verifies() {
        let p = Stripe::new([OLD_SECRET, SECRET]).unwrap();
        for s in [OLD_SECRET, SECRET] {
            let h = format!("t={NOW},v1={}", sig(s, NOW, BODY.as_bytes()));
            event(go(&p, &h, BODY.as_bytes()));
        }
    }

    #[test]
    fn one_of_several_signatures_verifies() {
        let good = sig(SECRET, NOW, BODY.as_bytes());
        let other = sig("whsec_someone_else", NOW, BODY.as_bytes());
        let h = format!("t={NOW},v1={other},v1={good},v0={other}");
        event(go(&provider(), &h, BODY.as_bytes()));
        // With spaces after commas and upper-case hex too.
        let h = format!("t={NOW}, v1={}, v0=ignored", good.to_uppercase());
        event(go(&provider(), &h, BODY.as_bytes()));
    }

    #[test]
    fn tampered_body_is_401() {
        let h = format!("t={NOW},v1={}", sig(SECRET, NOW, BODY.as_bytes()));
        let tampered = BODY.replace("in_1", "in_2");
        assert_rejected(
            go(&provider(), &h, tampered.as_bytes()),
            "bad_signature",
            401,
        );
    }

    #[test]
    fn wrong_secret_is_401() {
        let h = format!("t={NOW},v1={}", sig("whsec_wrong", NOW, BODY.as_bytes()));
        assert_rejected(go(&provider(), &h, BODY.as_bytes()), "bad_signature", 401);
    }

    #[test]
    fn signature_over_other_timestamp_is_401() {
        let h = format!("t={},v1={}", NOW + 1, sig(SECRET, NOW, BODY.as_bytes()));
        assert_rejected(go(&provider(), &h, BODY.as_bytes()), "bad_signature", 401);
    }

    #[test]
    fn missing_header_is_401() {
        let r = run(
            &provider(),
            &headers(&[]),
            BODY.as_bytes(),
            "https://x/",
            at(NOW),
        );
        assert_rejected(r, "missing_signature", 401);
    }

    /// A duplicated signature header is 401 `duplicate_header`, even when
    /// both copies are valid.
    #[test]
    fn duplicated_header_is_401() {
        let h = format!("t={NOW},v1={}", sig(SECRET, NOW, BODY.as_bytes()));
        let hm = headers(&[("Stripe-Signature", &h), ("stripe-signature", &h)]);
        let r = run(&provider(), &hm, BODY.as_bytes(), "https://x/", at(NOW));
        assert_rejected(r, "duplicate_header", 401);
    }

    #[test]
    fn stale_and_future_timestamps_are_401() {
        let p = provider();
        for (t, code) in [
            (NOW - 301, "stale_timestamp"),
            (NOW + 301, "future_timestamp"),
        ] {
            let h = format!("t={t},v1={}", sig(SECRET, t, BODY.as_bytes()));
            assert_rejected(go(&p, &h, BODY.as_bytes()), code, 401);
        }
        for t in [NOW - 300, NOW + 300] {
            let h = format!("t={t},v1={}", sig(SECRET, t, BODY.as_bytes()));
            event(go(&p, &h, BODY.as_bytes()));
        }
        let strict = provider().with_tolerance(Duration::from_secs(10));
        assert_eq!(strict.tolerance(), Duration::from_secs(10));
        let h = format!(
            "t={},v1={}",
            NOW - 11,
            sig(SECRET, NOW - 11, BODY.as_bytes())
        );
        assert_rejected(go(&strict, &h, BODY.as_bytes()), "stale_timestamp", 401);
    }

    #[test]
    fn malformed_headers_are_401() {
        let good = sig(SECRET, NOW, BODY.as_bytes());
        let cases = [
            (
                format!("t={NOW},v1=zz{}", &good[2..]),
                "malformed_signature",
            ),
            (format!("t={NOW},v1={}", &good[..62]), "malformed_signature"),
            (format!("t={NOW},v1={good}00"), "malformed_signature"),
            (format!("t={NOW},v1="), "malformed_signature"),
            (format!("t={NOW},v0={good}"), "malformed_signature"),
            (format!("t={NOW}"), "malformed_signature"),
            (format!("t={NOW},v1{good}"), "malformed_signature"),
            ("garbage".to_owned(), "missing_timestamp"),
            (format!("v1={good}"), "missing_timestamp"),
            (format!("t=abc,v1={good}"), "malformed_timestamp"),
            (format!("t=-{NOW},v1={good}"), "malformed_timestamp"),
            (format!("t={NOW},t={NOW},v1={good}"), "malformed_signature"),
            (
                format!("t={NOW},{}", vec![format!("v1={good}"); 17].join(",")),
                "malformed_signature",
            ),
        ];
        for (h, code) in cases {
            assert_rejected(go(&provider(), &h, BODY.as_bytes()), code, 401);
        }
    }

    fn signed(body: &str) -> Result<Verdict, Rejection> {
        let h = format!("t={NOW},v1={}", sig(SECRET, NOW, body.as_bytes()));
        go(&provider(), &h, body.as_bytes())
    }

    #[test]
    fn missing_id_or_kind_is_400() {
        assert_rejected(signed(r#"{"type":"a.b"}"#), "missing_id", 400);
        assert_rejected(signed(r#"{"id":null,"type":"a.b"}"#), "missing_id", 400);
        assert_rejected(signed(r#"{"id":"evt_1"}"#), "missing_kind", 400);
        assert_rejected(signed(r#"{"id":7,"type":"a.b"}"#), "invalid_id", 400);
        assert_rejected(signed(r#"{"id":"evt_1","type":7}"#), "invalid_kind", 400);
    }

    #[test]
    fn bad_ids_and_kinds_are_400() {
        assert_rejected(
            signed(r#"{"id":"evt\u0000x","type":"a.b"}"#),
            "invalid_id",
            400,
        );
        assert_rejected(signed(r#"{"id":"","type":"a.b"}"#), "invalid_id", 400);
        let long = json!({"id": ten_kb(), "type": "a.b"}).to_string();
        assert_rejected(signed(&long), "invalid_id", 400);
        assert_rejected(
            signed(r#"{"id":"evt_1","type":"a\nb"}"#),
            "invalid_kind",
            400,
        );
        let long = json!({"id": "evt_1", "type": ten_kb()}).to_string();
        assert_rejected(signed(&long), "invalid_kind", 400);
    }

    #[test]
    fn correctly_signed_garbage_is_400() {
        assert_rejected(signed("not json"), "malformed_body", 400);
        assert_rejected(signed("[1,2]"), "malformed_body", 400);
        let body = b"{\"id\":\"evt_\xff\",\"type\":\"a\"}";
        let h = format!("t={NOW},v1={}", sig(SECRET, NOW, body));
        assert_rejected(go(&provider(), &h, body), "malformed_body", 400);
    }

    proptest! {
        #[test]
        fn arbitrary_headers_and_bodies_never_panic(
            header in proptest::collection::vec(any::<u8>(), 0..300),
            text in "[tv01=,a-f0-9 ]{0,200}",
            body in proptest::collection::vec(any::<u8>(), 0..200),
            now in any::<i64>(),
        ) {
            let _ = parse_header(&text);
            let _ = parse_header(&String::from_utf8_lossy(&header));
            let now = chrono::DateTime::from_timestamp(now % 100_000_000_000, 0).unwrap_or_default();
            for value in [header_value(&header), header_value(text.as_bytes())].into_iter().flatten() {
                let mut h = http::HeaderMap::new();
                h.insert(SIGNATURE_HEADER, value);
                let r = provider().verify(&Delivery { headers: &h, body: &body, public_url: "", now });
                prop_assert!(r.is_err());
            }
        }
    }
}
