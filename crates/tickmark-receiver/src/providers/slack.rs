//! Slack request signatures (Events API, slash commands, interactivity).
//!
//! Scheme: `X-Slack-Signature: v0=<hex>`, the hex HMAC-SHA256 of
//! `"v0:{X-Slack-Request-Timestamp}:{raw body}"` keyed with the app's signing
//! secret (bytes as-is). One signature per request; several configured
//! secrets support rotation. The timestamp must be within the tolerance
//! (default 5 minutes) in both directions.
//!
//! After the signature verifies, by Content-Type:
//!
//! * `application/x-www-form-urlencoded` (slash commands, interactivity):
//!   the id is `None`; if a `payload` field is present (interactivity) the
//!   kind is that JSON's `type` (e.g. `block_actions`), otherwise the kind is
//!   the `command` field (e.g. `/weather`); neither is 400 `missing_kind`.
//!   The payload is the form as a JSON object of string fields, with
//!   `payload` replaced by its parsed JSON.
//! * anything else is parsed as JSON:
//!   * `type == "url_verification"` → [`Verdict::Handshake`] with
//!     `{"challenge": <challenge>}` (nothing is recorded);
//!   * `type == "event_callback"` → id = `event_id` (required), kind =
//!     `event.type`, falling back to the outer `type`;
//!   * any other `type` (e.g. `app_rate_limited`) → id = `event_id` when
//!     present, kind = `event.type` falling back to `type`.
//!
//! Documentation: <https://api.slack.com/authentication/verifying-requests-from-slack>

use std::time::Duration;

use http::HeaderName;
use serde_json::{json, Value};

use super::body::{decode_form, form_to_json, is_form, media_type, parse_json, parse_json_object};
use super::signature::{
    check_tolerance, id_from_json, kind_from_json, plain_secrets, shortest, signature_header,
    timestamp_header, validate_kind, verify_hmac_sha256, Secret,
};
use super::{
    Delivery, Provider, ProviderConfigError, Rejection, Verdict, VerifiedEvent, DEFAULT_TOLERANCE,
};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-slack-signature");
/// The header carrying the signed timestamp.
pub const TIMESTAMP_HEADER: HeaderName = HeaderName::from_static("x-slack-request-timestamp");

/// The version prefix of the signature (and of the signed base string).
const VERSION: &str = "v0";
/// Length of an HMAC-SHA256 digest, in bytes.
const DIGEST_BYTES: usize = 32;

/// Verifies Slack requests.
#[derive(Debug, Clone)]
pub struct Slack {
    secrets: Vec<Secret>,
    tolerance: Duration,
}

impl Slack {
    /// A verifier for these signing secrets (used as-is). Several secrets
    /// support rotation: a request verifies if any matches.
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

/// The digest in `v0=<64 hex digits>`.
fn parse_signature(value: &str) -> Result<Vec<u8>, Rejection> {
    let malformed = |reason| Rejection::MalformedSignature {
        header: SIGNATURE_HEADER.as_str().to_owned(),
        reason,
    };
    let hex_part = value
        .strip_prefix("v0=")
        .ok_or_else(|| malformed("does not start with `v0=`"))?;
    let sig = hex::decode(hex_part).map_err(|_| malformed("not hex after `v0=`"))?;
    if sig.len() != DIGEST_BYTES {
        return Err(malformed("not 64 hex digits after `v0=`"));
    }
    Ok(sig)
}

/// The verdict for a JSON body.
fn json_verdict(body: &[u8]) -> Result<Verdict, Rejection> {
    let object = parse_json_object(body)?;
    let outer_type = object.get("type");
    if outer_type.and_then(Value::as_str) == Some("url_verification") {
        return match object.get("challenge") {
            Some(Value::String(challenge)) => {
                Ok(Verdict::Handshake(json!({ "challenge": challenge })))
            }
            _ => Err(Rejection::MalformedBody {
                reason: "url_verification without a string `challenge`",
            }),
        };
    }
    let id = if outer_type.and_then(Value::as_str) == Some("event_callback") {
        Some(id_from_json(
            object.get("event_id"),
            "body field `event_id`",
        )?)
    } else {
        match object.get("event_id") {
            None | Some(Value::Null) => None,
            present => Some(id_from_json(present, "body field `event_id`")?),
        }
    };
    let inner_type = object.get("event").and_then(|e| e.get("type"));
    let kind = match inner_type {
        Some(Value::String(_)) => kind_from_json(inner_type, "body field `event.type`")?,
        _ => kind_from_json(outer_type, "body field `type` (or `event.type`)")?,
    };
    Ok(Verdict::Event(VerifiedEvent {
        id,
        kind,
        payload: Value::Object(object),
        // The id is in the signed body; the signed timestamp bounds replays.
        replay_key: None,
        replay_scope: super::ReplayScope::Content,
    }))
}

/// The verdict for a form body (slash command or interactivity).
fn form_verdict(body: &[u8]) -> Result<Verdict, Rejection> {
    let mut form = form_to_json(decode_form(body)?);
    let kind = match form.get("payload") {
        Some(Value::String(text)) => {
            let inner = parse_json(text.as_bytes())?;
            let kind = kind_from_json(inner.get("type"), "the `payload` field's `type`")?;
            form.insert("payload".to_owned(), inner);
            kind
        }
        Some(_) => {
            return Err(Rejection::MalformedBody {
                reason: "more than one `payload` field",
            })
        }
        None => match form.get("command") {
            Some(Value::String(command)) => validate_kind(command)?,
            Some(_) => {
                return Err(Rejection::InvalidKind {
                    reason: "more than one `command` field",
                })
            }
            None => {
                return Err(Rejection::MissingKind {
                    location: "form field `command` or `payload`".to_owned(),
                })
            }
        },
    };
    Ok(Verdict::Event(VerifiedEvent {
        id: None,
        kind,
        payload: Value::Object(form),
        // The body (hashed into the dedup key) is signed; the timestamp bounds replays.
        replay_key: None,
        replay_scope: super::ReplayScope::Content,
    }))
}

impl Provider for Slack {
    fn name(&self) -> &'static str {
        "slack"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let (presented, timestamp_text, timestamp) = signed_headers(delivery.headers)?;
        verify_hmac_sha256(
            &self.secrets,
            &[
                VERSION.as_bytes(),
                b":",
                timestamp_text.as_bytes(),
                b":",
                delivery.body,
            ],
            &[presented],
        )?;
        check_tolerance(timestamp, delivery.now, self.tolerance)?;

