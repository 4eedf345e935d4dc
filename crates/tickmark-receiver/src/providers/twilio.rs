//! Twilio request signatures.
//!
//! Scheme: `X-Twilio-Signature: <base64>`, the standard base64 HMAC-SHA1
//! keyed with the account's auth token (bytes as-is). Several tokens are
//! accepted (Twilio's primary and secondary auth token during rotation).
//!
//! * Form posts (`application/x-www-form-urlencoded`, and any Content-Type
//!   other than JSON) whose URL has no `bodySHA256`: the signed data is the
//!   public URL followed, for each POST parameter sorted by name (then by
//!   value, for a name given more than once), by the name and the value
//!   concatenated. The parameters are decoded leniently for this (invalid
//!   UTF-8 becomes U+FFFD, as Twilio's helper libraries and web frameworks
//!   see them); after the signature verifies, a body that is not strictly
//!   UTF-8 is refused with 400. The fields are counted before anything is
//!   decoded: a form of more than [`MAX_FORM_FIELDS`](super::MAX_FORM_FIELDS)
//!   fields is refused with 413 `too_many_form_fields` before the signature
//!   is computed, and below that the MAC is fed field by field from a decode
//!   that borrows from the body, so a wrong signature costs one pass over
//!   the body and no copy of it.
//! * JSON bodies (`application/json`), and any request whose URL carries
//!   `bodySHA256`: Twilio appends `bodySHA256=<hex SHA-256 of the body>` to
//!   the URL's query string and signs the URL alone. If the public URL
//!   carries `bodySHA256` (the receiver passes the request's own query
//!   string), that value must match the body (401 `bad_body_hash`
//!   otherwise), whatever the Content-Type — as Twilio's own validators do,
//!   so the parameter is never ignored; if it does not, the parameter is
//!   appended, computed from the body, exactly as Twilio does, so the
//!   signature then covers the body.
//!
//! Ports: Twilio's own helper libraries (twilio-python, twilio-node) accept a
//! signature computed over the URL either with or without the port, because
//! "signature generation on the back end is inconsistent". We do the same:
//! the URL as configured, plus the URL with its port removed (any port) when
//! it has one, or with the scheme's default port (`:443` for https, `:80` for
//! http) added when it has none. URLs are parsed with the `url` crate; the
//! variants are its (WHATWG-normalised) serialisations.
//!
//! Replays: Twilio signs no timestamp, and the `I-Twilio-Idempotency-Token`
//! header is not signed, so the verdict's replay key is derived from the
//! verified signature (which covers the URL and every parameter, or the URL
//! and the body hash): the same signed request sent again with a new token is
//! a duplicate for as long as the event is kept. The receiver warns at
//! start-up when no public URL is configured ([`Provider::signs_public_url`]).
//!
//! Id: the `I-Twilio-Idempotency-Token` header when present (validated), else
//! `None`. Twilio sends no event type, so the kind is derived from the
//! (verified) parameters or JSON object: `"message"` when `MessageSid`,
//! `SmsSid` or `SmsMessageSid` is present, otherwise `"call"` when `CallSid`
//! is present, otherwise `"webhook"`. The payload is the form as a JSON object
//! of string fields (a repeated name becomes an array), or the JSON body.
//!
//! Documentation: <https://www.twilio.com/docs/usage/security#validating-requests>

use base64::Engine as _;
use http::HeaderName;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use url::{Position, Url};

use super::body::{decode_form, decode_form_lossy, form_to_json, is_json, media_type, parse_json};
use super::signature::{
    any_match, ct_eq, hmac_sha1, optional_id_header, plain_secrets, replay_key, shortest,
    signature_header, Secret,
};
use super::{Delivery, Provider, ProviderConfigError, Rejection, Verdict, VerifiedEvent};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-twilio-signature");
/// The header carrying Twilio's idempotency token, used as the event id.
pub const IDEMPOTENCY_HEADER: HeaderName = HeaderName::from_static("i-twilio-idempotency-token");

/// The query parameter carrying the body hash of JSON requests.
const BODY_HASH_PARAM: &str = "bodySHA256";
/// Length of an HMAC-SHA1 digest, in bytes.
const DIGEST_BYTES: usize = 20;

