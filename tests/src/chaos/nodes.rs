//! Node processes (`tickmark-chaos-node`): start one, read the address it
//! prints, SIGKILL it, SIGSTOP and SIGCONT it, SIGTERM it; and count what its
//! log (stderr) says about leases, marks and failures.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a starting node may take to print its address (a debug build
/// on a busy machine, or a database that is down for a while).
pub const START_WITHIN: Duration = Duration::from_secs(90);

/// How a node is started: the same for every node and generation.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The `tickmark-chaos-node` binary.
    pub bin: PathBuf,
    /// The shared database.
    pub database_url: String,
    /// The receipt service.
    pub receipt_url: String,
    /// `--render-ms`.
    pub render_ms: u64,
    /// `--lease-ms`.
    pub lease_ms: u64,
    /// `--concurrency`.
    pub concurrency: usize,
    /// The invoices folder (shared: a re-run overwrites the same file).
    pub out_dir: PathBuf,
    /// The folder each node's log is appended to (`node-<slot>.log`).
    pub log_dir: PathBuf,
    /// The Stripe signing secret (given in the environment, never in argv).
    pub secret: String,
}

/// Lines of one node's log that matter to the run.
#[derive(Debug, Default)]
pub struct LogCounts {
    /// `mark refused: the lease was lost; this worker stops` (a fenced mark).
    pub mark_refused: AtomicU64,
    /// `lease lost: …` (the heartbeat found the lease taken or expired),
    /// `lease lost while the step ran`.
    pub lease_lost: AtomicU64,
    /// `lease expired before a heartbeat could renew it` (the local clock
    /// saw it run out first).
    pub lease_expired: AtomicU64,
    /// `took over an expired lease`.
    pub takeovers: AtomicU64,
    /// `step failed` (a retryable failure with a retry scheduled).
    pub steps_failed: AtomicU64,
    /// `dead-lettering event`.
    pub dead_lettered: AtomicU64,
    /// `delivery not recorded` (the receiver answered 5xx).
    pub not_recorded: AtomicU64,
    /// `panicked`.
    pub panics: AtomicU64,
    /// Every line.
    pub lines: AtomicU64,
}

impl LogCounts {
    fn count(&self, line: &str) {
        let bump = |counter: &AtomicU64| {
            counter.fetch_add(1, Ordering::Relaxed);
        };
        bump(&self.lines);
        if line.contains("mark refused") {
            bump(&self.mark_refused);
        }
        if line.contains("lease lost") {
            bump(&self.lease_lost);
        }
        if line.contains("lease expired before a heartbeat") {
            bump(&self.lease_expired);
        }
        if line.contains("took over an expired lease") {
            bump(&self.takeovers);
        }
        if line.contains("step failed") {
            bump(&self.steps_failed);
        }
        if line.contains("dead-lettering event") {
            bump(&self.dead_lettered);
        }
        if line.contains("delivery not recorded") {
            bump(&self.not_recorded);
        }
        if line.contains("panicked") {
            bump(&self.panics);
        }
    }

    /// Fenced or stopped by a lost lease: `mark refused` + `lease lost` +
    /// `lease expired before a heartbeat`.
    pub fn fenced(&self) -> u64 {
        self.mark_refused.load(Ordering::Relaxed)
            + self.lease_lost.load(Ordering::Relaxed)
            + self.lease_expired.load(Ordering::Relaxed)
    }

    /// Add `other`'s counts to these.
    pub fn add(&self, other: &LogCounts) {
        let pairs = [
            (&self.mark_refused, &other.mark_refused),
            (&self.lease_lost, &other.lease_lost),
            (&self.lease_expired, &other.lease_expired),
            (&self.takeovers, &other.takeovers),
            (&self.steps_failed, &other.steps_failed),
            (&self.dead_lettered, &other.dead_lettered),
            (&self.not_recorded, &other.not_recorded),
            (&self.panics, &other.panics),
            (&self.lines, &other.lines),
        ];
        for (mine, theirs) in pairs {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    /// Which slot (0..nodes).
    pub slot: usize,
    /// Its worker name: `node-<slot>-g<generation>`.
    pub name: String,
    /// Where its receiver listens.
    pub addr: SocketAddr,
    /// What its log said so far.
    pub counts: Arc<LogCounts>,
    child: Child,
    pid: u32,
}

impl NodeSpec {
    /// Start generation `generation` of slot `slot` and wait until it serves.
    pub async fn start(&self, slot: usize, generation: u32) -> std::io::Result<Node> {
        let name = format!("node-{slot}-g{generation}");
        let mut child = Command::new(&self.bin)
            .arg("--database-url")
            .arg(&self.database_url)
            .args(["--name", &name])
            .args(["--receipt-url", &self.receipt_url])
            .args(["--render-ms", &self.render_ms.to_string()])
            .args(["--lease-ms", &self.lease_ms.to_string()])
            .args(["--concurrency", &self.concurrency.to_string()])
            .arg("--out-dir")
            .arg(&self.out_dir)
            .env("STRIPE_WEBHOOK_SECRET", &self.secret)
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_NODE_LOG").unwrap_or_else(|_| "info,sqlx=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("the node exited at once"))?;
        let counts = Arc::new(LogCounts::default());
        let stderr = child.stderr.take().expect("piped stderr");
        let log_path = self.log_dir.join(format!("node-{slot}.log"));
        tokio::spawn(follow_log(
            stderr,
            log_path,
            name.clone(),
            Arc::clone(&counts),
        ));

        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(START_WITHIN, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.strip_prefix("chaos-node: listening on http://") {
                    return rest.trim().parse::<SocketAddr>().ok();
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "{name} did not report its address within {START_WITHIN:?} (see {})",
                self.log_dir.join(format!("node-{slot}.log")).display()
            ))
        })?;
        // Keep reading stdout so the node never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Node {
            slot,
            name,
            addr,
            counts,
            child,
            pid,
        })
    }
}

impl Node {
    /// SIGKILL, and wait until the process is gone.
    pub async fn kill(mut self) -> Arc<LogCounts> {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.counts
    }

    /// SIGSTOP: the process freezes, its leases run out, its sockets stay open.
    pub fn stop(&self) -> std::io::Result<()> {
        signal(self.pid, "-STOP")
    }

    /// SIGCONT: the frozen process resumes where it was.
    pub fn resume(&self) -> std::io::Result<()> {
        signal(self.pid, "-CONT")
    }

    /// SIGTERM, then wait up to `within` for a graceful exit (SIGKILL after).
    /// Whether it exited successfully in time.
    pub async fn terminate(mut self, within: Duration) -> (bool, Arc<LogCounts>) {
        let _ = signal(self.pid, "-TERM");
        let clean = match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                false
            }
        };
        (clean, self.counts)
    }

    /// Whether the process has exited on its own.
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

fn signal(pid: u32, which: &str) -> std::io::Result<()> {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill {which} {pid} failed")))
    }
}

async fn follow_log(
    stderr: tokio::process::ChildStderr,
    path: PathBuf,
    name: String,
    counts: Arc<LogCounts>,
) {
    let mut file = open_append(&path);
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        counts.count(&line);
        if let Some(file) = file.as_mut() {
            let _ = writeln!(file, "[{name}] {line}");
        }
    }
}

fn open_append(path: &Path) -> Option<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .ok()
}
