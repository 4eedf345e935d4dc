//! Shopify webhook signatures.
//!
//! Scheme: `X-Shopify-Hmac-Sha256: <base64>`, the standard (padded) base64
//! HMAC-SHA256 of the raw body keyed with the app's client secret (its bytes
//! as-is). One signature per delivery; several configured secrets support
//! rotation. Shopify signs no timestamp.
//!
//! The kind is the `X-Shopify-Topic` header (e.g. `orders/create`),
//! required. The event id: where the `X-Shopify-Event-Id` header is present
//! (Shopify sends it with every delivery: "a unique ID shared across all
//! deliveries produced by the same merchant action"), `event:<event
//! id>:<topic>`, followed by `:<id>` when the body has a top-level `id`;
//! otherwise the `X-Shopify-Webhook-Id` header (one per delivery, kept by
//! its retries), which is required either way. One merchant action sends
//! several topics under one event id (`orders/create` and `orders/paid` of
//! an order paid at checkout), hence the topic; Shopify does not say that
//! an action touching several resources (a bulk edit) sends them apart, hence
//! the resource's `id`. So a retry, and the same event sent again to a second
//! subscription of the same topic (Shopify's "ignore duplicates" guide), are
//! duplicates, even when their bodies differ (another API version).
//!
//! The body is JSON. None of these headers is signed: the verdict's replay
//! key is derived from the verified signature, with
//! [`ReplayScope::HandledKind`]: the receiver scopes it by the topic for the
//! topics a handler of the source takes, because Shopify sends one
//! byte-identical body under several topics and each must run. A captured
//! body re-sent under a fresh id can so run at most once per handled topic,
//! never more; under a topic no handler takes it records nothing
//! (docs/receiver.md, "Byte-identical bodies"). The topic is not signed: a
//! decision about money must read the signed body (`financial_status`), not
//! the topic.
//!
//! Documentation: <https://shopify.dev/docs/apps/build/webhooks/subscribe/https>,
//! <https://shopify.dev/docs/apps/build/webhooks/delivery-structure> (the
//! headers), <https://shopify.dev/docs/apps/build/webhooks/ignore-duplicates>.

use base64::Engine as _;
use http::HeaderName;

use super::body::parse_json;
use super::signature::{
    id_from_header, kind_from_header, optional_id_header, plain_secrets, replay_key, shortest,
    signature_header, verify_hmac_sha256, Secret,
};
use super::{
    Delivery, Provider, ProviderConfigError, Rejection, ReplayScope, Verdict, VerifiedEvent,
    MAX_ID_BYTES,
};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-shopify-hmac-sha256");
/// The header carrying the webhook (delivery) id.
pub const WEBHOOK_ID_HEADER: HeaderName = HeaderName::from_static("x-shopify-webhook-id");
/// The header carrying the topic.
pub const TOPIC_HEADER: HeaderName = HeaderName::from_static("x-shopify-topic");
/// The header carrying the id shared by every delivery of one merchant
/// action (several topics, several subscriptions, every retry).
pub const EVENT_ID_HEADER: HeaderName = HeaderName::from_static("x-shopify-event-id");

/// Prefix of an event id made from `X-Shopify-Event-Id`.
pub const EVENT_ID_PREFIX: &str = "event:";

/// Length of an HMAC-SHA256 digest, in bytes.
const DIGEST_BYTES: usize = 32;

/// Verifies Shopify deliveries.
#[derive(Debug, Clone)]
pub struct Shopify {
    secrets: Vec<Secret>,
}

impl Shopify {
    /// A verifier for these client secrets (used as-is). Several secrets
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

/// The digest in a base64 header value.
fn parse_signature(value: &str) -> Result<Vec<u8>, Rejection> {
    let malformed = |reason| Rejection::MalformedSignature {
        header: SIGNATURE_HEADER.as_str().to_owned(),
        reason,
    };
    let sig = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| malformed("not base64"))?;
    if sig.len() != DIGEST_BYTES {
        return Err(malformed("not a 32-byte digest"));
    }
    Ok(sig)
}

