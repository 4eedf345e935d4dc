//! A skipped test must not look like a pass. A test that cannot run here (no
//! PostgreSQL on purpose, no Chromium, no PostgreSQL server binaries) calls
//! [`record`] and returns: the skip and its reason go to stderr and, when
//! `TICKMARK_SKIP_LOG` names a file, one line is appended to it, so that
//! `scripts/test` can count and list the skips at the end of a run.
//!
//! Under `CI=true` nothing may skip: [`record`] panics instead, with the
//! reason (which says what to install), so the test fails.

use std::io::Write;

/// The environment variable naming the file skips are appended to.
pub const LOG_VAR: &str = "TICKMARK_SKIP_LOG";

/// Whether this run is CI (`CI=true`), where no test may skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The running test as `binary::name`: the test binary (Cargo's hash
/// suffix removed) and the name the test harness gave the test's thread (or
/// nextest's `NEXTEST_TEST_NAME`); `unknown test` for what neither says.
pub fn current_test() -> String {
    let name = std::env::var("NEXTEST_TEST_NAME")
        .ok()
        .or_else(|| {
            std::thread::current()
                .name()
                .filter(|name| *name != "main")
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown test".to_owned());
    match test_binary() {
        Some(binary) => format!("{binary}::{name}"),
        None => name,
    }
}

/// `crash` for `target/debug/deps/crash-0123456789abcdef`.
fn test_binary() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let stem = exe.file_stem()?.to_str()?;
    let binary = match stem.rsplit_once('-') {
        Some((binary, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            binary
        }
        _ => stem,
    };
    Some(binary.to_owned())
}

/// Record that `test` skips because of `reason` (which should say what to
/// install or set to run it). Under `CI=true` this panics instead: CI runs
/// every test.
pub fn record(test: &str, reason: &str) {
    if in_ci() {
        panic!("{test} cannot run here and CI=true forbids skipping it: {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    let Ok(path) = std::env::var(LOG_VAR) else {
        return;
    };
    // One line per skip; tests run in parallel processes, and an append of a
    // short line is a single write, so lines do not interleave.
    let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = appended {
        panic!("could not record the skip of {test} in {path} ({LOG_VAR}): {error}");
    }
}
