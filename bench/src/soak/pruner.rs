//! Prune on a schedule, as cron would: run the `tickmark` command line every
//! `--prune-every`, then (when the server's autovacuum is off) `VACUUM` the
//! run's tables, standing in for the autovacuum a production server runs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// How prune is run.
#[derive(Debug, Clone)]
pub struct PrunerConfig {
    /// The `tickmark` binary.
    pub tickmark_bin: PathBuf,
    /// The run's database URL (with its schema).
    pub database_url: String,
    /// Every how long.
    pub every: Duration,
    /// `--older-than`.
    pub retention: Duration,
    /// `--dedup-window`.
    pub dedup_window: Duration,
    /// `VACUUM` the run's tables after each prune.
    pub vacuum: bool,
}

/// What the pruner did so far.
#[derive(Debug, Default)]
pub struct PrunerTotals {
    /// Prune runs that succeeded.
    pub runs: AtomicU64,
    /// Prune runs that failed (exit status, unparsable output).
    pub failures: AtomicU64,
    /// Events deleted, summed over the runs.
    pub deleted: AtomicU64,
    /// Tombstones deleted once older than the dedup window, summed.
    pub tombstones_expired: AtomicU64,
    /// The longest prune run, ms.
    pub longest_ms: AtomicU64,
}

/// The command line of one prune run.
pub fn prune_args(config: &PrunerConfig) -> Vec<String> {
    vec![
        "--json".to_owned(),
        "prune".to_owned(),
        "--older-than".to_owned(),
        format!("{}s", config.retention.as_secs()),
        "--dedup-window".to_owned(),
        format!("{}s", config.dedup_window.as_secs()),
        // A window shorter than Stripe's 3-day retries: on purpose, in a soak.
        "--i-know".to_owned(),
    ]
}

/// Prune every `config.every` until `stop`.
pub async fn run(
    config: PrunerConfig,
    pool: PgPool,
    totals: Arc<PrunerTotals>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is now: nothing is old enough yet
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        prune_once(&config, &totals).await;
        if config.vacuum {
            if let Err(error) = vacuum(&pool).await {
                tracing::warn!(%error, "VACUUM failed");
            }
        }
    }
}

async fn prune_once(config: &PrunerConfig, totals: &PrunerTotals) {
    let started = Instant::now();
    let output = tokio::process::Command::new(&config.tickmark_bin)
        .args(prune_args(config))
        .env("DATABASE_URL", &config.database_url)
        .kill_on_drop(true)
        .output()
        .await;
    let took = started.elapsed();
    totals
        .longest_ms
        .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
    let output = match output {
        Ok(output) if output.status.success() => output,
        Ok(output) => {
            totals.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                status = %output.status,
                stderr = %String::from_utf8_lossy(&output.stderr).trim(),
                "tickmark prune failed"
            );
            return;
        }
        Err(error) => {
            totals.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(%error, bin = %config.tickmark_bin.display(), "cannot run tickmark");
            return;
        }
    };
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    let Some(deleted) = report["deleted"].as_u64() else {
        totals.failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(stdout = %String::from_utf8_lossy(&output.stdout).trim(), "prune printed no count");
        return;
    };
    totals.runs.fetch_add(1, Ordering::Relaxed);
    totals.deleted.fetch_add(deleted, Ordering::Relaxed);
    totals.tombstones_expired.fetch_add(
        report["tombstones_expired"].as_u64().unwrap_or(0),
        Ordering::Relaxed,
    );
    tracing::info!(deleted, ms = took.as_millis() as u64, report = %report, "pruned");
}

/// `VACUUM (ANALYZE)` each table of the run's schema by name (a bare `VACUUM`
/// would walk every schema of the shared server).
async fn vacuum(pool: &PgPool) -> Result<(), sqlx::Error> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema()",
    )
    .fetch_all(pool)
    .await?;
    if tables.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    // The simple protocol: VACUUM runs outside any transaction block.
    sqlx::raw_sql(&format!("VACUUM (ANALYZE) {}", tables.join(", ")))
        .execute(pool)
        .await?;
    tracing::debug!(ms = started.elapsed().as_millis() as u64, "vacuumed");
    Ok(())
}
