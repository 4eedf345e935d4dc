//! A server started as a child process announces where it listens on its
//! standard output (`payments: listening on http://127.0.0.1:PORT`); tests
//! wait for that line instead of sleeping.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// Read `child`'s stdout until a line starts with `prefix`, and parse the
/// address after it; then keep draining stdout in the background so the
/// child never blocks on a full pipe. Panics (with the child's log at `log`)
/// if the child exits first or takes over a minute.
pub async fn listening_address(child: &mut Child, prefix: &str, log: &Path) -> SocketAddr {
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the child's stdout") {
            if let Some(addr) = line.strip_prefix(prefix) {
                return addr.parse().expect("an address after the prefix");
            }
        }
        panic!(
            "the child exited before announcing `{prefix}`:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    })
    .await
    .expect("the child announces its address within a minute");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    addr
}
