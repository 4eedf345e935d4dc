//! The seed corpus, built on purpose and deterministically: for every
//! verifier target, deliveries signed correctly (with the current and the
//! previous secret, at the edge of the timestamp tolerance) and near misses
//! (the body changed after signing, the signature cut short, missing or
//! given twice, a timestamp one second past the tolerance, a signed body
//! without an id or not parseable); for `dedup_key`, a delivery of every
//! scheme with and without a provider id; for `plan_decode`, plans this
//! build encodes and plans it must refuse.
//!
//! Each seed carries the outcome it must have (`event <id> <kind>`,
//! `refused <code>`, `key <dedup key>`, `plan <n> steps`, …).
//! `tests/tests/it/fuzz_regressions.rs` checks that the files in
//! `fuzz/seeds/<target>/` are exactly these bytes and have these outcomes,
//! and writes them with `TICKMARK_WRITE_FUZZ_SEEDS=1`; `scripts/fuzz` gives
//! them to the fuzzers as starting points (valid deliveries take a fuzzer
//! past the signature check at once).

use arbitrary::{Arbitrary, Unstructured};
use http::HeaderMap;

use super::encode::{any_delivery_bytes, delivery_bytes};
use super::harness::{
    check, check_dedup_key, sign, AnyDelivery, FuzzDelivery, FuzzHeader, FuzzName, Scheme, Signing,
    KNOWN_HEADERS,
};
use tickmark::receiver::providers::Verdict;
use tickmark_core::plan::{Plan, PlanError, StepOptions};
use tickmark_driver::retry::RetryPolicy;

/// One seed file.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The fuzz target (the folder under `fuzz/seeds/`).
    pub target: &'static str,
    /// The file name: what the input is.
    pub name: String,
    /// The raw fuzzer input.
    pub bytes: Vec<u8>,
    /// The outcome replaying it must give ([`outcome`]).
    pub expect: String,
}

/// The verifier targets and their schemes.
pub const VERIFY_TARGETS: [(&str, Scheme); 7] = [
    ("verify_stripe", Scheme::Stripe),
    ("verify_github", Scheme::GitHub),
    ("verify_shopify", Scheme::Shopify),
    ("verify_standard_webhooks", Scheme::StandardWebhooks),
    ("verify_slack", Scheme::Slack),
    ("verify_twilio", Scheme::Twilio),
    ("verify_generic_hmac", Scheme::GenericHmac),
];

/// Every fuzz target (as `fuzz/Cargo.toml` lists them).
pub const ALL_TARGETS: [&str; 9] = [
    "verify_stripe",
    "verify_github",
    "verify_shopify",
    "verify_standard_webhooks",
    "verify_slack",
    "verify_twilio",
    "verify_generic_hmac",
    "dedup_key",
    "plan_decode",
];

/// What replaying `data` on `target` gives, in the words of [`Seed::expect`].
pub fn outcome(target: &str, data: &[u8]) -> String {
    if target == "plan_decode" {
        return plan_outcome(data);
    }
    let input = Unstructured::new(data);
    if target == "dedup_key" {
        return match AnyDelivery::arbitrary_take_rest(input) {
            Ok(any) => match check_dedup_key(&any) {
                Some(key) => format!("key {key}"),
                None => "no key".to_owned(),
            },
            Err(_) => "undecodable".to_owned(),
        };
    }
    let Some((_, scheme)) = VERIFY_TARGETS.iter().find(|(t, _)| *t == target) else {
        return format!("no target {target}");
    };
    match FuzzDelivery::arbitrary_take_rest(input) {
        Ok(delivery) => match check(*scheme, &delivery) {
            Ok(Verdict::Event(event)) => format!(
                "event {} {}",
                event.id.as_deref().unwrap_or("-"),
                event.kind
            ),
            Ok(Verdict::Handshake(_)) => "handshake".to_owned(),
            Err(rejection) => format!("refused {}", rejection.code()),
        },
        Err(_) => "undecodable".to_owned(),
    }
}

