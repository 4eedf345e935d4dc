//! Twilio request signatures.
//!
//! Scheme: `X-Twilio-Signature: <base64>`, the standard base64 HMAC-SHA1
//! keyed with the account's auth token (bytes as-is). Several tokens are
//! accepted (Twilio's primary and secondary auth token during rotation).
//!
//! * Form posts (`application/x-www-form-urlencoded`, and any Content-Type
//!   other than JSON): the signed data is the public URL followed, for each
//!   POST parameter sorted by name (then by value, for a name given more than
//!   once), by the name and the value concatenated. The parameters are
//!   decoded leniently for this (invalid UTF-8 becomes U+FFFD, as Twilio's
//!   helper libraries and web frameworks see them); after the signature
//!   verifies, a body that is not strictly UTF-8 is refused with 400.
//! * JSON bodies (`application/json`): Twilio appends `bodySHA256=<hex
//!   SHA-256 of the body>` to the URL's query string and signs the URL alone.
//!   If the configured public URL already carries `bodySHA256` (the receiver
//!   passed the request's own query string), that value must match the body
//!   (401 `bad_body_hash` otherwise); if it does not, the parameter is
//!   appended, computed from the body, exactly as Twilio does, so the
//!   signature then covers the body.
//!
//! Ports: Twilio's own helper libraries (twilio-python, twilio-node) accept a
//! signature computed over the URL either with or without the port, because
//! "signature generation on the back end is inconsistent". We do the same:
//! the URL as configured, plus the URL with its port removed (any port) when
//! it has one, or with the scheme's default port (`:443` for https, `:80` for
//! http) added when it has none.
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

use super::body::{decode_form, decode_form_lossy, form_to_json, is_json, media_type, parse_json};
use super::signature::{
    any_match, ct_eq, hmac_sha1, optional_id_header, plain_secrets, signature_header, Secret,
};
use super::{ConfigError, Delivery, Provider, Rejection, Verdict, VerifiedEvent};

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
    pub fn new<I, S>(auth_tokens: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            secrets: plain_secrets(auth_tokens)?,
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
        return Err(malformed("not a 20-byte digest"));
    }
    Ok(sig)
}

/// An absolute URL cut into the pieces the port variants need.
#[derive(Debug, PartialEq)]
struct UrlParts<'a> {
    scheme: &'a str,
    /// `user[:password]@`, including the `@`, or empty.
    userinfo: &'a str,
    host: &'a str,
    port: Option<&'a str>,
    /// Path, query and fragment.
    rest: &'a str,
}

/// Cut `scheme://[userinfo@]host[:port][/path][?query][#fragment]`; `None`
/// when the text does not look like that.
fn split_url(url: &str) -> Option<UrlParts<'_>> {
    let (scheme, after) = url.split_once("://")?;
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at_checked(end)?;
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(at) => authority.split_at_checked(at.checked_add(1)?)?,
        None => ("", authority),
    };
    let (host, port) = if hostport.starts_with('[') {
        let close = hostport.find(']')?;
        let (host, after_host) = hostport.split_at_checked(close.checked_add(1)?)?;
        match after_host.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after_host.is_empty() => (host, None),
            None => return None,
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty()
        || port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    Some(UrlParts {
        scheme,
        userinfo,
        host,
        port,
        rest,
    })
}

/// The URLs a signature may have been computed over: the URL as given, and
/// the same without its port, or with the scheme's default port added.
fn url_variants(url: &str) -> Vec<String> {
    let mut out = vec![url.to_owned()];
    if let Some(p) = split_url(url) {
        let rebuild = |port: Option<&str>| match port {
            Some(port) => format!("{}://{}{}:{}{}", p.scheme, p.userinfo, p.host, port, p.rest),
            None => format!("{}://{}{}{}", p.scheme, p.userinfo, p.host, p.rest),
        };
        let other = match p.port {
            Some(_) => Some(rebuild(None)),
            None if p.scheme.eq_ignore_ascii_case("https") => Some(rebuild(Some("443"))),
            None if p.scheme.eq_ignore_ascii_case("http") => Some(rebuild(Some("80"))),
            None => None,
        };
        if let Some(other) = other {
            if other != url {
                out.push(other);
            }
        }
    }
    out
}

/// The single raw value of query parameter `name` in `url`: `Ok(None)` when
/// absent, `Err(())` when present more than once.
fn query_param<'a>(url: &'a str, name: &str) -> Result<Option<&'a str>, ()> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let query = query.split('#').next().unwrap_or_default();
    let mut found = None;
    for pair in query.split('&') {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        if n == name && found.replace(v).is_some() {
            return Err(());
        }
    }
    Ok(found)
}

/// `url` with `bodySHA256=<hash>` appended to its query string.
fn with_body_hash(url: &str, hash: &str) -> String {
    let separator = if url.ends_with(['?', '&']) {
        ""
    } else if url.contains('?') {
        "&"
    } else {
        "?"
    };
    format!("{url}{separator}{BODY_HASH_PARAM}={hash}")
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
}

impl Provider for Twilio {
    fn name(&self) -> &'static str {
        "twilio"
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        let presented = parse_signature(signature_header(delivery.headers, &SIGNATURE_HEADER)?)?;
        let json_body = is_json(media_type(delivery.headers)?.as_deref());

        let payload = if json_body {
            let body_hash = hex::encode(Sha256::digest(delivery.body));
            let (signed_url, claimed_hash) = match query_param(delivery.public_url, BODY_HASH_PARAM)
            {
                Err(()) => return Err(Rejection::BadBodyHash),
                Ok(Some(claimed)) => (delivery.public_url.to_owned(), Some(claimed)),
                Ok(None) => (with_body_hash(delivery.public_url, &body_hash), None),
            };
            let variants = url_variants(&signed_url);
            let expected = self.macs(variants.iter().map(|v| v.as_bytes()));
            if !any_match(&expected, &[presented]) {
                return Err(Rejection::BadSignature);
            }
            if let Some(claimed) = claimed_hash {
                let claimed = claimed.to_ascii_lowercase();
                if !bool::from(ct_eq(claimed.as_bytes(), body_hash.as_bytes())) {
                    return Err(Rejection::BadBodyHash);
                }
            }
            parse_json(delivery.body)?
        } else {
            let mut params = decode_form_lossy(delivery.body);
            params.sort();
            let mut concatenated = String::new();
            for (name, value) in &params {
                concatenated.push_str(name);
                concatenated.push_str(value);
            }
            let data: Vec<String> = url_variants(delivery.public_url)
                .into_iter()
                .map(|url| url + &concatenated)
                .collect();
            let expected = self.macs(data.iter().map(|d| d.as_bytes()));
            if !any_match(&expected, &[presented]) {
                return Err(Rejection::BadSignature);
            }
            Value::Object(form_to_json(decode_form(delivery.body)?))
        };

        let id = optional_id_header(delivery.headers, &IDEMPOTENCY_HEADER)?;
        Ok(Verdict::Event(VerifiedEvent {
            id,
            kind: kind_of(&payload).to_owned(),
            payload,
        }))
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
        assert_eq!(url_variants("HTTP://h?x"), ["HTTP://h?x", "HTTP://h:80?x"]);
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
            query_param("https://h/?a=1&bodySHA256=x#y", "bodySHA256"),
            Ok(Some("x"))
        );
        assert_eq!(query_param("https://h/?a=1", "bodySHA256"), Ok(None));
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
            let _ = query_param(&url, BODY_HASH_PARAM);
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
