//! The steps the tests run. Each records its runs through the [`Probe`]
//! resource, committed at once like an external call, so a test can count how
//! often a step really ran, independently of what the engine marked.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tickmark::{Step, StepContext, StepError, StepResult};

use crate::meeting::Meeting;
use crate::probe::Probe;

async fn record(ctx: &StepContext<'_>) -> Result<(), StepError> {
    let probe = ctx.resource::<Probe>()?;
    probe
        .record_run(&ctx.event().id, ctx.step_name(), ctx.attempt())
        .await?;
    Ok(())
}

/// Wait until `processes` distinct processes have recorded step runs: a
/// rendezvous that makes work-sharing between processes certain instead of
/// likely. Checks every 20 ms; a terminal failure after a minute.
async fn await_processes(ctx: &StepContext<'_>, processes: u32) -> Result<(), StepError> {
    let probe = ctx.resource::<Probe>()?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = probe
            .scalar("SELECT count(DISTINCT pid) FROM test_step_runs")
            .await;
        if seen >= i64::from(processes) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StepError::terminal(format!(
                "only {seen} of {processes} worker processes ran a step within a minute"
            )));
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = ctx.cancellation().cancelled() => {
                return Err(StepError::retryable("cancelled"));
            }
        }
    }
}

/// Records its run, optionally pauses (cancellably), and outputs what it saw.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Record {
    /// Pause this long on every attempt.
    #[serde(default)]
    pub pause_ms: u64,
    /// Pause this long on the first attempt only (a step that a crash interrupts).
    #[serde(default)]
    pub first_attempt_pause_ms: u64,
    /// After recording, wait at the [`Meeting`] resource (if it expects this
    /// event) until the other expected events' steps arrive.
    #[serde(default)]
    pub meet: bool,
    /// After recording, wait until this many distinct processes have recorded
    /// runs in the probe (a rendezvous of worker processes), at most a minute.
    #[serde(default)]
    pub until_processes: u32,
}

#[typetag::serde(name = "test_record")]
#[async_trait::async_trait]
impl Step for Record {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        if self.meet {
            ctx.resource::<Meeting>()?.attend(&ctx.event().id).await?;
        }
        if self.until_processes > 0 {
            await_processes(ctx, self.until_processes).await?;
        }
        let pause = self.pause_ms
            + if ctx.attempt() == 1 {
                self.first_attempt_pause_ms
            } else {
                0
            };
        if pause > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(pause)) => {}
                _ = ctx.cancellation().cancelled() => {
                    return Err(StepError::retryable("cancelled"));
                }
            }
        }
        let seen: Vec<&str> = ["first", "second", "third"]
            .into_iter()
            .filter(|name| ctx.output(name).is_some())
            .collect();
        Ok(serde_json::json!({
            "step": ctx.step_name(),
            "attempt": ctx.attempt(),
            "key": ctx.idempotency_key(),
            "seen": seen,
        }))
    }
}

/// Adds a ledger row in the engine's transaction: an exactly-once effect.
/// Transactional steps must not write through other connections: on SQLite
/// they hold the file's write lock.
#[derive(Debug, Serialize, Deserialize)]
pub struct Credit {
    /// The amount credited.
    pub amount: i64,
}

#[typetag::serde(name = "test_credit")]
#[async_trait::async_trait]
impl Step for Credit {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        // No probe record here: on SQLite this step holds the write lock, so
        // its runs are counted by its ledger rows, which commit with its mark.
        credit(ctx, self.amount).await?;
        Ok(serde_json::json!({ "credited": self.amount }))
    }
}

/// Add a ledger row for the event in the engine's transaction; the event's
/// ledger rows as that transaction sees them (its own write included).
async fn credit(ctx: &mut StepContext<'_>, amount: i64) -> Result<i64, StepError> {
    let event_id = ctx.event().id.clone();
    let tx = ctx.transaction()?;
    let count = "SELECT count(*) FROM test_ledger WHERE event_id = ";
    let seen = if let Some(conn) = tx.postgres() {
        sqlx::query("INSERT INTO test_ledger (event_id, amount) VALUES ($1, $2)")
            .bind(&event_id)
            .bind(amount)
            .execute(&mut *conn)
            .await?;
        sqlx::query_scalar(&format!("{count}$1"))
            .bind(&event_id)
            .fetch_one(conn)
            .await?
    } else if let Some(conn) = tx.sqlite() {
        sqlx::query("INSERT INTO test_ledger (event_id, amount) VALUES (?1, ?2)")
            .bind(&event_id)
            .bind(amount)
            .execute(&mut *conn)
            .await?;
        sqlx::query_scalar(&format!("{count}?1"))
            .bind(&event_id)
            .fetch_one(conn)
            .await?
    } else {
        return Err(StepError::terminal("a transaction on an unknown backend"));
    };
    Ok(seen)
}

/// Write `line` to stdout at once (one write, flushed).
fn announce(line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(line.as_bytes())?;
    stdout.flush()
}

/// The line [`CreditThenAwaitKill`] prints once it has written: the marker,
/// then the event id and how many ledger rows its transaction sees.
pub const WRITTEN_AWAITING_KILL: &str = "tickmark-test-step: written, awaiting SIGKILL";

/// A transactional step for the crash test of guarantee 6: on its first
/// attempt it writes its ledger row in the engine's transaction, prints
/// [`WRITTEN_AWAITING_KILL`] on stdout, and waits (until its lease is lost),
/// so the test can SIGKILL the worker process between the write and the
/// commit. Later attempts credit and finish like [`Credit`].
#[derive(Debug, Serialize, Deserialize)]
pub struct CreditThenAwaitKill {
    /// The amount credited.
    pub amount: i64,
}

