//! Binaries of other workspace packages, found through Cargo.
//!
//! Cargo tells a test where its own package's binaries are
//! (`CARGO_BIN_EXE_<name>`), but not another package's: the `tickmark`
//! command line belongs to the `tickmark` crate. Rather than guess a
//! directory, ask Cargo to build it (a no-op when it is fresh) and read the
//! executable's path from its JSON messages. This also makes the README's test
//! command work on a clean clone: nothing has to be built beforehand.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The path of binary `bin` of workspace package `package`, built now if it
/// is missing or stale, in the same profile as this test.
///
/// # Panics
/// When Cargo cannot build it: the test cannot run without it, and the panic
/// carries Cargo's own explanation.
pub fn cargo_bin(package: &str, bin: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<(String, String), PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    let mut built = built
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    built
        .entry((package.to_owned(), bin.to_owned()))
        .or_insert_with(|| build(package, bin))
        .clone()
}

fn build(package: &str, bin: &str) -> PathBuf {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let mut command = Command::new(env!("CARGO"));
    command.args([
        "build",
        "--manifest-path",
        manifest,
        // The whole workspace's feature set, as the tests were built with:
        // `--package` alone would resolve the package's own features and
        // rebuild shared dependencies a second time.
        "--workspace",
        "--bin",
        bin,
        "--message-format=json-render-diagnostics",
    ]);
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run cargo to build `{bin}`: {error}"));
    assert!(
        output.status.success(),
        "cargo could not build `{bin}` of package `{package}`:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["target"]["name"] == bin
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo built `{bin}` but named no executable for it"))
}
