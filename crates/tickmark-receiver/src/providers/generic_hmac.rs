//! Generic HMAC signatures, for in-house producers.
//!
//! Scheme (all configured): one header carries one signature, optionally
//! behind a fixed prefix (e.g. `sha256=`), encoded as hex (either case) or
//! standard padded base64; the signature is the HMAC of the raw body with
//! SHA-1, SHA-256 or SHA-512, keyed with the secret's bytes as-is. Several
//! secrets support rotation. There is no timestamp, so replay protection
//! rests on the event id; and when the id comes from a header (which the
//! signature does not cover), also on a replay key derived from the verified
//! signature alone: the same signed body sent again under a new id, whatever
//! kind header comes with it, is a duplicate for as long as the event is
//! kept. So two deliveries with byte-identical bodies are one event when the
//! id is in a header (put something that differs, an id or a timestamp, in
//! the signed body to tell them apart).
//!
//! The body is JSON, or, with Content-Type
//! `application/x-www-form-urlencoded`, a form that becomes a JSON object of
//! string fields. The event id comes from a configured header or a JSON
//! pointer into the (parsed) body (a string, or an integer rendered in
//! decimal); with no id source configured the id is `None` (the engine then
//! uses the body hash). The kind comes from a configured header or JSON
//! pointer (a string), or is the configured default kind (`"webhook"` unless
//! set) when no kind source is configured. A configured source that is
//! absent from the delivery is 400 `missing_id` / `missing_kind`.
//!
//! Documentation: HMAC is RFC 2104, <https://www.rfc-editor.org/rfc/rfc2104>;
//! JSON pointers are RFC 6901, <https://www.rfc-editor.org/rfc/rfc6901>.

use std::fmt;

use base64::Engine as _;
use http::HeaderName;
use serde::Deserialize;
use serde_json::Value;

use super::body::{decode_form, form_to_json, is_form, media_type, parse_json};
use super::signature::{
    any_match, hmac_sha1, hmac_sha256, hmac_sha512, id_from_header, is_valid_kind,
    kind_from_header, kind_from_json, plain_secrets, replay_key, shortest, signature_header,
    validate_id, Secret,
};
use super::{Delivery, Provider, ProviderConfigError, Rejection, Verdict, VerifiedEvent};

/// The kind given to every event when no kind source is configured and no
/// other default is set.
pub const DEFAULT_KIND: &str = "webhook";

/// The HMAC hash function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// HMAC-SHA1 (20-byte digest).
    Sha1,
    /// HMAC-SHA256 (32-byte digest).
    Sha256,
    /// HMAC-SHA512 (64-byte digest).
    Sha512,
}

impl Algorithm {
    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha256 => 32,
            Self::Sha512 => 64,
        }
    }

    fn mac(self, key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
        match self {
            Self::Sha1 => hmac_sha1(key, &[data]),
            Self::Sha256 => hmac_sha256(key, &[data]),
            Self::Sha512 => hmac_sha512(key, &[data]),
        }
    }
}

/// How the signature bytes are written in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Hexadecimal, either case.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

/// Where to find the event id or kind.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldSource {
    /// A request header, by name.
    Header(String),
    /// An RFC 6901 JSON pointer into the parsed body, e.g. `/id` or `/meta/type`.
    JsonPointer(String),
}

/// Configuration of a [`GenericHmac`] verifier (deserializable, e.g. from
/// the engine's configuration file).
#[derive(Clone, Deserialize)]
pub struct GenericHmacConfig {
    /// The header carrying the signature, e.g. `X-Signature`.
    pub signature_header: String,
    /// The HMAC hash function.
    pub algorithm: Algorithm,
    /// How the signature is encoded.
    pub encoding: Encoding,
    /// A fixed text in front of the encoded signature, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Where the event id is; `None` means the provider gives no id.
    #[serde(default)]
    pub id: Option<FieldSource>,
    /// Where the event kind is; `None` means every event has `default_kind`.
    #[serde(default)]
    pub kind: Option<FieldSource>,
    /// The kind used when `kind` is `None`.
    #[serde(default = "default_kind")]
    pub default_kind: String,
    /// The signing secrets (bytes as-is); any of them may match.
    pub secrets: Vec<String>,
}

fn default_kind() -> String {
    DEFAULT_KIND.to_owned()
}

impl GenericHmacConfig {
    /// A configuration with no prefix, no id source and the default kind.
    pub fn new<I, S>(
        signature_header: impl Into<String>,
        algorithm: Algorithm,
        encoding: Encoding,
        secrets: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            signature_header: signature_header.into(),
            algorithm,
            encoding,
            prefix: None,
            id: None,
            kind: None,
            default_kind: default_kind(),
            secrets: secrets.into_iter().map(Into::into).collect(),
        }
    }
}