/// Verifies Twilio requests.
#[derive(Debug, Clone)]
pub struct Twilio {
    secrets: Vec<Secret>,
}

impl Twilio {
    /// A verifier for these auth tokens (used as-is). Several tokens support
    /// rotation: a request verifies if any matches.
    pub fn new<I, S>(auth_tokens: I) -> Result<Self, ProviderConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            secrets: plain_secrets(auth_tokens)?,
        })
    }
}

/// The presented digest, from the signature header.
fn presented(headers: &http::HeaderMap) -> Result<Vec<u8>, Rejection> {
    parse_signature(signature_header(headers, &SIGNATURE_HEADER)?)
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
        return Err(malformed("not a 20-byte digest"));
    }
    Ok(sig)
}

/// The URLs a signature may have been computed over: the URL as given, and
/// the same without its port, or with the scheme's default port added (and
/// the `url` crate's normal form of it, which drops a default port).
fn url_variants(url: &str) -> Vec<String> {
    let mut out = vec![url.to_owned()];
    let Ok(parsed) = Url::parse(url) else {
        return out;
    };
    let default_port = match parsed.scheme() {
        "https" => 443,
        "http" => 80,
        _ => return out,
    };
    let mut without_port = parsed.clone();
    // Cannot fail for http(s) URLs, which always have a host.
    let _ = without_port.set_port(None);
    let mut candidates = vec![String::from(without_port)];
    if parsed.port().is_none() {
        // `url` drops a default port, so it is put back by hand around the host.
        candidates.push(format!(
            "{}:{default_port}{}",
            &parsed[..Position::AfterHost],
            &parsed[Position::AfterPort..]
        ));
    }
    for candidate in candidates {
        if !out.contains(&candidate) {
            out.push(candidate);
        }
    }
    out
}

/// The decoded value of the `bodySHA256` query parameter of `url`:
/// `Ok(None)` when absent (or the URL does not parse), `Err(())` when
/// present more than once.
fn body_hash_param(url: &str) -> Result<Option<String>, ()> {
    let Ok(parsed) = Url::parse(url) else {
        return Ok(None);
    };
    let mut values = parsed
        .query_pairs()
        .filter(|(name, _)| name == BODY_HASH_PARAM)
        .map(|(_, value)| value.into_owned());
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(value), None) => Ok(Some(value)),
        (Some(_), Some(_)) => Err(()),
    }
}

/// `url` with `bodySHA256=<hash>` appended to its query string (as is, when
/// it does not parse: the signature then fails).
fn with_body_hash(url: &str, hash: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) => {
            parsed.query_pairs_mut().append_pair(BODY_HASH_PARAM, hash);
            parsed.into()
        }
        Err(_) => url.to_owned(),
    }
}

/// The kind, derived from the parameters (see the module documentation).
fn kind_of(payload: &Value) -> &'static str {
    let has = |key: &str| payload.get(key).is_some();
    if has("MessageSid") || has("SmsSid") || has("SmsMessageSid") {
        "message"
    } else if has("CallSid") {
        "call"
    } else {
        "webhook"
    }
}