impl Provider for Shopify {
    fn name(&self) -> &'static str {
        "shopify"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let presented = presented(delivery.headers)?;
        verify_hmac_sha256(
            &self.secrets,
            &[delivery.body],
            std::slice::from_ref(&presented),
        )?;
        let webhook_id = id_from_header(delivery.headers, &WEBHOOK_ID_HEADER)?;
        let event_id = optional_id_header(delivery.headers, &EVENT_ID_HEADER)?;
        let kind = kind_from_header(delivery.headers, &TOPIC_HEADER)?;
        let payload = parse_json(delivery.body)?;
        let id = match event_id {
            Some(event_id) => event_dedup_key(&event_id, &kind, &payload),
            None => webhook_id,
        };
        // The signature makes the replay key; the receiver scopes it by the
        // (unsigned) topic for the topics a handler takes, so that the
        // topics Shopify sends one body under each run once, and a copy under
        // any other topic is still the content recorded before.
        Ok(Verdict::Event(VerifiedEvent {
            id: Some(id),
            kind,
            payload,
            replay_key: Some(replay_key(&[], &presented)),
            replay_scope: ReplayScope::HandledKind,
        }))
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        presented(headers).map(drop)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        shortest(&self.secrets)
    }
}

/// The event id of a delivery with an `X-Shopify-Event-Id`: the prefix, the
/// event id, the topic and, when the body has a top-level `id` (a number, or
/// a string of 1 to [`MAX_ID_BYTES`] visible ASCII characters, as event ids
/// are everywhere: they end up in idempotency keys and headers), that id,
/// joined by `:`.
fn event_dedup_key(event_id: &str, topic: &str, payload: &serde_json::Value) -> String {
    let mut key = format!("{EVENT_ID_PREFIX}{event_id}:{topic}");
    match payload.get("id") {
        Some(serde_json::Value::Number(number)) => {
            key.push(':');
            key.push_str(&number.to_string());
        }
        Some(serde_json::Value::String(text))
            if !text.is_empty()
                && text.len() <= MAX_ID_BYTES
                && text.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            key.push(':');
            key.push_str(text);
        }
        _ => {}
    }
    key
}

