//! The fuzz harness, shared by the `cargo fuzz` targets (`fuzz_targets/`)
//! and by the regression test that replays saved inputs
//! (`tests/tests/it/fuzz_regressions.rs`, which includes this file as a module).
//!
//! A [`FuzzDelivery`] is structured input: header names (picked from the
//! ones the providers read, or free text) with arbitrary byte values, an
//! arbitrary body, an optional public-URL query, a clock offset and, when
//! [`FuzzDelivery::sign`] is set, a request to sign the delivery correctly
//! (an independent signer below) so the fuzzer reaches the code behind the
//! signature check: JSON and form parsing, ids, kinds, timestamps.
//!
//! The properties checked on every input (a failure panics, which the
//! fuzzer reports as a crash):
//! 1. `verify` never panics;
//! 2. a delivery the harness did not sign never verifies (no forgery);
//! 3. a delivery the harness signed is never refused as `bad_signature`
//!    (the verifier and an independent signer agree on the signed bytes);
//! 4. an accepted event's id and kind are 1 to 255 bytes with no control
//!    characters, and a timestamped scheme accepted it within its tolerance;
//! 5. a refusal is a 400 or 401 whose message contains no secret and no
//!    long run of the request's own bytes;
//! 6. the dedup key is the provider's id, or `sha256:` + 64 lowercase hex
//!    digits of the raw body, and the same delivery gives the same key.

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tickmark::receiver::providers::{
    Algorithm, Delivery, Encoding, FieldSource, GenericHmac, GenericHmacConfig, GitHub, Provider,
    Rejection, Shopify, Slack, StandardWebhooks, Stripe, Twilio, Verdict,
};
use tickmark::{NewEvent, Step, StepContext, StepResult};
use tickmark_receiver::providers::{DEFAULT_TOLERANCE, MAX_ID_BYTES, MAX_KIND_BYTES};

/// The fixed "now" of every delivery (plus the input's clock offset).
pub const NOW: i64 = 1_750_000_000;

/// The public base URL Twilio deliveries are checked against.
pub const PUBLIC_URL: &str = "https://hooks.example.test/hooks/twilio";

/// The secrets each provider is built with (current, previous).
pub const SECRETS: [&str; 2] = [
    "whsec_ZnV6ei1jdXJyZW50LXNlY3JldC1rZXktMzI=",
    "whsec_cHJldmlvdXM=",
];

/// The secrets, as the providers other than Standard Webhooks use them.
const PLAIN_SECRETS: [&str; 2] = ["fuzz-current-secret", "fuzz-previous-secret"];

/// Every header name the providers read, for [`FuzzName::Known`].
pub const KNOWN_HEADERS: [&str; 22] = [
    "stripe-signature",
    "x-hub-signature-256",
    "x-github-delivery",
    "x-github-event",
    "x-shopify-hmac-sha256",
    "x-shopify-webhook-id",
    "x-shopify-topic",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-twilio-signature",
    "i-twilio-idempotency-token",
    "x-signature",
    "x-event-type",
    "x-event-id",
    "content-type",
    "content-length",
];

/// The provider schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Scheme {
    /// `Stripe-Signature`.
    Stripe,
    /// `X-Hub-Signature-256`.
    GitHub,
    /// `X-Shopify-Hmac-Sha256`.
    Shopify,
    /// `webhook-*` / `svix-*`.
    StandardWebhooks,
    /// `X-Slack-Signature`.
    Slack,
    /// `X-Twilio-Signature`.
    Twilio,
    /// A configured header (three configurations, by [`FuzzDelivery::variant`]).
    GenericHmac,
}

/// A header name: one the providers read, or any text.
#[derive(Debug, Clone, Arbitrary)]
pub enum FuzzName {
    /// `KNOWN_HEADERS[index % len]`.
    Known(u8),
    /// Free text (skipped when not a valid header name).
    Other(String),
}

/// One header line.
#[derive(Debug, Clone, Arbitrary)]
pub struct FuzzHeader {
    /// Its name.
    pub name: FuzzName,
    /// Its value, any bytes (skipped when HTTP would not carry them).
    pub value: Vec<u8>,
}

/// How the harness signs a delivery.
#[derive(Debug, Clone, Arbitrary)]
pub struct Signing {
    /// Sign with the previous secret instead of the current one (rotation).
    pub previous_secret: bool,
    /// The signed timestamp, relative to now, in seconds.
    pub timestamp_offset: i32,
}

