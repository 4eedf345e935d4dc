//! Stopping a server under test as an operator or a supervisor does: SIGTERM,
//! then its exit status (it must shut down gracefully on its own).

use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::Child;

/// Send SIGTERM to `child` (the `name`d binary) and wait at most 30 s for it
/// to exit; its exit status.
pub async fn terminate(child: &mut Child, name: &str) -> ExitStatus {
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap_or_else(|_| panic!("{name} stops within 30 s of SIGTERM"))
        .unwrap()
}
