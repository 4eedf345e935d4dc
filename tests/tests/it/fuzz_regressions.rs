//! Every input the fuzzers ever found a problem with, and the seed corpus
//! they start from, replayed on every test run: the files in
//! `fuzz/regressions/<target>/` and `fuzz/seeds/<target>/` go through the
//! same harness as `cargo fuzz` (`fuzz/src/harness.rs`, included here), with
//! the same checks. The seeds are written by a deterministic generator
//! (`fuzz/src/seeds.rs`): valid signed deliveries and near misses for every
//! verifier, each with the outcome it must have. `docs/fuzzing.md` says how a
//! crash becomes a regression file, and how to regenerate the seeds
//! (`TICKMARK_WRITE_FUZZ_SEEDS=1`).

#[allow(dead_code, missing_docs)]
#[path = "../../../fuzz/src/harness.rs"]
mod harness;

#[allow(dead_code, missing_docs)]
#[path = "../../../fuzz/src/encode.rs"]
mod encode;

#[allow(dead_code, missing_docs)]
#[path = "../../../fuzz/src/seeds.rs"]
mod seeds;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir` (not recursive), sorted.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// The saved inputs, as (target, file). Every target has a non-empty seed
/// folder, and every folder is a target's and holds at least one file: a
/// lost or misnamed corpus fails here instead of replaying nothing.
fn saved_inputs() -> Vec<(String, PathBuf)> {
    let mut inputs = Vec::new();
    let mut problems = Vec::new();
    for kind in ["seeds", "regressions"] {
        let root = fuzz_dir().join(kind);
        let mut folders: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("read {}: {e}", root.display()))
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.is_dir())
            .collect();
        folders.sort();
        for folder in folders {
            let target = folder
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !seeds::ALL_TARGETS.contains(&target.as_str()) {
                problems.push(format!(
                    "{} is not a fuzz target's folder",
                    folder.display()
                ));
            }
            let files = files_in(&folder);
            if files.is_empty() {
                problems.push(format!("{} is empty", folder.display()));
            }
            inputs.extend(files.into_iter().map(|file| (target.clone(), file)));
        }
    }
    for target in seeds::ALL_TARGETS {
        if !inputs
            .iter()
            .any(|(t, f)| t == target && f.starts_with(fuzz_dir().join("seeds")))
        {
            problems.push(format!("fuzz/seeds/{target}/ is missing or empty"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    inputs
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn every_saved_fuzz_input_passes_the_fuzz_checks() {
    let inputs = saved_inputs();
    let mut failures = Vec::new();
    for (target, path) in &inputs {
        let data = std::fs::read(path).expect("read a saved input");
        let target = target.clone();
        if let Err(panic) = std::panic::catch_unwind(move || harness::run_target(&target, &data)) {
            failures.push(format!("{}: {}", path.display(), panic_text(&*panic)));
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

/// The committed seeds are exactly what the generator writes, and each has
/// its outcome: valid deliveries verify (as the right id and kind), near
/// misses are refused with the right code, dedup keys and plans decode as
/// intended. `TICKMARK_WRITE_FUZZ_SEEDS=1` (re)writes the files instead.
#[test]
fn the_seed_corpus_is_the_generators_and_each_seed_has_its_outcome() {
    let write = std::env::var("TICKMARK_WRITE_FUZZ_SEEDS").is_ok_and(|v| v == "1");
    let seeds = seeds::seeds();
    let mut failures = Vec::new();
    for seed in &seeds {
        let got = seeds::outcome(seed.target, &seed.bytes);
        if got != seed.expect {
            failures.push(format!(
                "{}/{}: expected `{}`, got `{got}`",
                seed.target, seed.name, seed.expect
            ));
        }
        let path = fuzz_dir().join("seeds").join(seed.target).join(&seed.name);
        if write {
            std::fs::create_dir_all(path.parent().expect("a folder")).expect("create the folder");
            std::fs::write(&path, &seed.bytes).expect("write a seed");
        } else if std::fs::read(&path).ok().as_deref() != Some(seed.bytes.as_slice()) {
            failures.push(format!(
                "{} is missing or differs from the generator's: run TICKMARK_WRITE_FUZZ_SEEDS=1 cargo nextest run -p tickmark-tests --test fuzz_regressions",
                path.display()
            ));
        }
    }
    for (target, _) in seeds::VERIFY_TARGETS {
        let per_target = seeds.iter().filter(|s| s.target == target).count();
        assert!(per_target >= 6, "{target} has only {per_target} seeds");
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds are wrong:\n{}",
        failures.len(),
        seeds.len(),
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