fn plan_outcome(data: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(data) else {
        return "not utf-8".to_owned();
    };
    match Plan::decode(text) {
        Ok(plan) => format!("plan {} steps", plan.len()),
        Err(PlanError::UnknownStep { step_type, .. }) => format!("unknown step type {step_type}"),
        Err(PlanError::IncompatibleStep { step_type, .. }) => {
            format!("incompatible step {step_type}")
        }
        Err(PlanError::Malformed(_)) => "malformed".to_owned(),
        Err(_) => "refused".to_owned(),
    }
}

/// Every seed of every target, in a fixed order.
pub fn seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for (target, scheme) in VERIFY_TARGETS {
        for (name, delivery, expect) in verify_cases(scheme) {
            seeds.push(Seed {
                target,
                name: name.to_owned(),
                bytes: delivery_bytes(&delivery),
                expect,
            });
        }
    }
    for (name, any, expect) in dedup_cases() {
        seeds.push(Seed {
            target: "dedup_key",
            name,
            bytes: any_delivery_bytes(&any),
            expect,
        });
    }
    for (name, text, expect) in plan_cases() {
        seeds.push(Seed {
            target: "plan_decode",
            name: name.to_owned(),
            bytes: text.into_bytes(),
            expect: expect.to_owned(),
        });
    }
    seeds
}

type Case = (&'static str, FuzzDelivery, String);

fn header(name: &str, value: &str) -> FuzzHeader {
    FuzzHeader {
        name: FuzzName::Known(known(name)),
        value: value.as_bytes().to_vec(),
    }
}

fn known(name: &str) -> u8 {
    let index = KNOWN_HEADERS
        .iter()
        .position(|known| known.eq_ignore_ascii_case(name))
        .unwrap_or_else(|| panic!("{name} is not one of the harness's known headers"));
    u8::try_from(index).expect("few known headers")
}

/// A delivery the harness signs (current secret, `offset` seconds ago).
fn signed(headers: Vec<FuzzHeader>, body: &str, variant: u8, offset: i32) -> FuzzDelivery {
    FuzzDelivery {
        headers,
        body: body.as_bytes().to_vec(),
        query: None,
        clock_skew: 0,
        sign: Some(Signing {
            previous_secret: false,
            timestamp_offset: offset,
        }),
        variant,
    }
}

/// `delivery` with the signature the harness would add written into its
/// headers, and no request to sign: the starting point of a near miss (on
/// its own it would verify, and the harness rejects unsigned deliveries that
/// verify as forgeries, so every use changes something).
fn baked(scheme: Scheme, delivery: &FuzzDelivery) -> FuzzDelivery {
    let mut headers = delivery.header_map();
    let signing = delivery.sign.as_ref().expect("a signed delivery to bake");
    sign(
        scheme,
        delivery.variant,
        signing,
        &mut headers,
        &delivery.body,
        &delivery.public_url(),
        delivery.now(),
    );
    FuzzDelivery {
        headers: fuzz_headers(&headers),
        sign: None,
        ..delivery.clone()
    }
}

fn fuzz_headers(headers: &HeaderMap) -> Vec<FuzzHeader> {
    headers
        .iter()
        .map(|(name, value)| FuzzHeader {
            name: FuzzName::Known(known(name.as_str())),
            value: value.as_bytes().to_vec(),
        })
        .collect()
}

/// The name of `scheme`'s signature header (in the baked headers).
fn signature_header(scheme: Scheme, delivery: &FuzzDelivery) -> &'static str {
    match scheme {
        Scheme::Stripe => "stripe-signature",
        Scheme::GitHub => "x-hub-signature-256",
        Scheme::Shopify => "x-shopify-hmac-sha256",
        Scheme::StandardWebhooks => {
            let svix = known("svix-signature");
            if delivery
                .headers
                .iter()
                .any(|h| matches!(h.name, FuzzName::Known(i) if i == svix))
            {
                "svix-signature"
            } else {
                "webhook-signature"
            }
        }
        Scheme::Slack => "x-slack-signature",
        Scheme::Twilio => "x-twilio-signature",
        Scheme::GenericHmac => "x-signature",
    }
}