impl Twilio {
    /// The HMACs of `data` under every token.
    fn macs<'d>(&self, data: impl Iterator<Item = &'d [u8]> + Clone) -> Vec<Vec<u8>> {
        self.secrets
            .iter()
            .flat_map(|s| data.clone().filter_map(|d| hmac_sha1(s.bytes(), &[d])))
            .collect()
    }

    /// The signature over the URL alone, which carries the body's hash.
    fn verify_url_with_body_hash(
        &self,
        delivery: &Delivery<'_>,
        presented: &[u8],
        claimed_hash: Option<String>,
    ) -> Result<(), Rejection> {
        let body_hash = hex::encode(Sha256::digest(delivery.body));
        let signed_url = match claimed_hash {
            Some(_) => delivery.public_url.to_owned(),
            None => with_body_hash(delivery.public_url, &body_hash),
        };
        let variants = url_variants(&signed_url);
        let expected = self.macs(variants.iter().map(|v| v.as_bytes()));
        if !any_match(&expected, &[presented.to_vec()]) {
            return Err(Rejection::BadSignature);
        }
        if let Some(claimed) = claimed_hash {
            let claimed = claimed.to_ascii_lowercase();
            if !bool::from(ct_eq(claimed.as_bytes(), body_hash.as_bytes())) {
                return Err(Rejection::BadBodyHash);
            }
        }
        Ok(())
    }

    /// The signature over the URL and the sorted form parameters. The form
    /// is counted before it is decoded (at most
    /// [`MAX_FORM_FIELDS`](super::MAX_FORM_FIELDS) fields,
    /// 413 beyond), decoded borrowing from the body where nothing needs
    /// decoding, and fed to the MAC field by field: nothing the size of the
    /// body is built for a signature that may be wrong.
    fn verify_url_and_parameters(
        &self,
        delivery: &Delivery<'_>,
        presented: &[u8],
    ) -> Result<(), Rejection> {
        let mut params = decode_form_lossy(delivery.body)?;
        params.sort();
        let fields: Vec<&[u8]> = params
            .iter()
            .flat_map(|(name, value)| [name.as_bytes(), value.as_bytes()])
            .collect();
        let mut expected = Vec::new();
        for url in url_variants(delivery.public_url) {
            let signed: Vec<&[u8]> = std::iter::once(url.as_bytes())
                .chain(fields.iter().copied())
                .collect();
            expected.extend(
                self.secrets
                    .iter()
                    .filter_map(|secret| hmac_sha1(secret.bytes(), &signed)),
            );
        }
        if any_match(&expected, &[presented.to_vec()]) {
            Ok(())
        } else {
            Err(Rejection::BadSignature)
        }
    }
}

impl Provider for Twilio {
    fn name(&self) -> &'static str {
        "twilio"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let presented = presented(delivery.headers)?;
        let json_body = is_json(media_type(delivery.headers)?.as_deref());
        let claimed_hash =
            body_hash_param(delivery.public_url).map_err(|()| Rejection::BadBodyHash)?;
        if json_body || claimed_hash.is_some() {
            self.verify_url_with_body_hash(delivery, &presented, claimed_hash)?;
        } else {
            self.verify_url_and_parameters(delivery, &presented)?;
        }
        let payload = if json_body {
            parse_json(delivery.body)?
        } else {
            Value::Object(form_to_json(decode_form(delivery.body)?))
        };