/// One structured delivery.
#[derive(Debug, Clone, Arbitrary)]
pub struct FuzzDelivery {
    /// Header lines, in order; a name may repeat.
    pub headers: Vec<FuzzHeader>,
    /// The raw body.
    pub body: Vec<u8>,
    /// A query string for the public URL (Twilio signs it).
    pub query: Option<String>,
    /// Seconds the receiver's clock is off [`NOW`].
    pub clock_skew: i16,
    /// Sign the delivery correctly (after the headers are laid out).
    pub sign: Option<Signing>,
    /// Which generic-HMAC configuration (0, 1 or 2, modulo 3).
    pub variant: u8,
}

/// A delivery for one scheme chosen by the input (the `dedup_key` target).
#[derive(Debug, Clone, Arbitrary)]
pub struct AnyDelivery {
    /// The scheme.
    pub scheme: Scheme,
    /// The delivery.
    pub delivery: FuzzDelivery,
}

/// A step type registered in the fuzz binaries, so that [`check_plan`]
/// decodes known types as well as unknown ones.
#[derive(Debug, Serialize, Deserialize)]
pub struct FuzzStep {
    /// A number.
    pub n: u64,
    /// Some text.
    pub text: String,
    /// A list.
    #[serde(default)]
    pub list: Vec<i32>,
}

#[typetag::serde(name = "fuzz.step")]
#[async_trait::async_trait]
impl Step for FuzzStep {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Ok(serde_json::Value::Null)
    }
}

impl Scheme {
    fn provider(self, variant: u8) -> Box<dyn Provider> {
        match self {
            Scheme::Stripe => Box::new(Stripe::new(PLAIN_SECRETS).expect("secrets")),
            Scheme::GitHub => Box::new(GitHub::new(PLAIN_SECRETS).expect("secrets")),
            Scheme::Shopify => Box::new(Shopify::new(PLAIN_SECRETS).expect("secrets")),
            Scheme::StandardWebhooks => Box::new(StandardWebhooks::new(SECRETS).expect("secrets")),
            Scheme::Slack => Box::new(Slack::new(PLAIN_SECRETS).expect("secrets")),
            Scheme::Twilio => Box::new(Twilio::new(PLAIN_SECRETS).expect("secrets")),
            Scheme::GenericHmac => {
                Box::new(GenericHmac::new(generic_config(variant)).expect("config"))
            }
        }
    }

    fn timestamped(self) -> bool {
        matches!(
            self,
            Scheme::Stripe | Scheme::StandardWebhooks | Scheme::Slack
        )
    }

    fn source(self) -> &'static str {
        match self {
            Scheme::Stripe => "stripe",
            Scheme::GitHub => "github",
            Scheme::Shopify => "shopify",
            Scheme::StandardWebhooks => "standard",
            Scheme::Slack => "slack",
            Scheme::Twilio => "twilio",
            Scheme::GenericHmac => "generic",
        }
    }
}

fn generic_config(variant: u8) -> GenericHmacConfig {
    match variant % 3 {
        0 => {
            let mut c = GenericHmacConfig::new(
                "X-Signature",
                Algorithm::Sha256,
                Encoding::Hex,
                PLAIN_SECRETS,
            );
            c.prefix = Some("sha256=".into());
            c.id = Some(FieldSource::JsonPointer("/id".into()));
            c.kind = Some(FieldSource::Header("X-Event-Type".into()));
            c
        }
        1 => {
            let mut c = GenericHmacConfig::new(
                "X-Signature",
                Algorithm::Sha512,
                Encoding::Base64,
                PLAIN_SECRETS,
            );
            c.id = Some(FieldSource::Header("X-Event-Id".into()));
            c.kind = Some(FieldSource::JsonPointer("/event/type".into()));
            c
        }
        _ => GenericHmacConfig::new("X-Signature", Algorithm::Sha1, Encoding::Hex, PLAIN_SECRETS),
    }
}

fn hmac256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("any key length");
    parts.iter().for_each(|part| mac.update(part));
    mac.finalize().into_bytes().to_vec()
}

fn hmac512(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <Hmac<sha2::Sha512> as Mac>::new_from_slice(key).expect("any key length");
    parts.iter().for_each(|part| mac.update(part));
    mac.finalize().into_bytes().to_vec()
}

