//! GitHub webhook signatures.
//!
//! Scheme: `X-Hub-Signature-256: sha256=<hex>`, the hex HMAC-SHA256 of the raw
//! body keyed with the webhook secret. One signature per delivery; several
//! configured secrets support rotation. There is no timestamp (GitHub signs
//! none), and the delivery id and event name headers are not signed: so the
//! verdict's replay key is derived from the verified signature (the body
//! alone), and the same signed body sent again under a new delivery id, or
//! with another event name, is a duplicate for as long as the event is kept.
//!
//! The event id is the `X-GitHub-Delivery` header, the kind the
//! `X-GitHub-Event` header (both required). A hook configured with content
//! type `application/x-www-form-urlencoded` sends the JSON in a `payload=`
//! form field: the payload is then that field's JSON (not the form wrapper).
//! Any other Content-Type is parsed as JSON. GitHub's `ping` is an ordinary
//! event of kind `ping`. The legacy SHA-1 `X-Hub-Signature` is not accepted.
//!
//! Documentation: <https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries>

use http::HeaderName;

use super::body::{decode_form, is_form, media_type, parse_json};
use super::signature::{
    id_from_header, kind_from_header, plain_secrets, replay_key, shortest, signature_header,
    verify_hmac_sha256, Secret,
};
use super::{Delivery, Provider, ProviderConfigError, Rejection, Verdict, VerifiedEvent};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-hub-signature-256");
/// The header carrying the delivery id.
pub const DELIVERY_HEADER: HeaderName = HeaderName::from_static("x-github-delivery");
/// The header carrying the event name.
pub const EVENT_HEADER: HeaderName = HeaderName::from_static("x-github-event");

/// The prefix in front of the hex signature.
const PREFIX: &str = "sha256=";
/// Length of an HMAC-SHA256 digest, in bytes.
const DIGEST_BYTES: usize = 32;

/// Verifies GitHub deliveries.
#[derive(Debug, Clone)]
pub struct GitHub {
    secrets: Vec<Secret>,
}

impl GitHub {
    /// A verifier for these webhook secrets (used as-is). Several secrets
    /// support rotation: a delivery verifies if any matches.
    pub fn new<I, S>(secrets: I) -> Result<Self, ProviderConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            secrets: plain_secrets(secrets)?,
        })
    }
}

fn malformed(reason: &'static str) -> Rejection {
    Rejection::MalformedSignature {
        header: SIGNATURE_HEADER.as_str().to_owned(),
        reason,
    }
}

/// The presented digest, from the signature header.
fn presented(headers: &http::HeaderMap) -> Result<Vec<u8>, Rejection> {
    parse_signature(signature_header(headers, &SIGNATURE_HEADER)?)
}

/// The digest in `sha256=<64 hex digits>`.
fn parse_signature(value: &str) -> Result<Vec<u8>, Rejection> {
    let hex_part = value
        .strip_prefix(PREFIX)
        .ok_or_else(|| malformed("does not start with `sha256=`"))?;
    let sig = hex::decode(hex_part).map_err(|_| malformed("not hex after `sha256=`"))?;
    if sig.len() != DIGEST_BYTES {
        return Err(malformed("not 64 hex digits after `sha256=`"));
    }
    Ok(sig)
}

impl Provider for GitHub {
    fn name(&self) -> &'static str {
        "github"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let presented = presented(delivery.headers)?;
        verify_hmac_sha256(
            &self.secrets,
            &[delivery.body],
            std::slice::from_ref(&presented),
        )?;

        let id = id_from_header(delivery.headers, &DELIVERY_HEADER)?;
        let kind = kind_from_header(delivery.headers, &EVENT_HEADER)?;
        let payload = if is_form(media_type(delivery.headers)?.as_deref()) {
            let fields = decode_form(delivery.body)?;
            let mut payloads = fields.iter().filter(|(name, _)| name == "payload");
            let json = match (payloads.next(), payloads.next()) {
                (Some((_, json)), None) => json,
                (None, _) => {
                    return Err(Rejection::MalformedBody {
                        reason: "form body has no `payload` field",
                    })
                }
                (Some(_), Some(_)) => {
                    return Err(Rejection::MalformedBody {
                        reason: "form body has more than one `payload` field",
                    })
                }
            };
            parse_json(json.as_bytes())?
        } else {
            parse_json(delivery.body)?
        };
        Ok(Verdict::Event(VerifiedEvent {
            id: Some(id),
            kind,
            payload,
            // Neither the id nor the event name is signed: the body alone.
            replay_key: Some(replay_key(&[], &presented)),
            replay_scope: super::ReplayScope::Content,
        }))
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        presented(headers).map(drop)
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