impl fmt::Debug for GenericHmacConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenericHmacConfig")
            .field("signature_header", &self.signature_header)
            .field("algorithm", &self.algorithm)
            .field("encoding", &self.encoding)
            .field("prefix", &self.prefix)
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("default_kind", &self.default_kind)
            .field(
                "secrets",
                &format_args!("<{} redacted>", self.secrets.len()),
            )
            .finish()
    }
}

/// A validated [`FieldSource`].
#[derive(Debug, Clone)]
enum Source {
    Header(HeaderName),
    Pointer(String),
}

impl Source {
    fn new(source: FieldSource) -> Result<Self, ProviderConfigError> {
        match source {
            FieldSource::Header(name) => Ok(Self::Header(header_name(&name)?)),
            FieldSource::JsonPointer(pointer) if pointer.starts_with('/') => {
                Ok(Self::Pointer(pointer))
            }
            FieldSource::JsonPointer(pointer) => {
                Err(ProviderConfigError::InvalidJsonPointer { pointer })
            }
        }
    }
}

fn header_name(name: &str) -> Result<HeaderName, ProviderConfigError> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| ProviderConfigError::InvalidHeaderName {
        name: name.to_owned(),
    })
}

/// Verifies deliveries signed with a configured HMAC scheme.
#[derive(Debug, Clone)]
pub struct GenericHmac {
    header: HeaderName,
    algorithm: Algorithm,
    encoding: Encoding,
    prefix: Option<String>,
    id: Option<Source>,
    kind: Option<Source>,
    default_kind: String,
    secrets: Vec<Secret>,
}

impl GenericHmac {
    /// A verifier for this configuration; fails on an invalid header name or
    /// JSON pointer, an invalid default kind, or no/empty secrets.
    pub fn new(config: GenericHmacConfig) -> Result<Self, ProviderConfigError> {
        if !is_valid_kind(&config.default_kind) {
            return Err(ProviderConfigError::InvalidDefaultKind);
        }
        Ok(Self {
            header: header_name(&config.signature_header)?,
            algorithm: config.algorithm,
            encoding: config.encoding,
            prefix: config.prefix.filter(|p| !p.is_empty()),
            id: config.id.map(Source::new).transpose()?,
            kind: config.kind.map(Source::new).transpose()?,
            default_kind: config.default_kind,
            secrets: plain_secrets(&config.secrets)?,
        })
    }

    fn malformed(&self, reason: &'static str) -> Rejection {
        Rejection::MalformedSignature {
            header: self.header.as_str().to_owned(),
            reason,
        }
    }

    /// The presented digest, from the signature header.
    fn presented(&self, headers: &http::HeaderMap) -> Result<Vec<u8>, Rejection> {
        self.parse_signature(signature_header(headers, &self.header)?)
    }

    /// The digest in the signature header's value.
    fn parse_signature(&self, value: &str) -> Result<Vec<u8>, Rejection> {
        let encoded = match &self.prefix {
            Some(prefix) => value
                .strip_prefix(prefix.as_str())
                .ok_or_else(|| self.malformed("does not start with the configured prefix"))?,
            None => value,
        };
        let sig = match self.encoding {
            Encoding::Hex => hex::decode(encoded.trim()).map_err(|_| self.malformed("not hex"))?,
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|_| self.malformed("not base64"))?,
        };
        if sig.len() != self.algorithm.digest_len() {
            return Err(self.malformed("wrong digest length for the configured algorithm"));
        }
        Ok(sig)
    }
}

/// The id at `pointer`: a string, or an integer rendered in decimal.
fn id_from_pointer(payload: &Value, pointer: &str) -> Result<String, Rejection> {
    match payload.pointer(pointer) {
        None | Some(Value::Null) => Err(Rejection::MissingId {
            location: format!("body field `{pointer}`"),
        }),
        Some(Value::String(s)) => validate_id(s),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => validate_id(&n.to_string()),
        Some(_) => Err(Rejection::InvalidId {
            reason: "not a string or an integer",
        }),
    }
}

impl Provider for GenericHmac {
    fn name(&self) -> &'static str {
        "generic_hmac"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let presented = self.presented(delivery.headers)?;
        let expected: Vec<Vec<u8>> = self
            .secrets
            .iter()
            .filter_map(|s| self.algorithm.mac(s.bytes(), delivery.body))
            .collect();
        if !any_match(&expected, std::slice::from_ref(&presented)) {
            return Err(Rejection::BadSignature);
        }