        if is_form(media_type(delivery.headers)?.as_deref()) {
            form_verdict(delivery.body)
        } else {
            json_verdict(delivery.body)
        }
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        signed_headers(headers).map(drop)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        shortest(&self.secrets)
    }
}

/// The presented signature, and the signed timestamp as text and seconds.
fn signed_headers(headers: &http::HeaderMap) -> Result<(Vec<u8>, &str, i64), Rejection> {
    let presented = parse_signature(signature_header(headers, &SIGNATURE_HEADER)?)?;
    let (timestamp_text, timestamp) = timestamp_header(headers, &TIMESTAMP_HEADER)?;
    Ok((presented, timestamp_text, timestamp))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        assert_rejected, at, event, header_value, headers, hmac256, run, ten_kb,
    };
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const OTHER: &str = "0123456789abcdef0123456789abcdef";
    const NOW: i64 = 1_531_420_618;
    const FORM: &str = "application/x-www-form-urlencoded";

    /// Slack's documented example (signing secret, timestamp, slash-command
    /// body and signature), from
    /// https://api.slack.com/authentication/verifying-requests-from-slack
    /// (also at docs.slack.dev/authentication/verifying-requests-from-slack).
    const DOC_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const DOC_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    /// Independent signer.
    fn sig(secret: &str, ts: i64, body: &[u8]) -> String {
        let mut msg = format!("v0:{ts}:").into_bytes();
        msg.extend_from_slice(body);
        format!("v0={}", hex::encode(hmac256(secret.as_bytes(), &msg)))
    }

    fn provider() -> Slack {
        Slack::new([SECRET]).unwrap()
    }

    fn go(p: &Slack, h: &[(&str, &str)], body: &[u8], now: i64) -> Result<Verdict, Rejection> {
        run(p, &headers(h), body, "https://x/", at(now))
    }

    /// A correctly signed request at NOW with this content type.
    fn signed(ct: &str, body: &[u8]) -> Result<Verdict, Rejection> {
        let ts = NOW.to_string();
        let s = sig(SECRET, NOW, body);
        go(
            &provider(),
            &[
                ("X-Slack-Signature", &s),
                ("X-Slack-Request-Timestamp", &ts),
                ("Content-Type", ct),
            ],
            body,
            NOW,
        )
    }

    #[test]
    fn published_example() {
        assert_eq!(sig(SECRET, NOW, DOC_BODY.as_bytes()), DOC_SIG);
        let h = [
            ("X-Slack-Signature", DOC_SIG),
            ("X-Slack-Request-Timestamp", "1531420618"),
            ("Content-Type", FORM),
        ];
        let e = event(go(&provider(), &h, DOC_BODY.as_bytes(), NOW + 60));
        assert_eq!(e.id, None);
        assert_eq!(e.kind, "/webhook-collect");
        assert_eq!(e.payload["user_name"], json!("roadrunner"));
        assert_eq!(e.payload["text"], json!(""));
        assert_eq!(
            e.payload["response_url"],
            json!(
                "https://hooks.slack.com/commands/T1DC2JH3J/397700885554/96rGlfmibIGlgcZRskXaIFfN"
            )
        );
        let tampered = DOC_BODY.replace("roadrunner", "coyote");
        assert_rejected(
            go(&provider(), &h, tampered.as_bytes(), NOW),
            "bad_signature",
            401,
        );
    }

    #[test]
    fn event_callback_verifies() {
        let body = br#"{"type":"event_callback","event_id":"Ev08MFMKH6","event":{"type":"app_mention","text":"hi"}}"#;
        let e = event(signed("application/json", body));
        assert_eq!(e.id.as_deref(), Some("Ev08MFMKH6"));
        assert_eq!(e.kind, "app_mention");
        assert_eq!(e.payload["event"]["text"], json!("hi"));
        // Without event.type, the outer type is the kind.
        let body = br#"{"type":"event_callback","event_id":"Ev1","event":{}}"#;
        assert_eq!(
            event(signed("application/json", body)).kind,
            "event_callback"
        );
        // Other envelope types: id optional.
        let body = br#"{"type":"app_rate_limited","minute_rate_limited":1518467820}"#;
        let e = event(signed("application/json", body));
        assert_eq!((e.id, e.kind.as_str()), (None, "app_rate_limited"));
    }

    #[test]
    fn url_verification_is_a_handshake() {
        let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
        match signed("application/json", body) {
            Ok(Verdict::Handshake(v)) => assert_eq!(
                v,
                json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
            ),
            other => panic!("{other:?}"),
        }
        // Only after the signature verifies.
        let ts = NOW.to_string();
        let h = [
            ("X-Slack-Signature", sig(OTHER, NOW, body)),
            ("X-Slack-Request-Timestamp", ts.clone()),
        ];
        let h: Vec<(&str, &str)> = h.iter().map(|(a, b)| (*a, b.as_str())).collect();
        assert_rejected(go(&provider(), &h, body, NOW), "bad_signature", 401);
        assert_rejected(
            signed("application/json", br#"{"type":"url_verification"}"#),
            "malformed_body",
            400,
        );
    }

    #[test]
    fn interactivity_payload_is_parsed() {
        let inner = r#"{"type":"block_actions","user":{"id":"U1"},"actions":[]}"#;
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", inner)
            .finish();
        let e = event(signed(FORM, body.as_bytes()));
        assert_eq!(e.id, None);
        assert_eq!(e.kind, "block_actions");
        assert_eq!(e.payload["payload"]["user"]["id"], json!("U1"));
        assert_rejected(signed(FORM, b"payload=%7Bnope"), "malformed_body", 400);
        assert_rejected(signed(FORM, b"payload=%7B%7D"), "missing_kind", 400);
        assert_rejected(signed(FORM, b"payload=1&payload=2"), "malformed_body", 400);
    }

    #[test]
    fn any_of_several_secrets_verifies() {
        let p = Slack::new([OTHER, SECRET]).unwrap();
        let body = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#;
        let ts = NOW.to_string();
        for s in [OTHER, SECRET] {
            let sv = sig(s, NOW, body);
            event(go(
                &p,
                &[
                    ("X-Slack-Signature", &sv),
                    ("X-Slack-Request-Timestamp", &ts),
                ],
                body,
                NOW,
            ));
        }
    }

    #[test]
    fn tampered_wrong_secret_missing_duplicated() {
        let ts = NOW.to_string();
        let body = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#;
        let s = sig(SECRET, NOW, body);
        let p = provider();
        let ok = [
            ("X-Slack-Signature", s.as_str()),
            ("X-Slack-Request-Timestamp", ts.as_str()),
        ];
        event(go(&p, &ok, body, NOW));
        assert_rejected(
            go(&p, &ok, br#"{"type":"event_callback"}"#, NOW),
            "bad_signature",
            401,
        );
        let wrong = sig(OTHER, NOW, body);
        assert_rejected(
            go(
                &p,
                &[
                    ("X-Slack-Signature", &wrong),
                    ("X-Slack-Request-Timestamp", &ts),
                ],
                body,
                NOW,
            ),
            "bad_signature",
            401,
        );
        assert_rejected(
            go(&p, &[("X-Slack-Request-Timestamp", &ts)], body, NOW),
            "missing_signature",
            401,
        );
        assert_rejected(
            go(&p, &[("X-Slack-Signature", &s)], body, NOW),
            "missing_timestamp",
            401,
        );
        let dup = [ok[0], ok[0], ok[1]];
        assert_rejected(go(&p, &dup, body, NOW), "duplicate_header", 401);
        let dup = [ok[0], ok[1], ok[1]];
        assert_rejected(go(&p, &dup, body, NOW), "duplicate_header", 401);
    }

    #[test]
    fn stale_and_future_timestamps_are_401() {
        let body = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#;
        for (t, code) in [
            (NOW - 301, "stale_timestamp"),
            (NOW + 301, "future_timestamp"),
        ] {
            let s = sig(SECRET, t, body);
            let ts = t.to_string();
            let h = [
                ("X-Slack-Signature", s.as_str()),
                ("X-Slack-Request-Timestamp", ts.as_str()),
            ];
            assert_rejected(go(&provider(), &h, body, NOW), code, 401);
            let lenient = provider().with_tolerance(Duration::from_secs(400));
            event(go(&lenient, &h, body, NOW));
        }
    }

    #[test]
    fn malformed_signatures_and_timestamps_are_401() {
        let body = b"{}";
        let s = sig(SECRET, NOW, body);
        let h = s.trim_start_matches("v0=").to_owned();
        let ts = NOW.to_string();
        for bad in [
            h.clone(),
            format!("v1={h}"),
            format!("v0={}", &h[..10]),
            format!("v0=zz{}", &h[2..]),
            "v0=".to_owned(),
            format!("v0={h},v0={h}"),
        ] {
            let hh = [
                ("X-Slack-Signature", bad.as_str()),
                ("X-Slack-Request-Timestamp", ts.as_str()),
            ];
            assert_rejected(go(&provider(), &hh, body, NOW), "malformed_signature", 401);
        }
        for bad_ts in ["abc", "", "0x10", "1531420618.5", " 1531420618"] {
            let hh = [
                ("X-Slack-Signature", s.as_str()),
                ("X-Slack-Request-Timestamp", bad_ts),
            ];
            assert_rejected(go(&provider(), &hh, body, NOW), "malformed_timestamp", 401);
        }
    }

    #[test]
    fn missing_or_bad_id_and_kind_are_400() {
        let j = "application/json";
        assert_rejected(
            signed(
                j,
                br#"{"type":"event_callback","event":{"type":"message"}}"#,
            ),
            "missing_id",
            400,
        );
        assert_rejected(signed(j, br#"{"event_id":"Ev1"}"#), "missing_kind", 400);
        assert_rejected(
            signed(
                j,
                br#"{"type":"event_callback","event_id":"Ev\u0001","event":{"type":"m"}}"#,
            ),
            "invalid_id",
            400,
        );
        let long =
            json!({"type":"event_callback","event_id": ten_kb(),"event":{"type":"m"}}).to_string();
        assert_rejected(signed(j, long.as_bytes()), "invalid_id", 400);
        assert_rejected(signed(FORM, b"text=hello"), "missing_kind", 400);
        assert_rejected(signed(FORM, b"command=%2Fa%0Ab"), "invalid_kind", 400);
    }

    #[test]
    fn correctly_signed_garbage_is_400() {
        assert_rejected(
            signed("application/json", b"token=abc"),
            "malformed_body",
            400,
        );
        assert_rejected(
            signed("application/json", b"\xff\xfe"),
            "malformed_body",
            400,
        );
        assert_rejected(
            signed(FORM, b"command=%2Fa&text=%FF"),
            "malformed_body",
            400,
        );
        assert_rejected(signed(FORM, b"command=/a\xff"), "malformed_body", 400);
    }

    proptest! {
        #[test]
        fn arbitrary_headers_and_bodies_never_panic(
            sig_bytes in proptest::collection::vec(any::<u8>(), 0..100),
            text in "(v0=)?[0-9a-f]{0,70}",
            ts in proptest::collection::vec(any::<u8>(), 0..20),
            ct in prop_oneof![Just(FORM), Just("application/json"), Just("text/plain")],
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let _ = parse_signature(&text);
            let _ = form_verdict(&body);
            let _ = json_verdict(&body);
            for sig_value in [header_value(&sig_bytes), header_value(text.as_bytes())].into_iter().flatten() {
                let mut h = http::HeaderMap::new();
                h.insert(SIGNATURE_HEADER, sig_value);
                if let Some(v) = header_value(&ts) { h.insert(TIMESTAMP_HEADER, v); }
                h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(ct));
                let r = provider().verify(&Delivery { headers: &h, body: &body, public_url: "", now: at(NOW) });
                prop_assert!(r.is_err());
            }
        }

        /// Correctly signed arbitrary bodies are verified, then either
        /// accepted or refused with a 400, never a panic.
        #[test]
        fn signed_arbitrary_bodies_are_never_401(
            ct in prop_oneof![Just(FORM), Just("application/json")],
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            if let Err(r) = signed(ct, &body) {
                prop_assert_eq!(r.status().as_u16(), 400);
            }
        }
    }
}
