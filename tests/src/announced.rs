//! A child process (a server, a worker) announces what it is doing on its
//! standard output (`payments: listening on http://127.0.0.1:PORT`, a test
//! step's "ran" line); tests wait for that line instead of sleeping.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// How long a child gets to announce a line.
const WITHIN: Duration = Duration::from_secs(60);

/// A child's standard output, read line by line. Keep one per child: each
/// reader buffers ahead, so a second reader would miss what the first had
/// buffered.
pub type StdoutLines = Lines<BufReader<ChildStdout>>;

/// Take `child`'s standard output to read it line by line.
pub fn stdout_lines(child: &mut Child) -> StdoutLines {
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    BufReader::new(stdout).lines()
}

/// Why no line starting with the prefix came.
#[derive(Debug)]
pub enum Unannounced {
    /// The output ended first (the child exited).
    Ended,
    /// None within a minute.
    TimedOut,
}

/// The next line of `lines` that starts with `prefix` (lines before it are
/// skipped), within a minute.
pub async fn line_starting_with(
    lines: &mut StdoutLines,
    prefix: &str,
) -> Result<String, Unannounced> {
    let found = tokio::time::timeout(WITHIN, async {
        while let Some(line) = lines.next_line().await.expect("read the child's stdout") {
            if line.starts_with(prefix) {
                return Ok(line);
            }
        }
        Err(Unannounced::Ended)
    })
    .await;
    found.unwrap_or(Err(Unannounced::TimedOut))
}

/// Read `child`'s stdout until a line starts with `prefix`, and parse the
/// address after it; then keep draining stdout in the background so the
/// child never blocks on a full pipe. Panics (with the child's log at `log`)
/// if the child exits first or takes over a minute.
pub async fn listening_address(child: &mut Child, prefix: &str, log: &Path) -> SocketAddr {
    let mut lines = stdout_lines(child);
    let line = match line_starting_with(&mut lines, prefix).await {
        Ok(line) => line,
        Err(Unannounced::Ended) => panic!(
            "the child exited before announcing `{prefix}`:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        ),
        Err(Unannounced::TimedOut) => {
            panic!("the child did not announce its address within a minute")
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    line[prefix.len()..]
        .parse()
        .expect("an address after the prefix")
}
