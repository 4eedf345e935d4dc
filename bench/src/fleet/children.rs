//! Child processes of a run: this same binary re-executed with a hidden
//! `--role`, talking to the coordinator in JSON lines on stdout, started by
//! a `go` line on stdin, stopped by SIGTERM, or killed by SIGKILL.

use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::mpsc;

/// A worker's counters, as its process reports them (`WorkerStats`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Events leased by its claims.
    pub claimed: u64,
    /// Claims that took over an expired lease.
    pub takeovers: u64,
    /// Steps marked done.
    pub steps_done: u64,
    /// Step attempts that failed.
    pub steps_failed: u64,
    /// Events finished.
    pub events_done: u64,
    /// Leases lost.
    pub leases_lost: u64,
    /// Times its claim loop went idle (a claim found nothing to run).
    pub idle_waits: u64,
}

impl From<&tickmark::WorkerStats> for Counters {
    fn from(s: &tickmark::WorkerStats) -> Self {
        Self {
            claimed: s.claimed,
            takeovers: s.takeovers,
            steps_done: s.steps_done,
            steps_failed: s.steps_failed,
            events_done: s.events_done,
            leases_lost: s.leases_lost,
            idle_waits: s.idle_waits,
        }
    }
}

/// What a child says, one JSON object a line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    /// A worker is connected and waits for `go`.
    Ready,
    /// A receiver serves on this address.
    Listening(String),
    /// A worker's counters (every 100 ms, and once more when it stops).
    Stats(Counters),
}

impl Message {
    /// Print this message as one line on stdout.
    pub fn say(&self) {
        if let Ok(line) = serde_json::to_string(self) {
            println!("{line}");
        }
    }
}

/// A running child process.
pub struct Child {
    /// `w0`, `r1`, …: also the end of its `application_name`.
    pub name: String,
    process: tokio::process::Child,
    stdin: Option<ChildStdin>,
    messages: mpsc::UnboundedReceiver<Message>,
    /// The last counters it reported.
    pub last: Counters,
}

impl Child {
    /// Start this binary as `role` with `args`.
    pub fn spawn(name: &str, role: &str, args: &[String]) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut process = Command::new(exe)
            .arg("--role")
            .arg(role)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = process.stdin.take();
        let stdout = process.stdout.take().expect("piped stdout");
        let (sender, messages) = mpsc::unbounded_channel();
        let child_name = name.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Message>(&line) {
                    Ok(message) => {
                        if sender.send(message).is_err() {
                            break;
                        }
                    }
                    Err(_) => tracing::debug!(child = %child_name, %line, "unparsed line"),
                }
            }
        });
        Ok(Self {
            name: name.to_owned(),
            process,
            stdin,
            messages,
            last: Counters::default(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Wait (at most `timeout`) for the first message that `pick` accepts;
    /// counters met on the way are kept.
    pub async fn expect<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&Message) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let message = tokio::time::timeout_at(deadline, self.messages.recv())
                .await
                .map_err(|_| format!("{}: no answer within {timeout:?}", self.name))?
                .ok_or_else(|| format!("{}: exited before answering", self.name))?;
            if let Message::Stats(c) = &message {
                self.last = *c;
            }
            if let Some(t) = pick(&message) {
                return Ok(t);
            }
        }
    }

    /// Take in the counters reported since the last call.
    pub fn poll(&mut self) {
        while let Ok(message) = self.messages.try_recv() {
            if let Message::Stats(c) = message {
                self.last = c;
            }
        }
    }

    /// Send `go`.
    pub async fn go(&mut self) -> std::io::Result<()> {
        match self.stdin.as_mut() {
            Some(stdin) => {
                stdin.write_all(b"go\n").await?;
                stdin.flush().await
            }
            None => Ok(()),
        }
    }

    /// SIGKILL, at once (no shutdown, no final counters).
    pub async fn kill(&mut self) -> std::io::Result<()> {
        self.process.kill().await
    }

    /// SIGTERM, then wait for it to exit (and for its last counters).
    pub async fn stop(mut self) -> Result<Counters, String> {
        if let Some(pid) = self.pid() {
            // By pid: this process started it.
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        let status = tokio::time::timeout(Duration::from_secs(60), self.process.wait())
            .await
            .map_err(|_| format!("{}: did not stop within 60 s", self.name))?
            .map_err(|e| format!("{}: {e}", self.name))?;
        self.poll();
        // The reader may still hold the last line: give it a moment.
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(200), self.messages.recv()).await
        {
            if let Message::Stats(c) = message {
                self.last = c;
            }
        }
        if !status.success() {
            return Err(format!("{}: exited with {status}", self.name));
        }
        Ok(self.last)
    }
}
