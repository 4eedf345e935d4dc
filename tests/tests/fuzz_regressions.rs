//! Every input the fuzzers ever found a problem with, replayed on every test
//! run: the files in `fuzz/regressions/<target>/` (and the seed inputs in
//! `fuzz/seeds/<target>/`) go through the same harness as `cargo fuzz`
//! (`fuzz/src/harness.rs`, included here), with the same checks.
//! `docs/fuzzing.md` says how a crash becomes one of these files.

#[allow(dead_code, missing_docs)]
#[path = "../../fuzz/src/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

/// The saved inputs, as (target, file).
fn saved_inputs() -> Vec<(String, PathBuf)> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut inputs = Vec::new();
    for kind in ["regressions", "seeds"] {
        let Ok(targets) = std::fs::read_dir(fuzz.join(kind)) else {
            continue;
        };
        for target in targets.filter_map(Result::ok) {
            let name = target.file_name().to_string_lossy().into_owned();
            let Ok(files) = std::fs::read_dir(target.path()) else {
                continue;
            };
            for file in files.filter_map(Result::ok) {
                if file.path().is_file() {
                    inputs.push((name.clone(), file.path()));
                }
            }
        }
    }
    inputs.sort();
    inputs
}

#[test]
fn every_saved_fuzz_input_passes_the_fuzz_checks() {
    let inputs = saved_inputs();
    assert!(
        !inputs.is_empty(),
        "fuzz/regressions and fuzz/seeds are empty"
    );
    let mut failures = Vec::new();
    for (target, path) in &inputs {
        let data = std::fs::read(path).expect("read a saved input");
        let target = target.clone();
        if let Err(panic) = std::panic::catch_unwind(move || harness::run_target(&target, &data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {message}", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} saved fuzz inputs fail:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

/// The harness's own signer agrees with every provider: a well-formed
/// delivery it signs verifies (so the fuzzers really reach the code behind
/// the signature check), and the same delivery unsigned does not.
#[test]
fn the_harness_signs_every_scheme_as_its_provider_verifies() {
    use harness::{check, FuzzDelivery, FuzzHeader, FuzzName, Scheme, Signing};

    let header = |name: &str, value: &str| FuzzHeader {
        name: FuzzName::Other(name.to_owned()),
        value: value.as_bytes().to_vec(),
    };
    let json = header("content-type", "application/json");
    let cases: Vec<(Scheme, Vec<FuzzHeader>, &str, u8)> = vec![
        (
            Scheme::Stripe,
            vec![json.clone()],
            r#"{"id":"evt_1","type":"invoice.paid"}"#,
            0,
        ),
        (
            Scheme::GitHub,
            vec![
                json.clone(),
                header("x-github-delivery", "d-1"),
                header("x-github-event", "push"),
            ],
            r#"{"ref":"main"}"#,
            0,
        ),
        (
            Scheme::Shopify,
            vec![
                json.clone(),
                header("x-shopify-webhook-id", "w-1"),
                header("x-shopify-topic", "orders/create"),
            ],
            r#"{"id":1}"#,
            0,
        ),
        (
            Scheme::StandardWebhooks,
            vec![json.clone(), header("webhook-id", "msg_1")],
            r#"{"type":"invoice.paid"}"#,
            0,
        ),
        (
            Scheme::StandardWebhooks,
            vec![json.clone(), header("svix-id", "msg_2")],
            r#"{"type":"invoice.paid"}"#,
            0,
        ),
        (
            Scheme::Slack,
            vec![json.clone()],
            r#"{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention"}}"#,
            0,
        ),
        (
            Scheme::Twilio,
            vec![header("content-type", "application/x-www-form-urlencoded")],
            "MessageSid=SM1&Body=a+b%21&Body=%zz&From=%2B1555",
            0,
        ),
        (
            Scheme::Twilio,
            vec![json.clone()],
            r#"{"CallSid":"CA1"}"#,
            0,
        ),
        (
            Scheme::GenericHmac,
            vec![json.clone(), header("x-event-type", "order.created")],
            r#"{"id":"ord_1"}"#,
            0,
        ),
        (
            Scheme::GenericHmac,
            vec![json.clone(), header("x-event-id", "ord_2")],
            r#"{"event":{"type":"order.paid"}}"#,
            1,
        ),
        (Scheme::GenericHmac, vec![json], r#"{"any":"thing"}"#, 2),
    ];
    for (scheme, headers, body, variant) in cases {
        let mut delivery = FuzzDelivery {
            headers,
            body: body.as_bytes().to_vec(),
            query: None,
            clock_skew: 0,
            sign: Some(Signing {
                previous_secret: variant == 1,
                timestamp_offset: -5,
            }),
            variant,
        };
        let verdict = check(scheme, &delivery);
        assert!(
            matches!(
                verdict,
                Ok(tickmark::receiver::providers::Verdict::Event(_))
            ),
            "{scheme:?} variant {variant}: {verdict:?}"
        );
        delivery.sign = None;
        assert!(check(scheme, &delivery).is_err(), "{scheme:?} unsigned");
    }
}