fn hmac1(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <Hmac<sha1::Sha1> as Mac>::new_from_slice(key).expect("any key length");
    parts.iter().for_each(|part| mac.update(part));
    mac.finalize().into_bytes().to_vec()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn set(headers: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(name), Ok(value)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        headers.insert(name, value);
    }
}

/// The first value of `name`, as bytes.
fn first<'a>(headers: &'a HeaderMap, name: &str) -> &'a [u8] {
    headers
        .get(name)
        .map(HeaderValue::as_bytes)
        .unwrap_or_default()
}

/// The media type as the providers read it.
fn media(headers: &HeaderMap) -> Option<String> {
    let text = headers.get("content-type")?.to_str().ok()?;
    let essence = text.split(';').next().unwrap_or_default().trim();
    (!essence.is_empty()).then(|| essence.to_ascii_lowercase())
}

fn is_json_media(media: Option<&str>) -> bool {
    matches!(media, Some(m) if m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")))
}

impl FuzzDelivery {
    /// The headers as HTTP would carry them.
    pub fn header_map(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for header in &self.headers {
            let name = match &header.name {
                FuzzName::Known(index) => {
                    KNOWN_HEADERS[usize::from(*index) % KNOWN_HEADERS.len()].to_owned()
                }
                FuzzName::Other(text) => text.clone(),
            };
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(&header.value),
            ) {
                headers.append(name, value);
            }
        }
        headers
    }

    /// The public URL the delivery was posted to.
    pub fn public_url(&self) -> String {
        match &self.query {
            Some(query) => format!("{PUBLIC_URL}?{query}"),
            None => PUBLIC_URL.to_owned(),
        }
    }

    /// The receiver's clock.
    pub fn now(&self) -> i64 {
        NOW + i64::from(self.clock_skew)
    }
}

/// Sign `headers` and `body` for `scheme` as the provider would, replacing
/// the signature (and timestamp) headers.
pub(crate) fn sign(
    scheme: Scheme,
    variant: u8,
    signing: &Signing,
    headers: &mut HeaderMap,
    body: &[u8],
    url: &str,
    now: i64,
) {
    let index = usize::from(signing.previous_secret);
    let secret = PLAIN_SECRETS[index].as_bytes();
    let t = (now + i64::from(signing.timestamp_offset)).to_string();
    match scheme {
        Scheme::Stripe => {
            let sig = hex::encode(hmac256(secret, &[t.as_bytes(), b".", body]));
            set(headers, "stripe-signature", &format!("t={t},v1={sig}"));
        }
        Scheme::GitHub => {
            let sig = hex::encode(hmac256(secret, &[body]));
            set(headers, "x-hub-signature-256", &format!("sha256={sig}"));
        }
        Scheme::Shopify => set(
            headers,
            "x-shopify-hmac-sha256",
            &b64(&hmac256(secret, &[body])),
        ),
        Scheme::StandardWebhooks => {
            let prefix = if ["webhook-id", "webhook-timestamp", "webhook-signature"]
                .iter()
                .any(|n| headers.contains_key(*n))
            {
                "webhook"
            } else {
                "svix"
            };
            let key = base64::engine::general_purpose::STANDARD
                .decode(SECRETS[index].trim_start_matches("whsec_"))
                .expect("base64 key");
            set(headers, &format!("{prefix}-timestamp"), &t);
            let id = first(headers, &format!("{prefix}-id")).to_vec();
            let sig = b64(&hmac256(&key, &[&id, b".", t.as_bytes(), b".", body]));
            set(
                headers,
                &format!("{prefix}-signature"),
                &format!("v1,{sig}"),
            );
        }
        Scheme::Slack => {
            set(headers, "x-slack-request-timestamp", &t);
            let sig = hex::encode(hmac256(secret, &[b"v0:", t.as_bytes(), b":", body]));
            set(headers, "x-slack-signature", &format!("v0={sig}"));
        }
        Scheme::Twilio => {
            let data = if is_json_media(media(headers).as_deref()) {
                if url.contains("bodySHA256=") {
                    url.to_owned()
                } else {
                    let hash = hex::encode(sha2::Sha256::digest(body));
                    let separator = if url.ends_with(['?', '&']) {
                        ""
                    } else if url.contains('?') {
                        "&"
                    } else {
                        "?"
                    };
                    format!("{url}{separator}bodySHA256={hash}")
                }
            } else {
                // An independent form decoder: lenient, as Twilio's libraries are.
                let mut params: Vec<(String, String)> = form_urlencoded_lossy(body);
                params.sort();
                let mut data = url.to_owned();
                for (name, value) in params {
                    data.push_str(&name);
                    data.push_str(&value);
                }
                data
            };
            let sig = b64(&hmac1(secret, &[data.as_bytes()]));
            set(headers, "x-twilio-signature", &sig);
        }
        Scheme::GenericHmac => {
            let value = match variant % 3 {
                0 => format!("sha256={}", hex::encode(hmac256(secret, &[body]))),
                1 => b64(&hmac512(secret, &[body])),
                _ => hex::encode(hmac1(secret, &[body])),
            };
            set(headers, "x-signature", &value);
        }
    }
}