        let payload = if is_form(media_type(delivery.headers)?.as_deref()) {
            Value::Object(form_to_json(decode_form(delivery.body)?))
        } else {
            parse_json(delivery.body)?
        };
        let id = match &self.id {
            None => None,
            Some(Source::Header(name)) => Some(id_from_header(delivery.headers, name)?),
            Some(Source::Pointer(pointer)) => Some(id_from_pointer(&payload, pointer)?),
        };
        let kind = match &self.kind {
            None => self.default_kind.clone(),
            Some(Source::Header(name)) => kind_from_header(delivery.headers, name)?,
            Some(Source::Pointer(pointer)) => {
                kind_from_json(payload.pointer(pointer), &format!("body field `{pointer}`"))?
            }
        };
        // An id from a header is not signed: the signature keeps a replay
        // under a new id out. Only signed bytes make the key: a kind from a
        // header is not signed either, so it must not make a new event.
        let replay_key = match &self.id {
            Some(Source::Header(_)) => Some(replay_key(&[], &presented)),
            _ => None,
        };
        Ok(Verdict::Event(VerifiedEvent {
            id,
            kind,
            payload,
            replay_key,
            replay_scope: super::ReplayScope::Content,
        }))
    }

    fn check_headers(&self, headers: &http::HeaderMap) -> Result<(), Rejection> {
        self.presented(headers).map(drop)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        shortest(&self.secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        assert_rejected, at, b64, event, header_value, headers, hmac1, hmac256, hmac512, run,
        ten_kb,
    };
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const SECRET: &str = "in-house-secret";
    const NEXT: &str = "in-house-secret-next";
    const BODY: &str = r#"{"id":"ord_1","event":"order.shipped","meta":{"seq":42}}"#;

    fn config() -> GenericHmacConfig {
        let mut c =
            GenericHmacConfig::new("X-Signature", Algorithm::Sha256, Encoding::Hex, [SECRET]);
        c.prefix = Some("sha256=".into());
        c
    }

    /// Independent signer for the default config.
    fn sig(secret: &str, body: &[u8]) -> String {
        format!("sha256={}", hex::encode(hmac256(secret.as_bytes(), body)))
    }

    fn go(p: &GenericHmac, h: &[(&str, &str)], body: &[u8]) -> Result<Verdict, Rejection> {
        run(p, &headers(h), body, "https://x/", at(0))
    }

    fn provider(c: GenericHmacConfig) -> GenericHmac {
        GenericHmac::new(c).unwrap()
    }

    #[test]
    fn valid_delivery_with_defaults() {
        let p = provider(config());
        let e = event(go(
            &p,
            &[("X-Signature", &sig(SECRET, BODY.as_bytes()))],
            BODY.as_bytes(),
        ));
        assert_eq!(e.id, None);
        assert_eq!(e.kind, DEFAULT_KIND);
        assert_eq!(e.payload["meta"]["seq"], json!(42));
        assert_eq!(p.name(), "generic_hmac");
    }

    #[test]
    fn id_and_kind_from_pointers_and_headers() {
        let mut c = config();
        c.id = Some(FieldSource::JsonPointer("/id".into()));
        c.kind = Some(FieldSource::JsonPointer("/event".into()));
        let s = sig(SECRET, BODY.as_bytes());
        let e = event(go(
            &provider(c.clone()),
            &[("X-Signature", &s)],
            BODY.as_bytes(),
        ));
        assert_eq!(
            (e.id.as_deref(), e.kind.as_str()),
            (Some("ord_1"), "order.shipped")
        );

        c.id = Some(FieldSource::JsonPointer("/meta/seq".into()));
        let e = event(go(
            &provider(c.clone()),
            &[("X-Signature", &s)],
            BODY.as_bytes(),
        ));
        assert_eq!(e.id.as_deref(), Some("42"));

        c.id = Some(FieldSource::Header("X-Event-Id".into()));
        c.kind = Some(FieldSource::Header("X-Event-Type".into()));
        let e = event(go(
            &provider(c),
            &[
                ("X-Signature", &s),
                ("X-Event-Id", "e-9"),
                ("X-Event-Type", "order.paid"),
            ],
            BODY.as_bytes(),
        ));
        assert_eq!(
            (e.id.as_deref(), e.kind.as_str()),
            (Some("e-9"), "order.paid")
        );
    }

    /// With the id (and kind) in headers, the replay key comes from the
    /// signature alone: neither unsigned header changes it.
    #[test]
    fn the_replay_key_ignores_unsigned_id_and_kind_headers() {
        let mut c = config();
        c.id = Some(FieldSource::Header("X-Event-Id".into()));
        c.kind = Some(FieldSource::Header("X-Event-Type".into()));
        let p = provider(c);
        let s = sig(SECRET, BODY.as_bytes());
        let key = |id: &str, kind: &str| {
            event(go(
                &p,
                &[
                    ("X-Signature", &s),
                    ("X-Event-Id", id),
                    ("X-Event-Type", kind),
                ],
                BODY.as_bytes(),
            ))
            .replay_key
        };
        let first = key("e-1", "order.created");
        assert!(first.is_some());
        for (id, kind) in [
            ("e-2", "order.created"),
            ("e-3", "x1"),
            ("e-4", "Order.Created"),
        ] {
            assert_eq!(key(id, kind), first, "{id} {kind}");
        }
        // With the id in the signed body there is no replay key at all.
        let mut c = config();
        c.id = Some(FieldSource::JsonPointer("/id".into()));
        c.kind = Some(FieldSource::Header("X-Event-Type".into()));
        let e = event(go(
            &provider(c),
            &[("X-Signature", &s), ("X-Event-Type", "x1")],
            BODY.as_bytes(),
        ));
        assert_eq!(e.replay_key, None);
    }

    #[test]
    fn sha1_base64_and_sha512_hex() {
        let mut c = GenericHmacConfig::new("x-sig", Algorithm::Sha1, Encoding::Base64, [SECRET]);
        c.default_kind = "ping".into();
        let s = b64(&hmac1(SECRET.as_bytes(), BODY.as_bytes()));
        let e = event(go(&provider(c), &[("X-Sig", &s)], BODY.as_bytes()));
        assert_eq!(e.kind, "ping");

        let c = GenericHmacConfig::new("x-sig", Algorithm::Sha512, Encoding::Hex, [SECRET]);
        let s = hex::encode_upper(hmac512(SECRET.as_bytes(), BODY.as_bytes()));
        event(go(&provider(c.clone()), &[("X-Sig", &s)], BODY.as_bytes()));
        // A SHA-256-length digest is malformed for SHA-512.
        let short = hex::encode(hmac256(SECRET.as_bytes(), BODY.as_bytes()));
        assert_rejected(
            go(&provider(c), &[("X-Sig", &short)], BODY.as_bytes()),
            "malformed_signature",
            401,
        );
    }

    #[test]
    fn form_bodies_become_objects() {
        let mut c = config();
        c.kind = Some(FieldSource::JsonPointer("/type".into()));
        let body = b"type=user.created&name=J%C3%BCrgen";
        let e = event(go(
            &provider(c),
            &[
                ("X-Signature", &sig(SECRET, body)),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body,
        ));
        assert_eq!(e.kind, "user.created");
        assert_eq!(e.payload, json!({"type": "user.created", "name": "Jürgen"}));
    }

    #[test]
    fn any_of_several_secrets_verifies() {
        let mut c = config();
        c.secrets = vec![SECRET.into(), NEXT.into()];
        let p = provider(c);
        for s in [SECRET, NEXT] {
            event(go(
                &p,
                &[("X-Signature", &sig(s, BODY.as_bytes()))],
                BODY.as_bytes(),
            ));
        }
    }

    #[test]
    fn tampered_wrong_missing_duplicated_malformed_are_401() {
        let p = provider(config());
        let s = sig(SECRET, BODY.as_bytes());
        assert_rejected(
            go(&p, &[("X-Signature", &s)], b"{\"id\":\"ord_2\"}"),
            "bad_signature",
            401,
        );
        assert_rejected(
            go(
                &p,
                &[("X-Signature", &sig("nope", BODY.as_bytes()))],
                BODY.as_bytes(),
            ),
            "bad_signature",
            401,
        );
        assert_rejected(go(&p, &[], BODY.as_bytes()), "missing_signature", 401);
        assert_rejected(
            go(
                &p,
                &[("X-Signature", &s), ("X-Signature", &s)],
                BODY.as_bytes(),
            ),
            "duplicate_header",
            401,
        );
        let bare = s.trim_start_matches("sha256=").to_owned();
        for bad in [
            bare.clone(),
            format!("sha256={}", &bare[1..]),
            format!("sha256=zz{}", &bare[2..]),
            "sha256=".into(),
        ] {
            assert_rejected(
                go(&p, &[("X-Signature", &bad)], BODY.as_bytes()),
                "malformed_signature",
                401,
            );
        }
    }

    #[test]
    fn missing_and_bad_ids_and_kinds_are_400() {
        let mut c = config();
        c.id = Some(FieldSource::JsonPointer("/id".into()));
        c.kind = Some(FieldSource::JsonPointer("/event".into()));
        let p = provider(c);
        let check = |body: &str, code: &str| {
            assert_rejected(
                go(
                    &p,
                    &[("X-Signature", &sig(SECRET, body.as_bytes()))],
                    body.as_bytes(),
                ),
                code,
                400,
            );
        };
        check(r#"{"event":"a"}"#, "missing_id");
        check(r#"{"id":"x"}"#, "missing_kind");
        check(r#"{"id":"x\u0007","event":"a"}"#, "invalid_id");
        check(
            &json!({"id": ten_kb(), "event": "a"}).to_string(),
            "invalid_id",
        );
        check(r#"{"id":1.5,"event":"a"}"#, "invalid_id");
        check(r#"{"id":"x","event":["a"]}"#, "invalid_kind");
        check("not json", "malformed_body");
        check("\"\u{FFFD}", "malformed_body");
        let body = b"{\"id\":\"\xff\"}";
        assert_rejected(
            go(&p, &[("X-Signature", &sig(SECRET, body))], body),
            "malformed_body",
            400,
        );

        let mut c = config();
        c.id = Some(FieldSource::Header("X-Event-Id".into()));
        let p = provider(c);
        let s = sig(SECRET, BODY.as_bytes());
        assert_rejected(
            go(&p, &[("X-Signature", &s)], BODY.as_bytes()),
            "missing_id",
            400,
        );
        assert_rejected(
            go(
                &p,
                &[("X-Signature", &s), ("X-Event-Id", "a\tb")],
                BODY.as_bytes(),
            ),
            "invalid_id",
            400,
        );
        assert_rejected(
            go(
                &p,
                &[("X-Signature", &s), ("X-Event-Id", &ten_kb())],
                BODY.as_bytes(),
            ),
            "invalid_id",
            400,
        );
    }

    #[test]
    fn configuration_is_validated() {
        let mut c = config();
        c.signature_header = "bad header".into();
        assert!(matches!(
            GenericHmac::new(c),
            Err(ProviderConfigError::InvalidHeaderName { .. })
        ));
        let mut c = config();
        c.id = Some(FieldSource::JsonPointer("id".into()));
        assert!(matches!(
            GenericHmac::new(c),
            Err(ProviderConfigError::InvalidJsonPointer { .. })
        ));
        let mut c = config();
        c.default_kind = String::new();
        assert!(matches!(
            GenericHmac::new(c),
            Err(ProviderConfigError::InvalidDefaultKind)
        ));
        let mut c = config();
        c.secrets.clear();
        assert!(matches!(
            GenericHmac::new(c),
            Err(ProviderConfigError::NoSecrets)
        ));
    }

    #[test]
    fn configuration_deserializes_and_debug_redacts() {
        let c: GenericHmacConfig = serde_json::from_value(json!({
            "signature_header": "X-Hook-Signature",
            "algorithm": "sha512",
            "encoding": "base64",
            "id": {"header": "X-Hook-Id"},
            "kind": {"json_pointer": "/type"},
            "secrets": ["s3cr3t-value"]
        }))
        .unwrap();
        assert_eq!(c.algorithm, Algorithm::Sha512);
        assert_eq!(c.default_kind, DEFAULT_KIND);
        assert_eq!(c.kind, Some(FieldSource::JsonPointer("/type".into())));
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let p = provider(c);
        assert!(!format!("{p:?}").contains("s3cr3t"));
    }

    proptest! {
        #[test]
        fn arbitrary_headers_and_bodies_never_panic(
            sig_bytes in proptest::collection::vec(any::<u8>(), 0..200),
            text in "(sha256=)?[0-9a-fA-F+/=]{0,140}",
            body in proptest::collection::vec(any::<u8>(), 0..200),
            alg in prop_oneof![Just(Algorithm::Sha1), Just(Algorithm::Sha256), Just(Algorithm::Sha512)],
            enc in prop_oneof![Just(Encoding::Hex), Just(Encoding::Base64)],
        ) {
            let mut c = config();
            c.algorithm = alg;
            c.encoding = enc;
            c.id = Some(FieldSource::JsonPointer("/a/0/b".into()));
            let p = provider(c);
            let _ = p.parse_signature(&text);
            for v in [header_value(&sig_bytes), header_value(text.as_bytes())].into_iter().flatten() {
                let mut h = http::HeaderMap::new();
                h.insert("x-signature", v);
                let r = p.verify(&Delivery { headers: &h, body: &body, public_url: "", now: at(0) });
                prop_assert!(r.is_err());
            }
        }
    }
}