    const SECRET: &str = "gh-secret-2024";
    const OLD: &str = "gh-secret-2023";
    const ID: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    const BODY: &str = r#"{"ref":"refs/heads/main","repository":{"full_name":"o/r"}}"#;

    /// Independent signer.
    fn sig(secret: &str, body: &[u8]) -> String {
        format!("sha256={}", hex::encode(hmac256(secret.as_bytes(), body)))
    }

    fn provider() -> GitHub {
        GitHub::new([SECRET]).unwrap()
    }

    fn go(p: &GitHub, extra: &[(&str, &str)], body: &[u8]) -> Result<Verdict, Rejection> {
        run(p, &headers(extra), body, "https://x/", at(0))
    }

    fn push(sig_value: &str, body: &[u8]) -> Result<Verdict, Rejection> {
        go(
            &provider(),
            &[
                ("X-Hub-Signature-256", sig_value),
                ("X-GitHub-Delivery", ID),
                ("X-GitHub-Event", "push"),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    }

    /// GitHub's documented test values: secret "It's a Secret to Everybody",
    /// payload "Hello, World!", signature below. Source:
    /// https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    /// (the payload is not JSON, so the verified delivery is then a 400).
    #[test]
    fn published_example() {
        let p = GitHub::new(["It's a Secret to Everybody"]).unwrap();
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let h = [
            ("X-Hub-Signature-256", sig),
            ("X-GitHub-Delivery", ID),
            ("X-GitHub-Event", "push"),
        ];
        assert_rejected(go(&p, &h, b"Hello, World!"), "malformed_body", 400);
        assert_rejected(go(&p, &h, b"Hello, World?"), "bad_signature", 401);
    }

    #[test]
    fn valid_delivery_verifies() {
        let e = event(push(&sig(SECRET, BODY.as_bytes()), BODY.as_bytes()));
        assert_eq!(e.id.as_deref(), Some(ID));
        assert_eq!(e.kind, "push");
        assert_eq!(
            e.payload,
            serde_json::from_str::<serde_json::Value>(BODY).unwrap()
        );
    }

    #[test]
    fn ping_is_an_event() {
        let body = br#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
        let e = event(go(
            &provider(),
            &[
                ("X-Hub-Signature-256", &sig(SECRET, body)),
                ("X-GitHub-Delivery", ID),
                ("X-GitHub-Event", "ping"),
            ],
            body,
        ));
        assert_eq!(e.kind, "ping");
        assert_eq!(e.payload["hook_id"], json!(1));
    }

    #[test]
    fn form_encoded_payload_is_parsed() {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", BODY)
            .finish();
        let e = event(go(
            &provider(),
            &[
                ("X-Hub-Signature-256", &sig(SECRET, body.as_bytes())),
                ("X-GitHub-Delivery", ID),
                ("X-GitHub-Event", "push"),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body.as_bytes(),
        ));
        assert_eq!(e.payload["repository"]["full_name"], json!("o/r"));
    }

    #[test]
    fn bad_form_bodies_are_400() {
        for body in [
            &b"other=1"[..],
            b"payload=%7B",
            b"payload=%FF",
            b"payload=1&payload=2",
        ] {
            let r = go(
                &provider(),
                &[
                    ("X-Hub-Signature-256", &sig(SECRET, body)),
                    ("X-GitHub-Delivery", ID),
                    ("X-GitHub-Event", "push"),
                    ("Content-Type", "application/x-www-form-urlencoded"),
                ],
                body,
            );
            assert_rejected(r, "malformed_body", 400);
        }
    }

    #[test]
    fn any_of_several_secrets_verifies() {
        let p = GitHub::new([SECRET, OLD]).unwrap();
        for s in [SECRET, OLD] {
            let r = go(
                &p,
                &[
                    ("X-Hub-Signature-256", &sig(s, BODY.as_bytes())),
                    ("X-GitHub-Delivery", ID),
                    ("X-GitHub-Event", "push"),
                ],
                BODY.as_bytes(),
            );
            event(r);
        }
    }

    #[test]
    fn tampered_body_and_wrong_secret_are_401() {
        let s = sig(SECRET, BODY.as_bytes());
        assert_rejected(push(&s, b"{\"ref\":\"x\"}"), "bad_signature", 401);
        assert_rejected(
            push(&sig("nope", BODY.as_bytes()), BODY.as_bytes()),
            "bad_signature",
            401,
        );
    }

    #[test]
    fn missing_and_duplicated_signature_are_401() {
        let r = go(
            &provider(),
            &[("X-GitHub-Delivery", ID), ("X-GitHub-Event", "push")],
            BODY.as_bytes(),
        );
        assert_rejected(r, "missing_signature", 401);
        let s = sig(SECRET, BODY.as_bytes());
        let r = go(
            &provider(),
            &[
                ("X-Hub-Signature-256", &s),
                ("X-Hub-Signature-256", &s),
                ("X-GitHub-Delivery", ID),
                ("X-GitHub-Event", "push"),
            ],
            BODY.as_bytes(),
        );
        assert_rejected(r, "duplicate_header", 401);
    }

    #[test]
    fn malformed_signatures_are_401() {
        let s = sig(SECRET, BODY.as_bytes());
        let hexpart = s.trim_start_matches("sha256=").to_owned();
        for bad in [
            hexpart.clone(),
            format!("sha1={hexpart}"),
            format!("sha256={}", &hexpart[..63]),
            format!("sha256={hexpart}00"),
            format!("sha256=zz{}", &hexpart[2..]),
            "sha256=".to_owned(),
            format!("SHA256={hexpart}"),
        ] {
            assert_rejected(push(&bad, BODY.as_bytes()), "malformed_signature", 401);
        }
    }

    fn with_meta(id: Option<&str>, kind: Option<&str>) -> Result<Verdict, Rejection> {
        let s = sig(SECRET, BODY.as_bytes());
        let mut h = vec![("X-Hub-Signature-256", s.as_str())];
        if let Some(id) = id {
            h.push(("X-GitHub-Delivery", id));
        }
        if let Some(kind) = kind {
            h.push(("X-GitHub-Event", kind));
        }
        go(&provider(), &h, BODY.as_bytes())
    }

    #[test]
    fn missing_or_bad_id_and_kind_are_400() {
        assert_rejected(with_meta(None, Some("push")), "missing_id", 400);
        assert_rejected(with_meta(Some(ID), None), "missing_kind", 400);
        assert_rejected(with_meta(Some("a\tb"), Some("push")), "invalid_id", 400);
        assert_rejected(with_meta(Some(&ten_kb()), Some("push")), "invalid_id", 400);
        assert_rejected(with_meta(Some(ID), Some(&ten_kb())), "invalid_kind", 400);
        assert_rejected(with_meta(Some(""), Some("push")), "invalid_id", 400);
        // Non-ASCII header bytes.
        let s = sig(SECRET, BODY.as_bytes());
        let mut h = headers(&[("X-Hub-Signature-256", &s), ("X-GitHub-Event", "push")]);
        h.insert(
            DELIVERY_HEADER,
            http::HeaderValue::from_bytes(b"id\xff").unwrap(),
        );
        assert_rejected(
            run(&provider(), &h, BODY.as_bytes(), "", at(0)),
            "invalid_id",
            400,
        );
    }

    #[test]
    fn correctly_signed_garbage_is_400() {
        for body in [&b"not json"[..], b"{\"a\":\"\xff\"}"] {
            assert_rejected(push(&sig(SECRET, body), body), "malformed_body", 400);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_headers_and_bodies_never_panic(
            header in proptest::collection::vec(any::<u8>(), 0..200),
            text in "(sha256=)?[0-9a-fA-Fz]{0,70}",
            ct in proptest::collection::vec(any::<u8>(), 0..60),
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let _ = parse_signature(&text);
            for value in [header_value(&header), header_value(text.as_bytes())].into_iter().flatten() {
                let mut h = http::HeaderMap::new();
                h.insert(SIGNATURE_HEADER, value);
                h.insert(DELIVERY_HEADER, http::HeaderValue::from_static("d"));
                h.insert(EVENT_HEADER, http::HeaderValue::from_static("push"));
                if let Some(ct) = header_value(&ct) {
                    h.insert(http::header::CONTENT_TYPE, ct);
                }
                let r = provider().verify(&Delivery { headers: &h, body: &body, public_url: "", now: at(0) });
                prop_assert!(r.is_err());
            }
        }
    }
}
