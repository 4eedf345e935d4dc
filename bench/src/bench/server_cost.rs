//! What the PostgreSQL server spent over a span of the benchmark: WAL bytes
//! written (the distance between the WAL positions flushed at either end,
//! server-wide: `pg_stat_wal` is only updated when a backend gets round to
//! it) and CPU time of the server's
//! processes (read from /proc, so only when the server runs on this
//! machine). Divided by the events of the span, they are the database's
//! cost per event, the figure a cheaper claim path has to lower.
//!
//! The CPU is the postmaster's own, the CPU of its children that have exited
//! (`cutime`/`cstime`: backends that disconnected), and that of its live
//! children (backends, WAL writer, checkpointer, autovacuum). Another
//! client's work on the same server in the span is counted too: measure on
//! a quiet server.
//!
//! scripts/graphile-bench/bench.mjs measures graphile-worker's drain the
//! same way (its own copy, in JavaScript), so the two compare.

use std::time::Duration;

use sqlx::{PgPool, Row};

use super::process::{proc_stat, ticks};

/// The server's counters at one moment.
#[derive(Debug, Clone)]
pub struct ServerSnapshot {
    /// The WAL flushed so far (an LSN, as text), where `wal_records` reads from.
    flushed: String,
    /// The same position in bytes, as the server counts them.
    flushed_bytes: f64,
    cpu: Option<Duration>,
}

/// What the server spent between two snapshots.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerCost {
    /// WAL bytes written (all databases of the server).
    pub wal_bytes: f64,
    /// CPU time of the server's processes; `None` when the server is not a
    /// process of this machine.
    pub cpu: Option<Duration>,
}

impl ServerCost {
    /// WAL bytes per event.
    pub fn wal_bytes_per(&self, events: usize) -> f64 {
        self.wal_bytes / events.max(1) as f64
    }

    /// Server CPU microseconds per event (0 when unknown).
    pub fn cpu_us_per(&self, events: usize) -> f64 {
        self.cpu
            .map_or(0.0, |cpu| cpu.as_secs_f64() * 1e6 / events.max(1) as f64)
    }
}

impl ServerSnapshot {
    /// Read the counters now, through `pool`.
    pub async fn take(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let row = sqlx::query(
            "SELECT flushed::text AS flushed,
                    pg_wal_lsn_diff(flushed, '0/0')::float8 AS flushed_bytes,
                    pg_backend_pid() AS backend
             FROM pg_current_wal_flush_lsn() AS flushed",
        )
        .fetch_one(pool)
        .await?;
        let backend: i32 = row.try_get("backend")?;
        Ok(Self {
            flushed: row.try_get("flushed")?,
            flushed_bytes: row.try_get("flushed_bytes")?,
            cpu: server_cpu(backend),
        })
    }

    /// What was spent since `earlier`.
    pub fn since(&self, earlier: &Self) -> ServerCost {
        ServerCost {
            wal_bytes: (self.flushed_bytes - earlier.flushed_bytes).max(0.0),
            cpu: match (self.cpu, earlier.cpu) {
                (Some(now), Some(then)) => Some(now.saturating_sub(then)),
                _ => None,
            },
        }
    }
}

/// WAL records of one kind written between two snapshots.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WalRecords {
    /// Resource manager and record type, as `pg_walinspect` names them
    /// (`Heap/UPDATE`, `Btree/INSERT_LEAF`, …).
    pub kind: String,
    /// How many records.
    pub count: i64,
    /// Their bytes, full-page images included.
    pub bytes: i64,
    /// Of which full-page images.
    pub full_page_bytes: i64,
}

/// The WAL written between `before` and `after`, by record type, largest
/// first (PostgreSQL's `pg_walinspect`, created in `public` if missing:
/// this needs a superuser, as the benchmark's scratch server has).
pub async fn wal_records(
    pool: &PgPool,
    before: &ServerSnapshot,
    after: &ServerSnapshot,
) -> Result<Vec<WalRecords>, sqlx::Error> {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public")
        .execute(pool)
        .await?;
    sqlx::query_as(
        "SELECT \"resource_manager/record_type\" AS kind, count,
                combined_size AS bytes, fpi_size AS full_page_bytes
         FROM public.pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true)
         WHERE count > 0 ORDER BY combined_size DESC",
    )
    .bind(&before.flushed)
    .bind(&after.flushed)
    .fetch_all(pool)
    .await
}

/// The CPU time of the server whose backend is `backend`, if it is a
/// process of this machine.
fn server_cpu(backend: i32) -> Option<Duration> {
    let postmaster = proc_stat(&backend.to_string())?.parent;
    let comm = std::fs::read_to_string(format!("/proc/{postmaster}/comm")).ok()?;
    if !comm.trim().starts_with("postgres") {
        return None;
    }
    let own = proc_stat(&postmaster.to_string())?;
    let mut total = own.user + own.system + own.children;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(child) = proc_stat(&pid).filter(|s| s.parent == postmaster) {
            total += child.user + child.system;
        }
    }
    Some(ticks(total))
}