/// `application/x-www-form-urlencoded`, decoded leniently: `+` is a space,
/// `%XX` a byte, a stray `%` stays, invalid UTF-8 becomes U+FFFD.
fn form_urlencoded_lossy(body: &[u8]) -> Vec<(String, String)> {
    fn decode(input: &[u8]) -> String {
        let mut out = Vec::with_capacity(input.len());
        let mut i = 0;
        while i < input.len() {
            match input[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < input.len()
                    && input[i + 1].is_ascii_hexdigit()
                    && input[i + 2].is_ascii_hexdigit() =>
                {
                    let hex = [input[i + 1], input[i + 2]];
                    let text = std::str::from_utf8(&hex).unwrap_or("00");
                    out.push(u8::from_str_radix(text, 16).unwrap_or(0));
                    i += 2;
                }
                other => out.push(other),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    body.split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| match piece.iter().position(|&b| b == b'=') {
            Some(eq) => (decode(&piece[..eq]), decode(&piece[eq + 1..])),
            None => (decode(piece), String::new()),
        })
        .collect()
}

fn valid_text(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && !text.chars().any(char::is_control)
}

/// Verify `input` with `scheme`'s provider and check the properties in the
/// module documentation. Returns the verdict for further checks.
pub fn check(scheme: Scheme, input: &FuzzDelivery) -> Result<Verdict, Rejection> {
    let provider = scheme.provider(input.variant);
    let mut headers = input.header_map();
    let url = input.public_url();
    let now = input.now();
    if let Some(signing) = &input.sign {
        sign(
            scheme,
            input.variant,
            signing,
            &mut headers,
            &input.body,
            &url,
            now,
        );
    }
    let delivery = Delivery {
        headers: &headers,
        body: &input.body,
        public_url: &url,
        now: chrono::DateTime::from_timestamp(now, 0).expect("a valid time"),
    };
    let verdict = provider.verify(&delivery);
    match &verdict {
        Ok(verdict) => {
            assert!(
                input.sign.is_some(),
                "an unsigned delivery verified: {verdict:?}"
            );
            if let Verdict::Event(event) = verdict {
                if let Some(id) = &event.id {
                    assert!(valid_text(id, MAX_ID_BYTES), "accepted id {id:?}");
                }
                assert!(
                    valid_text(&event.kind, MAX_KIND_BYTES),
                    "accepted kind {:?}",
                    event.kind
                );
            }
            if scheme.timestamped() {
                let offset = input
                    .sign
                    .as_ref()
                    .map_or(0, |s| i64::from(s.timestamp_offset));
                let tolerance = i64::try_from(DEFAULT_TOLERANCE.as_secs()).unwrap_or(i64::MAX);
                assert!(
                    offset.abs() <= tolerance,
                    "accepted a timestamp {offset} s off"
                );
            }
        }
        Err(rejection) => {
            let status = rejection.status().as_u16();
            assert!(
                status == 400 || status == 401,
                "{rejection:?} answers {status}"
            );
            let message = rejection.to_string();
            for secret in SECRETS.iter().chain(PLAIN_SECRETS.iter()) {
                assert!(
                    !message.contains(secret),
                    "a message shows a secret: {message}"
                );
            }
            // Messages are fixed text, chosen header names and numbers: none
            // has these characters, so a value with one of them that shows up
            // in a message was echoed (plain words could match the text).
            let echoed = |bytes: &[u8]| {
                let text = String::from_utf8_lossy(bytes);
                text.len() >= 16
                    && text.contains(['{', '"', '\\', '|', '<', '>'])
                    && message.contains(text.as_ref())
            };
            for header in &input.headers {
                assert!(
                    !echoed(&header.value),
                    "a message echoes a header value: {message}"
                );
            }
            assert!(!echoed(&input.body), "a message echoes the body: {message}");
            let query_claims_hash = input
                .query
                .as_deref()
                .is_some_and(|q| q.contains("bodySHA256"));
            if input.sign.is_some() && !query_claims_hash {
                assert!(
                    !matches!(rejection, Rejection::BadSignature | Rejection::BadBodyHash),
                    "a correctly signed delivery was refused: {rejection:?}"
                );
            }
        }
    }
    verdict
}

/// The dedup key the receiver would store for `input`, checked.
pub fn check_dedup_key(input: &AnyDelivery) -> Option<String> {
    let verdict = check(input.scheme, &input.delivery);
    let Ok(Verdict::Event(event)) = verdict else {
        return None;
    };
    let source = input.scheme.source();
    let built = match event.id.clone() {
        Some(id) => NewEvent::with_id(source, id, event.kind.clone(), event.payload.clone()),
        None => NewEvent::from_body(
            source,
            event.kind.clone(),
            &input.delivery.body,
            event.payload.clone(),
        ),
    };
    match &event.id {
        Some(id) => assert_eq!(&built.dedup_key, id),
        None => {
            let hex = built
                .dedup_key
                .strip_prefix("sha256:")
                .expect("a body-hash key");
            assert_eq!(hex.len(), 64, "{}", built.dedup_key);
            assert!(hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert_eq!(
                built.dedup_key,
                tickmark::inbox::body_hash(&input.delivery.body)
            );
        }
    }
    assert!(
        valid_text(&built.dedup_key, MAX_ID_BYTES.max(71)),
        "{:?}",
        built.dedup_key
    );
    assert_eq!(built.source, source);
    // The same delivery again is the same key: a redelivery is a duplicate.
    let again = match check(input.scheme, &input.delivery) {
        Ok(Verdict::Event(event)) => event
            .id
            .unwrap_or_else(|| tickmark::inbox::body_hash(&input.delivery.body)),
        other => panic!("the same delivery verified differently: {other:?}"),
    };
    assert_eq!(again, built.dedup_key);
    Some(built.dedup_key)
}

/// Decode `data` as a stored plan; a decoded plan encodes and decodes again
/// to the same steps.
pub fn check_plan(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = tickmark_core::plan::Plan::decode(text) else {
        return;
    };
    let encoded = tickmark_core::plan::Plan::encode_steps(
        &plan.retry,
        plan.steps
            .iter()
            .map(tickmark_core::plan::PlannedStep::to_encode),
    )
    .expect("a decoded plan encodes");
    let again = tickmark_core::plan::Plan::decode(&encoded).expect("an encoded plan decodes");
    assert_eq!(again.len(), plan.len());
    for (a, b) in again.steps.iter().zip(&plan.steps) {
        assert_eq!(a.name, b.name);
        assert_eq!(a.options, b.options, "step {}", a.name);
        assert_eq!(a.only_if, b.only_if, "step {}", a.name);
    }
    for step in &plan.steps {
        if let Some(retry) = step.options.retry {
            for attempt in [0, 1, 2, 10, 64, u32::MAX] {
                let _ = retry.delay_after(attempt, 0.5);
            }
        }
    }
    // The retry maths on a stored policy is total.
    for attempt in [0, 1, 2, 10, 64, u32::MAX] {
        let delay = plan.retry.delay_after(attempt, 0.5);
        assert!(delay <= Duration::MAX);
    }
}

/// Run target `target` on raw fuzzer bytes, as `cargo fuzz` would.
pub fn run_target(target: &str, data: &[u8]) {
    let input = Unstructured::new(data);
    let scheme = match target {
        "verify_stripe" => Scheme::Stripe,
        "verify_github" => Scheme::GitHub,
        "verify_shopify" => Scheme::Shopify,
        "verify_standard_webhooks" => Scheme::StandardWebhooks,
        "verify_slack" => Scheme::Slack,
        "verify_twilio" => Scheme::Twilio,
        "verify_generic_hmac" => Scheme::GenericHmac,
        "dedup_key" => {
            if let Ok(any) = AnyDelivery::arbitrary_take_rest(input) {
                check_dedup_key(&any);
            }
            return;
        }
        "plan_decode" => return check_plan(data),
        other => panic!("no fuzz target {other}"),
    };
    if let Ok(delivery) = FuzzDelivery::arbitrary_take_rest(input) {
        let _ = check(scheme, &delivery);
    }
}