/// The presented digest, from the signature header.
fn presented(headers: &http::HeaderMap) -> Result<Vec<u8>, Rejection> {
    parse_signature(signature_header(headers, &SIGNATURE_HEADER)?)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        assert_rejected, at, b64, event, header_value, headers, hmac256, run, ten_kb,
    };
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const SECRET: &str = "shpss_0123456789abcdef";
    const NEXT: &str = "shpss_fedcba9876543210";
    const ID: &str = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043";
    const BODY: &str =
        r#"{"id":820982911946154508,"email":"jon@example.com","total_price":"11.00"}"#;

    /// Independent signer.
    fn sig(secret: &str, body: &[u8]) -> String {
        b64(&hmac256(secret.as_bytes(), body))
    }

    fn provider() -> Shopify {
        Shopify::new([SECRET]).unwrap()
    }

    fn go(p: &Shopify, h: &[(&str, &str)], body: &[u8]) -> Result<Verdict, Rejection> {
        run(p, &headers(h), body, "https://x/", at(0))
    }

    fn order(sig_value: &str, body: &[u8]) -> Result<Verdict, Rejection> {
        go(
            &provider(),
            &[
                ("X-Shopify-Hmac-Sha256", sig_value),
                ("X-Shopify-Webhook-Id", ID),
                ("X-Shopify-Topic", "orders/create"),
            ],
            body,
        )
    }

    #[test]
    fn valid_delivery_verifies() {
        let e = event(order(&sig(SECRET, BODY.as_bytes()), BODY.as_bytes()));
        assert_eq!(e.id.as_deref(), Some(ID));
        assert_eq!(e.kind, "orders/create");
        assert_eq!(e.payload["email"], json!("jon@example.com"));
    }

    /// The replay key the verifier gives is the signature's alone: neither
    /// the unsigned webhook id nor the unsigned topic changes it (the
    /// receiver scopes it by the topics a handler takes).
    #[test]
    fn the_replay_key_ignores_the_unsigned_topic_and_id() {
        let s = sig(SECRET, BODY.as_bytes());
        let key = |id: &str, topic: &str| {
            event(go(
                &provider(),
                &[
                    ("X-Shopify-Hmac-Sha256", &s),
                    ("X-Shopify-Webhook-Id", id),
                    ("X-Shopify-Topic", topic),
                ],
                BODY.as_bytes(),
            ))
            .replay_key
        };
        let first = key(ID, "orders/create");
        assert!(first.is_some());
        for (id, topic) in [
            ("wh-2", "Orders/create"),
            ("wh-3", "x1"),
            ("wh-4", "orders/paid"),
        ] {
            assert_eq!(key(id, topic), first, "{id} {topic}");
        }
        let other = r#"{"id":2}"#;
        let e = event(order(&sig(SECRET, other.as_bytes()), other.as_bytes()));
        assert_ne!(e.replay_key, first);
    }

    /// Shopify's topic header is not signed, and one body comes under
    /// several topics: the verdict asks the receiver to scope the key by the
    /// topics a handler takes.
    #[test]
    fn the_replay_key_is_scoped_by_handled_topic() {
        let e = event(order(&sig(SECRET, BODY.as_bytes()), BODY.as_bytes()));
        assert_eq!(e.replay_scope, ReplayScope::HandledKind);
    }

    fn with_event_id(event_id: Option<&str>, webhook_id: &str, topic: &str, body: &str) -> String {
        let s = sig(SECRET, body.as_bytes());
        let mut h = vec![
            ("X-Shopify-Hmac-Sha256", s.as_str()),
            ("X-Shopify-Webhook-Id", webhook_id),
            ("X-Shopify-Topic", topic),
        ];
        if let Some(event_id) = event_id {
            h.push(("X-Shopify-Event-Id", event_id));
        }
        event(go(&provider(), &h, body.as_bytes())).id.unwrap()
    }

    /// With `X-Shopify-Event-Id`, the event id is the event's, scoped by
    /// the topic and the body's `id`: every delivery of one event and topic
    /// (a retry, a second subscription, another API version's body) is one
    /// event, the topics of one merchant action are apart, and so are the
    /// resources of one action. Without it, the webhook id.
    #[test]
    fn the_event_id_header_is_the_id_scoped_by_topic_and_resource() {
        const EVENT: &str = "7b8c9d0a-1234-5678-90ab-cdef12345678";
        let create = with_event_id(Some(EVENT), ID, "orders/create", BODY);
        assert_eq!(
            create,
            format!("event:{EVENT}:orders/create:820982911946154508")
        );
        // A second subscription's delivery: another webhook id, another
        // API version's body, the same event.
        let newer =
            r#"{"id":820982911946154508,"email":"jon@example.com","total_price":"11.00","x":1}"#;
        assert_eq!(
            with_event_id(Some(EVENT), "wh-2", "orders/create", newer),
            create
        );
        // Another topic of the same action; another resource of it.
        let paid = with_event_id(Some(EVENT), "wh-3", "orders/paid", BODY);
        assert_eq!(
            paid,
            format!("event:{EVENT}:orders/paid:820982911946154508")
        );
        let other = with_event_id(Some(EVENT), "wh-4", "orders/create", r#"{"id":"gid-9"}"#);
        assert_eq!(other, format!("event:{EVENT}:orders/create:gid-9"));
        // No usable `id` in the body: the event and the topic.
        for body in [
            r#"{"shop_id":1}"#,
            r#"{"id":""}"#,
            r#"{"id":"a b"}"#,
            r#"{"id":null}"#,
            "[1]",
        ] {
            assert_eq!(
                with_event_id(Some(EVENT), ID, "shop/redact", body),
                format!("event:{EVENT}:shop/redact"),
                "{body}"
            );
        }
        // No event id header: the webhook id, as before.
        assert_eq!(with_event_id(None, ID, "orders/create", BODY), ID);
    }

    /// The event id header is read like the webhook id: once, visible ASCII.
    #[test]
    fn a_duplicated_or_bad_event_id_header_is_refused() {
        let s = sig(SECRET, BODY.as_bytes());
        let base = [
            ("X-Shopify-Hmac-Sha256", s.as_str()),
            ("X-Shopify-Webhook-Id", ID),
            ("X-Shopify-Topic", "orders/create"),
        ];
        let twice = [
            &base[..],
            &[("X-Shopify-Event-Id", "e1"), ("X-Shopify-Event-Id", "e2")],
        ]
        .concat();
        assert_rejected(
            go(&provider(), &twice, BODY.as_bytes()),
            "duplicate_header",
            401,
        );
        let long = ten_kb();
        let bad = [&base[..], &[("X-Shopify-Event-Id", long.as_str())]].concat();
        assert_rejected(go(&provider(), &bad, BODY.as_bytes()), "invalid_id", 400);
    }

    #[test]
    fn any_of_several_secrets_verifies() {
        let p = Shopify::new([SECRET, NEXT]).unwrap();
        for s in [SECRET, NEXT] {
            event(go(
                &p,
                &[
                    ("X-Shopify-Hmac-Sha256", &sig(s, BODY.as_bytes())),
                    ("X-Shopify-Webhook-Id", ID),
                    ("X-Shopify-Topic", "orders/create"),
                ],
                BODY.as_bytes(),
            ));
        }
    }

    #[test]
    fn tampered_body_and_wrong_secret_are_401() {
        let s = sig(SECRET, BODY.as_bytes());
        assert_rejected(order(&s, b"{\"id\":1}"), "bad_signature", 401);
        assert_rejected(
            order(&sig("other", BODY.as_bytes()), BODY.as_bytes()),
            "bad_signature",
            401,
        );
    }

    #[test]
    fn missing_and_duplicated_signature_are_401() {
        let r = go(
            &provider(),
            &[
                ("X-Shopify-Webhook-Id", ID),
                ("X-Shopify-Topic", "orders/create"),
            ],
            BODY.as_bytes(),
        );
        assert_rejected(r, "missing_signature", 401);
        let s = sig(SECRET, BODY.as_bytes());
        let r = go(
            &provider(),
            &[
                ("X-Shopify-Hmac-Sha256", &s),
                ("X-Shopify-Hmac-Sha256", &s),
                ("X-Shopify-Webhook-Id", ID),
                ("X-Shopify-Topic", "orders/create"),
            ],
            BODY.as_bytes(),
        );
        assert_rejected(r, "duplicate_header", 401);
    }

    /// A duplicated id header is refused as well (401 `duplicate_header`).
    #[test]
    fn duplicated_id_header_is_401() {
        let s = sig(SECRET, BODY.as_bytes());
        let r = go(
            &provider(),
            &[
                ("X-Shopify-Hmac-Sha256", &s),
                ("X-Shopify-Webhook-Id", ID),
                ("X-Shopify-Webhook-Id", "other"),
                ("X-Shopify-Topic", "orders/create"),
            ],
            BODY.as_bytes(),
        );
        assert_rejected(r, "duplicate_header", 401);
    }

    #[test]
    fn malformed_signatures_are_401() {
        let s = sig(SECRET, BODY.as_bytes());
        let raw = hmac256(SECRET.as_bytes(), BODY.as_bytes());
        for bad in [
            "%%%%".to_owned(),
            s[..40].to_owned(),
            b64(&raw[..31]),
            b64(&[raw.clone(), vec![0]].concat()),
            hex::encode(&raw),
            base64::engine::general_purpose::URL_SAFE.encode([0xfbu8; 32]),
            String::new(),
        ] {
            assert_rejected(order(&bad, BODY.as_bytes()), "malformed_signature", 401);
        }
    }

    fn with_meta(id: Option<&str>, kind: Option<&str>) -> Result<Verdict, Rejection> {
        let s = sig(SECRET, BODY.as_bytes());
        let mut h = vec![("X-Shopify-Hmac-Sha256", s.as_str())];
        if let Some(id) = id {
            h.push(("X-Shopify-Webhook-Id", id));
        }
        if let Some(kind) = kind {
            h.push(("X-Shopify-Topic", kind));
        }
        go(&provider(), &h, BODY.as_bytes())
    }

    #[test]
    fn missing_or_bad_id_and_kind_are_400() {
        assert_rejected(with_meta(None, Some("orders/create")), "missing_id", 400);
        assert_rejected(with_meta(Some(ID), None), "missing_kind", 400);
        assert_rejected(
            with_meta(Some("a\tb"), Some("orders/create")),
            "invalid_id",
            400,
        );
        assert_rejected(
            with_meta(Some(&ten_kb()), Some("orders/create")),
            "invalid_id",
            400,
        );
        assert_rejected(with_meta(Some(ID), Some("a\tb")), "invalid_kind", 400);
        assert_rejected(with_meta(Some(ID), Some(&ten_kb())), "invalid_kind", 400);
    }

    #[test]
    fn correctly_signed_garbage_is_400() {
        for body in [&b"<xml/>"[..], b"\"\xff\""] {
            assert_rejected(order(&sig(SECRET, body), body), "malformed_body", 400);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_headers_and_bodies_never_panic(
            header in proptest::collection::vec(any::<u8>(), 0..120),
            text in "[A-Za-z0-9+/=_ -]{0,60}",
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let _ = parse_signature(&text);
            for value in [header_value(&header), header_value(text.as_bytes())].into_iter().flatten() {
                let mut h = http::HeaderMap::new();
                h.insert(SIGNATURE_HEADER, value);
                h.insert(WEBHOOK_ID_HEADER, http::HeaderValue::from_static("i"));
                h.insert(TOPIC_HEADER, http::HeaderValue::from_static("t"));
                let r = provider().verify(&Delivery { headers: &h, body: &body, public_url: "", now: at(0) });
                prop_assert!(r.is_err());
            }
        }
    }
}