#[typetag::serde(name = "test_credit_then_await_kill")]
#[async_trait::async_trait]
impl Step for CreditThenAwaitKill {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let seen = credit(ctx, self.amount).await?;
        if ctx.attempt() == 1 {
            // The test reads this line from the worker's stdout, then kills it.
            let line = format!("{WRITTEN_AWAITING_KILL} {} {seen}\n", ctx.event().id);
            announce(&line)
                .map_err(|e| StepError::retryable(format!("announce the write: {e}")))?;
            ctx.cancellation().cancelled().await;
            return Err(StepError::retryable("cancelled before the kill came"));
        }
        Ok(serde_json::json!({ "credited": self.amount, "rows_seen": seen }))
    }
}

/// The line [`AnnounceThenAwaitFile`] prints once it has run: the marker,
/// then the event id and the attempt.
pub const STEP_RAN: &str = "tickmark-test-step: ran";

/// A step for the crash test of the final mark: it records its run, prints
/// [`STEP_RAN`] on stdout, and, on its first attempt, returns only once the
/// file `go` exists, so the test can prepare what the step's mark will meet
/// (a row lock) before that mark is sent.
#[derive(Debug, Serialize, Deserialize)]
pub struct AnnounceThenAwaitFile {
    /// Wait for this file on the first attempt; `None`: return at once.
    pub go: Option<std::path::PathBuf>,
}

#[typetag::serde(name = "test_announce_then_await_file")]
#[async_trait::async_trait]
impl Step for AnnounceThenAwaitFile {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        let line = format!("{STEP_RAN} {} {}\n", ctx.event().id, ctx.attempt());
        announce(&line).map_err(|e| StepError::retryable(format!("announce the run: {e}")))?;
        if let (Some(go), 1) = (&self.go, ctx.attempt()) {
            while !go.exists() {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = ctx.cancellation().cancelled() => {
                        return Err(StepError::retryable("cancelled before the go"));
                    }
                }
            }
        }
        Ok(serde_json::json!({ "key": ctx.idempotency_key(), "attempt": ctx.attempt() }))
    }
}

/// Fails its first `fail_first` attempts (retryably, or terminally).
#[derive(Debug, Serialize, Deserialize)]
pub struct Flaky {
    /// Attempts that fail.
    pub fail_first: u32,
    /// Whether the failure is terminal.
    #[serde(default)]
    pub terminal: bool,
}

#[typetag::serde(name = "test_flaky")]
#[async_trait::async_trait]
impl Step for Flaky {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        if ctx.attempt() <= self.fail_first {
            let message = format!("planned failure {} of {}", ctx.attempt(), self.fail_first);
            return Err(if self.terminal {
                StepError::terminal(message)
            } else {
                StepError::retryable(message)
            });
        }
        Ok(serde_json::json!({ "succeeded_on": ctx.attempt() }))
    }
}

/// Panics on its first attempt.
#[derive(Debug, Serialize, Deserialize)]
pub struct PanicOnce;

#[typetag::serde(name = "test_panic_once")]
#[async_trait::async_trait]
impl Step for PanicOnce {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        if ctx.attempt() == 1 {
            panic!("a bug in a step");
        }
        Ok(serde_json::Value::Null)
    }
}

/// Waits until its event is cancelled, then returns success (which the
/// engine must not mark: the lease is gone).
#[derive(Debug, Serialize, Deserialize)]
pub struct WaitForCancel;

#[typetag::serde(name = "test_wait_for_cancel")]
#[async_trait::async_trait]
impl Step for WaitForCancel {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        ctx.cancellation().cancelled().await;
        Ok(serde_json::json!({ "cancelled": true }))
    }
}

/// Reports progress, then pauses so the report can be seen while it runs.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReportProgress {
    /// The fraction reported.
    pub fraction: f32,
    /// The message reported.
    pub message: String,
    /// How long to stay running after reporting.
    pub pause_ms: u64,
}

#[typetag::serde(name = "test_report_progress")]
#[async_trait::async_trait]
impl Step for ReportProgress {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        ctx.progress(self.fraction, &self.message).await?;
        tokio::time::sleep(Duration::from_millis(self.pause_ms)).await;
        Ok(serde_json::Value::Null)
    }
}

/// Snoozes on its first run, succeeds on the next.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnoozeOnce {
    /// How long the snooze lasts.
    pub delay_ms: u64,
}

#[typetag::serde(name = "test_snooze_once")]
#[async_trait::async_trait]
impl Step for SnoozeOnce {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        record(ctx).await?;
        let probe = ctx.resource::<Probe>()?;
        if probe.runs(&ctx.event().id, ctx.step_name()).await == 1 {
            return Err(StepError::snooze(
                Duration::from_millis(self.delay_ms),
                "waiting for the payment to settle",
            ));
        }
        Ok(serde_json::json!({ "attempt": ctx.attempt() }))
    }
}

/// A poison step: it records its run, then SIGKILLs the worker process it
/// runs in, every time. It only ever kills the test worker binary
/// (`tickmark-test-worker`); anywhere else it is a terminal failure, so a
/// test process never kills itself.
#[derive(Debug, Serialize, Deserialize)]
pub struct KillWorker;

#[typetag::serde(name = "test_kill_worker")]
#[async_trait::async_trait]
impl Step for KillWorker {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        if !in_test_worker() {
            return Err(StepError::terminal(
                "test_kill_worker only kills the test worker process",
            ));
        }
        record(ctx).await?;
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        // SIGKILL ends the process before `kill` returns here; if it could
        // not be sent, fail instead of running on.
        Err(StepError::terminal(format!(
            "could not SIGKILL the worker: {killed:?}"
        )))
    }
}

/// Whether this process is the test worker binary (`tickmark-test-worker`).
fn in_test_worker() -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|name| name.starts_with("tickmark-test-worker"))
}