        let id = optional_id_header(delivery.headers, &IDEMPOTENCY_HEADER)?;
        Ok(Verdict::Event(VerifiedEvent {
            id,
            kind: kind_of(&payload).to_owned(),
            payload,
            // The idempotency token is not signed; the signature covers the
            // URL and the parameters (or the body's hash).
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

    fn signs_public_url(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        assert_rejected, at, b64, event, header_value, headers, hmac1, run, ten_kb,
    };
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const TOKEN: &str = "12345";
    const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
    const FORM: &str = "application/x-www-form-urlencoded";

    /// The parameters of Twilio's documented example (auth token 12345, URL
    /// above, signature `RSOYDt4T1cUTdK1PDd93/VVr8B8=`), as published in the
    /// twilio-php library docs, docs/usage/validation.rst "Validate Incoming
    /// Requests" (seen at
    /// http://twilio-php-atbaker.readthedocs.io/en/latest/usage/validation.html),
    /// and in twilio-python's test suite,
    /// https://github.com/twilio/twilio-python/blob/main/tests/unit/test_request_validator.py,
    /// which also gives the port, duplicate-parameter and JSON-body values
    /// used below (`kvajT1…`, `Zmvh+3…`, `0ZXoZL…`, `IK+Dwp…`, `a9nBmq…`).
    const PARAMS: [(&str, &str); 5] = [
        ("CallSid", "CA1234567890ABCDE"),
        ("Caller", "+14158675309"),
        ("Digits", "1234"),
        ("From", "+14158675309"),
        ("To", "+18005551212"),
    ];

    fn form_body(params: &[(&str, &str)]) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (n, v) in params {
            s.append_pair(n, v);
        }
        s.finish()
    }

    /// Independent signer for form posts.
    fn sign_form(token: &str, url: &str, params: &[(&str, &str)]) -> String {
        let mut sorted = params.to_vec();
        sorted.sort();
        let mut data = url.to_owned();
        for (n, v) in sorted {
            data.push_str(n);
            data.push_str(v);
        }
        b64(&hmac1(token.as_bytes(), data.as_bytes()))
    }

    fn provider() -> Twilio {
        Twilio::new([TOKEN]).unwrap()
    }

    fn go(p: &Twilio, h: &[(&str, &str)], body: &[u8], url: &str) -> Result<Verdict, Rejection> {
        run(p, &headers(h), body, url, at(0))
    }

    fn post(sig: &str, body: &[u8], url: &str) -> Result<Verdict, Rejection> {
        go(
            &provider(),
            &[("X-Twilio-Signature", sig), ("Content-Type", FORM)],
            body,
            url,
        )
    }

    #[test]
    fn published_form_example() {
        let body = form_body(&PARAMS);
        let e = event(post("RSOYDt4T1cUTdK1PDd93/VVr8B8=", body.as_bytes(), URL));
        assert_eq!(e.id, None);
        assert_eq!(e.kind, "call");
        assert_eq!(e.payload["Caller"], json!("+14158675309"));
        assert_eq!(e.payload["To"], json!("+18005551212"));
        // Our independent signer agrees.
        assert_eq!(
            sign_form(TOKEN, URL, &PARAMS),
            "RSOYDt4T1cUTdK1PDd93/VVr8B8="
        );
    }

    #[test]
    fn published_port_variants() {
        let body = form_body(&PARAMS);
        let body = body.as_bytes();
        // Signed over the URL with :443 added; configured without a port.
        event(post("kvajT1Ptam85bY51eRf/AJRuM3w=", body, URL));
        // Configured with a port; signed without it.
        event(post(
            "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            body,
            "https://mycompany.com:1234/myapp.php?foo=1&bar=2",
        ));
        // http with an explicit port, signed with it.
        event(post(
            "Zmvh+3yNM1Phv2jhDCwEM3q5ebU=",
            body,
            "http://mycompany.com:1234/myapp.php?foo=1&bar=2",
        ));
        // http without a port, signed with :80 added.
        event(post(
            "0ZXoZLH/DfblKGATFgpif+LLRf4=",
            body,
            "http://mycompany.com/myapp.php?foo=1&bar=2",
        ));
        // But not another host or path.
        assert_rejected(
            post(
                "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
                body,
                "https://mycompany.com/other.php?foo=1&bar=2",
            ),
            "bad_signature",
            401,
        );
    }

    #[test]
    fn published_duplicate_parameters() {
        let body = b"Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234";
        let e = event(post("IK+Dwps556ElfBT0I3Rgjkr1wJU=", body, URL));
        assert_eq!(e.payload["Digits"], json!(["5678", "1234"]));
        assert_eq!(e.kind, "webhook");
    }

    #[test]
    fn published_json_example() {
        let body = br#"{"property": "value", "boolean": true}"#;
        let hash = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
        let sig = "a9nBmqA0ju/hNViExpshrM61xv4=";
        let full = format!("{URL}&bodySHA256={hash}");
        let h = [
            ("X-Twilio-Signature", sig),
            ("Content-Type", "application/json"),
        ];
        // The receiver passed the URL Twilio requested, bodySHA256 included.
        let e = event(go(&provider(), &h, body, &full));
        assert_eq!(e.payload, json!({"property": "value", "boolean": true}));
        assert_eq!(e.kind, "webhook");
        // The receiver passed only the configured URL: we append the hash.
        event(go(&provider(), &h, body, URL));
        // A changed body: the claimed hash no longer matches / the signature fails.
        let changed = br#"{"property": "value", "boolean": false}"#;
        assert_rejected(go(&provider(), &h, changed, &full), "bad_body_hash", 401);
        assert_rejected(go(&provider(), &h, changed, URL), "bad_signature", 401);
        // A doubled bodySHA256 parameter is refused.
        let doubled = format!("{full}&bodySHA256={hash}");
        assert_rejected(go(&provider(), &h, body, &doubled), "bad_body_hash", 401);
    }

    #[test]
    fn message_kind_and_idempotency_id() {
        let params = [
            ("MessageSid", "SM1"),
            ("Body", "héllo wörld & more"),
            ("From", "+1555"),
        ];
        let body = form_body(&params);
        let sig = sign_form(TOKEN, URL, &params);
        let e = event(go(
            &provider(),
            &[
                ("X-Twilio-Signature", &sig),
                (
                    "Content-Type",
                    "application/x-www-form-urlencoded; charset=utf-8",
                ),
                (
                    "I-Twilio-Idempotency-Token",
                    "0f1b8a3e-3c5f-4bd6-9f0e-7d6a2b1c4e5f",
                ),
            ],
            body.as_bytes(),
            URL,
        ));
        assert_eq!(
            e.id.as_deref(),
            Some("0f1b8a3e-3c5f-4bd6-9f0e-7d6a2b1c4e5f")
        );
        assert_eq!(e.kind, "message");
        assert_eq!(e.payload["Body"], json!("héllo wörld & more"));
    }

    #[test]
    fn any_of_several_tokens_verifies() {
        let p = Twilio::new(["secondary-token", TOKEN]).unwrap();
        let body = form_body(&PARAMS);
        for t in ["secondary-token", TOKEN] {
            let sig = sign_form(t, URL, &PARAMS);
            event(go(
                &p,
                &[("X-Twilio-Signature", &sig), ("Content-Type", FORM)],
                body.as_bytes(),
                URL,
            ));
        }
    }

    #[test]
    fn tampered_wrong_token_missing_duplicated() {
        let body = form_body(&PARAMS);
        let sig = sign_form(TOKEN, URL, &PARAMS);
        let tampered = body.replace("1234", "9999");
        assert_rejected(post(&sig, tampered.as_bytes(), URL), "bad_signature", 401);
        let extra = format!("{body}&Extra=1");
        assert_rejected(post(&sig, extra.as_bytes(), URL), "bad_signature", 401);
        let wrong = sign_form("54321", URL, &PARAMS);
        assert_rejected(post(&wrong, body.as_bytes(), URL), "bad_signature", 401);
        assert_rejected(
            go(&provider(), &[("Content-Type", FORM)], body.as_bytes(), URL),
            "missing_signature",
            401,
        );
        let dup = [
            ("X-Twilio-Signature", sig.as_str()),
            ("X-Twilio-Signature", sig.as_str()),
        ];
        assert_rejected(
            go(&provider(), &dup, body.as_bytes(), URL),
            "duplicate_header",
            401,
        );
    }

    #[test]
    fn malformed_signatures_are_401() {
        let body = form_body(&PARAMS);
        let raw = hmac1(TOKEN.as_bytes(), b"x");
        for bad in [
            "not base64!".to_owned(),
            b64(&raw[..19]),
            b64(&[raw.clone(), vec![1]].concat()),
            hex::encode(&raw),
            String::new(),
            "RSOYDt4T1cUTdK1PDd93/VVr8B8".to_owned(),
        ] {
            assert_rejected(post(&bad, body.as_bytes(), URL), "malformed_signature", 401);
        }
    }

    #[test]
    fn bad_idempotency_tokens_are_400() {
        let body = form_body(&PARAMS);
        let sig = sign_form(TOKEN, URL, &PARAMS);
        for bad in ["a\tb".to_owned(), ten_kb(), String::new()] {
            let h = [
                ("X-Twilio-Signature", sig.as_str()),
                ("I-Twilio-Idempotency-Token", bad.as_str()),
            ];
            assert_rejected(go(&provider(), &h, body.as_bytes(), URL), "invalid_id", 400);
        }
    }

    /// A form of more fields than anyone sends is refused with 413 before
    /// its signature is computed, signed or not; one at the limit verifies.
    #[test]
    fn a_form_of_too_many_fields_is_413_before_the_signature() {
        let flood = "a&".repeat(crate::providers::MAX_FORM_FIELDS + 1);
        let wrong = b64(&hmac1(TOKEN.as_bytes(), b"not this"));
        assert_rejected(
            post(&wrong, flood.as_bytes(), URL),
            "too_many_form_fields",
            413,
        );
        let params: Vec<(String, String)> = (0..crate::providers::MAX_FORM_FIELDS)
            .map(|i| (format!("F{i:04}"), "v".to_owned()))
            .collect();
        let params: Vec<(&str, &str)> = params
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let body = form_body(&params);
        event(post(&sign_form(TOKEN, URL, &params), body.as_bytes(), URL));
        // Signed correctly but one field too many: still 413.
        let mut more = params.clone();
        more.push(("Z", "1"));
        let body = form_body(&more);
        assert_rejected(
            post(&sign_form(TOKEN, URL, &more), body.as_bytes(), URL),
            "too_many_form_fields",
            413,
        );
    }

    #[test]
    fn correctly_signed_garbage_is_400() {
        // Form: the signature covers the leniently decoded value (U+FFFD).
        let body = b"Body=%FF&MessageSid=SM1";
        let sig = sign_form(TOKEN, URL, &[("Body", "\u{FFFD}"), ("MessageSid", "SM1")]);
        assert_rejected(post(&sig, body, URL), "malformed_body", 400);
        // JSON: a correctly signed body that is not JSON.
        let body = b"not json \xff";
        let url = format!("{URL}&bodySHA256={}", hex::encode(Sha256::digest(body)));
        let sig = b64(&hmac1(TOKEN.as_bytes(), url.as_bytes()));
        let h = [
            ("X-Twilio-Signature", sig.as_str()),
            ("Content-Type", "application/json"),
        ];
        assert_rejected(go(&provider(), &h, body, URL), "malformed_body", 400);
    }

    /// A form post whose URL carries `bodySHA256` is checked as Twilio's
    /// validators check it: the signature over the URL alone, and the hash
    /// against the body. The parameter is never ignored.
    #[test]
    fn body_hash_in_the_url_of_a_form_post_is_checked() {
        let body = form_body(&PARAMS);
        let hash = hex::encode(Sha256::digest(body.as_bytes()));
        let url = format!("{URL}&bodySHA256={hash}");
        let over_url = b64(&hmac1(TOKEN.as_bytes(), url.as_bytes()));
        // Signed over the URL (with the right hash): accepted, parsed as a form.
        let e = event(post(&over_url, body.as_bytes(), &url));
        assert_eq!(e.kind, "call");
        assert_eq!(e.payload["Digits"], json!("1234"));
        // The same URL and signature with another body: the hash says no.
        let other = form_body(&[("CallSid", "CA0"), ("Digits", "0000")]);
        assert_rejected(
            post(&over_url, other.as_bytes(), &url),
            "bad_body_hash",
            401,
        );
        // A wrong hash in the URL, even under a signature over URL and
        // parameters (the form scheme), is refused: it is not ignored.
        let wrong = format!("{URL}&bodySHA256={}", "0".repeat(64));
        let as_form = sign_form(TOKEN, &wrong, &PARAMS);
        assert_rejected(
            post(&as_form, body.as_bytes(), &wrong),
            "bad_signature",
            401,
        );
        let over_wrong = b64(&hmac1(TOKEN.as_bytes(), wrong.as_bytes()));
        assert_rejected(
            post(&over_wrong, body.as_bytes(), &wrong),
            "bad_body_hash",
            401,
        );
    }

    /// The replay key comes from the signature alone: a new idempotency
    /// token does not change it; another signed request does.
    #[test]
    fn the_replay_key_ignores_the_unsigned_token() {
        let body = form_body(&PARAMS);
        let sig = sign_form(TOKEN, URL, &PARAMS);
        let with_token = |token: &str| {
            event(go(
                &provider(),
                &[
                    ("X-Twilio-Signature", &sig),
                    ("Content-Type", FORM),
                    ("I-Twilio-Idempotency-Token", token),
                ],
                body.as_bytes(),
                URL,
            ))
        };
        let first = with_token("token-1");
        let replayed = with_token("token-2");
        assert_ne!(first.id, replayed.id);
        assert!(first.replay_key.is_some());
        assert_eq!(first.replay_key, replayed.replay_key);
        // Parameters reordered in the body: the same signed content, the same key.
        let reordered = form_body(&[PARAMS[4], PARAMS[3], PARAMS[2], PARAMS[1], PARAMS[0]]);
        let e = event(post(&sig, reordered.as_bytes(), URL));
        assert_eq!(e.replay_key, first.replay_key);
        let other = [("CallSid", "CA2"), ("From", "+1")];
        let e = event(post(
            &sign_form(TOKEN, URL, &other),
            form_body(&other).as_bytes(),
            URL,
        ));
        assert_ne!(e.replay_key, first.replay_key);
    }

    #[test]
    fn headers_are_checked_before_the_body() {
        let p = provider();
        assert_eq!(
            p.check_headers(&headers(&[])).unwrap_err().code(),
            "missing_signature"
        );
        assert_eq!(
            p.check_headers(&headers(&[("X-Twilio-Signature", "nope!")]))
                .unwrap_err()
                .code(),
            "malformed_signature"
        );
        let sig = sign_form(TOKEN, URL, &PARAMS);
        assert!(p
            .check_headers(&headers(&[("X-Twilio-Signature", &sig)]))
            .is_ok());
        assert!(p.signs_public_url());
        assert_eq!(p.shortest_secret_bytes(), Some(TOKEN.len()));
    }

    #[test]
    fn url_handling() {
        assert_eq!(
            url_variants("https://u:p@h.example:8443/p?q=1#f"),
            [
                "https://u:p@h.example:8443/p?q=1#f",
                "https://u:p@h.example/p?q=1#f"
            ]
        );
        assert_eq!(
            url_variants("https://[::1]/x"),
            ["https://[::1]/x", "https://[::1]:443/x"]
        );
        assert_eq!(
            url_variants("https://[::1]:9/x"),
            ["https://[::1]:9/x", "https://[::1]/x"]
        );
        // As given, then the `url` crate's normal form, with and without the port.
        assert_eq!(
            url_variants("HTTP://h?x"),
            ["HTTP://h?x", "http://h/?x", "http://h:80/?x"]
        );
        assert_eq!(
            url_variants("https://h:443/x"),
            ["https://h:443/x", "https://h/x"]
        );
        assert_eq!(url_variants("ftp://h/x"), ["ftp://h/x"]);
        assert_eq!(url_variants("not a url"), ["not a url"]);
        assert_eq!(url_variants("https://h:abc/"), ["https://h:abc/"]);
        assert_eq!(
            with_body_hash("https://h/x", "ab"),
            "https://h/x?bodySHA256=ab"
        );
        assert_eq!(
            with_body_hash("https://h/x?a=1", "ab"),
            "https://h/x?a=1&bodySHA256=ab"
        );
        assert_eq!(
            body_hash_param("https://h/?a=1&bodySHA256=x#y"),
            Ok(Some("x".to_owned()))
        );
        assert_eq!(body_hash_param("https://h/?a=1"), Ok(None));
        assert_eq!(
            body_hash_param("https://h/?bodySHA256=a&bodySHA256=b"),
            Err(())
        );
        assert_eq!(body_hash_param("not a url"), Ok(None));
    }

    proptest! {
        #[test]
        fn arbitrary_headers_urls_and_bodies_never_panic(
            sig_bytes in proptest::collection::vec(any::<u8>(), 0..60),
            url in "\\PC{0,60}",
            url2 in "(https?://)?([a-z@:\\[\\]0-9]{0,12})(/[a-z?&=#]{0,10})?",
            json in any::<bool>(),
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let _ = url_variants(&url);
            let _ = url_variants(&url2);
            let _ = body_hash_param(&url);
            let _ = parse_signature(&String::from_utf8_lossy(&sig_bytes));
            if let Some(v) = header_value(&sig_bytes) {
                let mut h = http::HeaderMap::new();
                h.insert(SIGNATURE_HEADER, v);
                if json {
                    h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                }
                for u in [&url, &url2] {
                    let r = provider().verify(&Delivery { headers: &h, body: &body, public_url: u, now: at(0) });
                    prop_assert!(r.is_err());
                }
            }
        }
    }
}
