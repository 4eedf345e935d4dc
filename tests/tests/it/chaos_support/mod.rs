//! Running the `chaos` binary from a test (`chaos.rs`, `failover.rs`): its
//! output shown, its JSON line read back.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// What one `chaos` run left: its JSON line and whether it exited 0.
pub struct ChaosRun {
    pub json: serde_json::Value,
    pub passed: bool,
    /// Both outputs, for a failing test's message.
    pub output: String,
}

/// Run `chaos` (next to its node binary) with `args` within `limit`. Panics
/// when it outlives `limit`, prints no JSON line, or colours its log, which
/// goes to a pipe here, not a terminal.
pub async fn run_chaos(args: &[&str], limit: Duration) -> ChaosRun {
    let child = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(args)
        .args(["--node-bin", env!("CARGO_BIN_EXE_tickmark-chaos-node")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the chaos binary");
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("chaos {args:?} did not finish within {limit:?}"))
        .expect("chaos output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "no colour codes in logs that go to a pipe, not a terminal"
    );
    let json = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .unwrap_or_else(|| panic!("chaos {args:?} printed no JSON line:\n{stdout}\n{stderr}"));
    ChaosRun {
        json,
        passed: output.status.success(),
        output: format!("{stdout}\n{stderr}"),
    }
}