fn is_header(h: &FuzzHeader, name: &str) -> bool {
    matches!(h.name, FuzzName::Known(i) if i == known(name))
}

/// The near misses of a valid signed delivery.
fn near_misses(scheme: Scheme, valid: &FuzzDelivery) -> Vec<Case> {
    let baked = baked(scheme, valid);
    let sig = signature_header(scheme, &baked);
    let mut cases = Vec::new();

    let mut tampered = baked.clone();
    let last = tampered.body.len() - 2;
    tampered.body[last] ^= 0x01;
    cases.push((
        "tampered_body",
        tampered,
        "refused bad_signature".to_owned(),
    ));

    let mut missing = baked.clone();
    missing.headers.retain(|h| !is_header(h, sig));
    cases.push((
        "missing_signature",
        missing,
        "refused missing_signature".to_owned(),
    ));

    let mut twice = baked.clone();
    let copy = twice
        .headers
        .iter()
        .find(|h| is_header(h, sig))
        .expect("a signature header")
        .clone();
    twice.headers.push(copy);
    cases.push((
        "signature_twice",
        twice,
        "refused duplicate_header".to_owned(),
    ));

    let mut cut = baked;
    let value = &mut cut
        .headers
        .iter_mut()
        .find(|h| is_header(h, sig))
        .expect("a signature header")
        .value;
    value.truncate(value.len() - 4);
    cases.push((
        "signature_cut_short",
        cut,
        "refused malformed_signature".to_owned(),
    ));
    cases
}

/// Timestamp cases for a scheme that signs one: accepted at the tolerance
/// (300 s either way), refused one second past it.
fn timestamp_cases(valid: &FuzzDelivery, id: &str, kind: &str) -> Vec<Case> {
    let at = |offset: i32| {
        let mut delivery = valid.clone();
        delivery.sign = Some(Signing {
            previous_secret: false,
            timestamp_offset: offset,
        });
        delivery
    };
    vec![
        ("timestamp_300s_old", at(-300), format!("event {id} {kind}")),
        (
            "timestamp_300s_ahead",
            at(300),
            format!("event {id} {kind}"),
        ),
        (
            "timestamp_301s_old",
            at(-301),
            "refused stale_timestamp".to_owned(),
        ),
        (
            "timestamp_301s_ahead",
            at(301),
            "refused future_timestamp".to_owned(),
        ),
    ]
}

/// A valid delivery, the same signed with the previous secret, and its near misses.
fn common(scheme: Scheme, valid: FuzzDelivery, accepted: &str) -> Vec<Case> {
    let mut rotated = valid.clone();
    if let Some(signing) = rotated.sign.as_mut() {
        signing.previous_secret = true;
    }
    let mut cases = vec![
        ("valid", valid.clone(), accepted.to_owned()),
        ("valid_previous_secret", rotated, accepted.to_owned()),
    ];
    cases.extend(near_misses(scheme, &valid));
    cases
}

fn verify_cases(scheme: Scheme) -> Vec<Case> {
    let json = || header("content-type", "application/json");
    match scheme {
        Scheme::Stripe => {
            let body = r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#;
            let valid = signed(vec![json()], body, 0, -5);
            let mut cases = common(scheme, valid.clone(), "event evt_1 invoice.paid");
            cases.extend(timestamp_cases(&valid, "evt_1", "invoice.paid"));
            cases.push((
                "signed_without_id",
                signed(vec![json()], r#"{"type":"invoice.paid"}"#, 0, -5),
                "refused missing_id".to_owned(),
            ));
            cases.push((
                "signed_not_json",
                signed(vec![json()], "id=evt_1&type=invoice.paid", 0, -5),
                "refused malformed_body".to_owned(),
            ));
            cases
        }
        Scheme::GitHub => {
            let headers = vec![
                json(),
                header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                header("x-github-event", "push"),
            ];
            let valid = signed(headers, r#"{"ref":"refs/heads/main"}"#, 0, 0);
            let mut cases = common(
                scheme,
                valid,
                "event 72d3162e-cc78-11e3-81ab-4c9367dc0958 push",
            );
            cases.push((
                "signed_without_delivery_id",
                signed(
                    vec![json(), header("x-github-event", "push")],
                    r#"{"ref":"refs/heads/main"}"#,
                    0,
                    0,
                ),
                "refused missing_id".to_owned(),
            ));
            cases
        }
        Scheme::Shopify => {
            let headers = vec![
                json(),
                header(
                    "x-shopify-webhook-id",
                    "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
                ),
                header("x-shopify-topic", "orders/create"),
            ];
            let valid = signed(headers, r#"{"id":820982911946154508}"#, 0, 0);
            let mut cases = common(
                scheme,
                valid,
                "event b54557e4-bdd9-4b37-8a5f-bf7d70bcd043 orders/create",
            );
            cases.push((
                "signed_without_topic",
                signed(
                    vec![json(), header("x-shopify-webhook-id", "w-2")],
                    r#"{"id":1}"#,
                    0,
                    0,
                ),
                "refused missing_kind".to_owned(),
            ));
            cases
        }
        Scheme::StandardWebhooks => {
            let body = r#"{"type":"invoice.paid","data":{"id":"in_1"}}"#;
            let valid = signed(vec![json(), header("webhook-id", "msg_1")], body, 0, -5);
            let mut cases = common(scheme, valid.clone(), "event msg_1 invoice.paid");
            cases.extend(timestamp_cases(&valid, "msg_1", "invoice.paid"));
            cases.push((
                "svix_names",
                signed(vec![json(), header("svix-id", "msg_2")], body, 0, -5),
                "event msg_2 invoice.paid".to_owned(),
            ));
            let mut svix_tampered = baked(
                scheme,
                &signed(vec![json(), header("svix-id", "msg_3")], body, 0, -5),
            );
            svix_tampered.body[2] ^= 0x01;
            cases.push((
                "svix_names_tampered_body",
                svix_tampered,
                "refused bad_signature".to_owned(),
            ));
            cases.push((
                "signed_without_type",
                signed(
                    vec![json(), header("webhook-id", "msg_4")],
                    r#"{"data":{}}"#,
                    0,
                    -5,
                ),
                "refused missing_kind".to_owned(),
            ));
            cases
        }
        Scheme::Slack => {
            let body = r#"{"type":"event_callback","event_id":"Ev08MFMKH6","event":{"type":"app_mention"}}"#;
            let valid = signed(vec![json()], body, 0, -5);
            let mut cases = common(scheme, valid.clone(), "event Ev08MFMKH6 app_mention");
            cases.extend(timestamp_cases(&valid, "Ev08MFMKH6", "app_mention"));
            cases.push((
                "url_verification_handshake",
                signed(
                    vec![json()],
                    r#"{"type":"url_verification","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#,
                    0,
                    -5,
                ),
                "handshake".to_owned(),
            ));
            cases.push((
                "signed_without_event_id",
                signed(
                    vec![json()],
                    r#"{"type":"event_callback","event":{"type":"app_mention"}}"#,
                    0,
                    -5,
                ),
                "refused missing_id".to_owned(),
            ));
            cases
        }
        Scheme::Twilio => {
            let form = header("content-type", "application/x-www-form-urlencoded");
            let valid = signed(
                vec![form.clone(), header("i-twilio-idempotency-token", "tok-1")],
                "MessageSid=SM1&Body=Hello+there%21&From=%2B15550001111",
                0,
                0,
            );
            let mut cases = common(scheme, valid, "event tok-1 message");
            cases.push((
                "form_without_token",
                signed(vec![form], "CallSid=CA1&CallStatus=ringing", 0, 0),
                "event - call".to_owned(),
            ));
            cases.push((
                "json_body",
                signed(vec![json()], r#"{"CallSid":"CA2"}"#, 0, 0),
                "event - call".to_owned(),
            ));
            let mut wrong_hash = signed(vec![json()], r#"{"CallSid":"CA3"}"#, 0, 0);
            wrong_hash.query = Some(format!("bodySHA256={}", "0".repeat(64)));
            cases.push((
                "json_body_hash_mismatch",
                wrong_hash,
                "refused bad_body_hash".to_owned(),
            ));
            cases
        }
        Scheme::GenericHmac => {
            let valid = signed(
                vec![json(), header("x-event-type", "order.created")],
                r#"{"id":"ord_1"}"#,
                0,
                0,
            );
            let mut cases = common(scheme, valid, "event ord_1 order.created");
            cases.push((
                "sha512_base64_variant",
                signed(
                    vec![json(), header("x-event-id", "ord_2")],
                    r#"{"event":{"type":"order.paid"}}"#,
                    1,
                    0,
                ),
                "event ord_2 order.paid".to_owned(),
            ));
            cases.push((
                "sha1_hex_variant_without_id",
                signed(vec![json()], r#"{"any":"thing"}"#, 2, 0),
                "event - webhook".to_owned(),
            ));
            cases.push((
                "signed_not_json",
                signed(
                    vec![json(), header("x-event-type", "order.created")],
                    "not json",
                    0,
                    0,
                ),
                "refused malformed_body".to_owned(),
            ));
            cases
        }
    }
}

fn dedup_cases() -> Vec<(String, AnyDelivery, String)> {
    let mut cases = Vec::new();
    for (target, scheme) in VERIFY_TARGETS {
        let scheme_name = target.trim_start_matches("verify_");
        for (name, delivery, expect) in verify_cases(scheme) {
            // The accepted deliveries of each scheme, with their key: the
            // provider's id, or the body's hash.
            let Some(rest) = expect.strip_prefix("event ") else {
                continue;
            };
            if !matches!(
                name,
                "valid" | "form_without_token" | "sha1_hex_variant_without_id"
            ) {
                continue;
            }
            let id = rest.split(' ').next().unwrap_or("-");
            let key = if id == "-" {
                tickmark::inbox::body_hash(&delivery.body)
            } else {
                id.to_owned()
            };
            cases.push((
                format!("{scheme_name}_{name}"),
                AnyDelivery { scheme, delivery },
                format!("key {key}"),
            ));
        }
    }
    cases
}

fn plan_cases() -> Vec<(&'static str, String, &'static str)> {
    let step = super::harness::FuzzStep {
        n: 42,
        text: "café ☕".to_owned(),
        list: vec![-1, 0, i32::MAX],
    };
    let plain = super::harness::FuzzStep {
        n: 0,
        text: String::new(),
        list: Vec::new(),
    };
    let options = StepOptions {
        timeout: Some(std::time::Duration::from_secs(90)),
        retry: Some(RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        }),
    };
    let encoded = Plan::encode(
        &RetryPolicy::default(),
        [
            ("charge", &step as &dyn tickmark::Step, options),
            (
                "notify",
                &plain as &dyn tickmark::Step,
                StepOptions::default(),
            ),
        ],
    )
    .expect("a plan encodes");
    let unknown = encoded.replace("\"fuzz.step\"", "\"gone.step\"");
    let incompatible = encoded.replace("\"n\":42", "\"n\":\"forty-two\"");
    let future = encoded.replacen("\"version\":1", "\"version\":99", 1);
    let half = (0..=encoded.len() / 2)
        .rev()
        .find(|at| encoded.is_char_boundary(*at))
        .unwrap_or(0);
    let truncated = encoded.split_at(half).0.to_owned();
    vec![
        ("encoded_by_this_build.json", encoded, "plan 2 steps"),
        (
            "unknown_step_type.json",
            unknown,
            "unknown step type gone.step",
        ),
        (
            "incompatible_step_config.json",
            incompatible,
            "incompatible step fuzz.step",
        ),
        ("future_version.json", future, "malformed"),
        ("truncated.json", truncated, "malformed"),
    ]
}
