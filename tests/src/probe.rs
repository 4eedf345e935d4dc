//! The probe: what the test steps did, recorded outside the engine's own
//! transactions (like an external service would), plus raw SQL for the tests.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// A handle on the test database's own tables, registered as an engine
/// resource so test steps can record their runs.
#[derive(Debug, Clone)]
pub enum Probe {
    /// On PostgreSQL.
    Postgres(PgPool),
    /// On SQLite.
    Sqlite(SqlitePool),
}

const CREATE: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS test_step_runs (event_id TEXT NOT NULL, step TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS test_ledger (event_id TEXT NOT NULL, amount BIGINT NOT NULL)",
];

impl Probe {
    /// Connect to the database at `url` and create the test tables.
    pub async fn connect(url: &str) -> Probe {
        let probe = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .expect("sqlite url")
                .busy_timeout(Duration::from_secs(30));
            Probe::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect_with(options)
                    .await
                    .expect("probe: open SQLite"),
            )
        } else {
            Probe::Postgres(
                PgPoolOptions::new()
                    .max_connections(2)
                    .connect(url)
                    .await
                    .expect("probe: connect PostgreSQL"),
            )
        };
        for statement in CREATE {
            probe.execute(statement).await;
        }
        probe
    }

    /// Run one statement (same text on both backends); rows affected.
    pub async fn execute(&self, sql: &str) -> u64 {
        let affected = match self {
            Probe::Postgres(pool) => sqlx::query(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Probe::Sqlite(pool) => sqlx::query(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
        };
        affected.unwrap_or_else(|e| panic!("probe SQL failed: {e}\n{sql}"))
    }

    /// One integer from a query (same text on both backends).
    pub async fn scalar(&self, sql: &str) -> i64 {
        match self {
            Probe::Postgres(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Probe::Sqlite(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("probe SQL failed: {e}\n{sql}"))
    }

    /// One optional text value from a query (same text on both backends).
    pub async fn text(&self, sql: &str) -> Option<String> {
        match self {
            Probe::Postgres(pool) => {
                sqlx::query_scalar::<_, Option<String>>(sql)
                    .fetch_optional(pool)
                    .await
            }
            Probe::Sqlite(pool) => {
                sqlx::query_scalar::<_, Option<String>>(sql)
                    .fetch_optional(pool)
                    .await
            }
        }
        .unwrap_or_else(|e| panic!("probe SQL failed: {e}\n{sql}"))
        .flatten()
    }

    /// Record that a step ran (committed at once, outside the engine).
    pub async fn record_run(
        &self,
        event_id: &str,
        step: &str,
        attempt: u32,
    ) -> Result<(), sqlx::Error> {
        let pid = i64::from(std::process::id());
        let attempt = i64::from(attempt);
        match self {
            Probe::Postgres(pool) => {
                sqlx::query("INSERT INTO test_step_runs (event_id, step, attempt, pid) VALUES ($1, $2, $3, $4)")
                    .bind(event_id)
                    .bind(step)
                    .bind(attempt as i32)
                    .bind(pid as i32)
                    .execute(pool)
                    .await?;
            }
            Probe::Sqlite(pool) => {
                sqlx::query("INSERT INTO test_step_runs (event_id, step, attempt, pid) VALUES (?1, ?2, ?3, ?4)")
                    .bind(event_id)
                    .bind(step)
                    .bind(attempt)
                    .bind(pid)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// How many times `step` of `event_id` ran.
    pub async fn runs(&self, event_id: &str, step: &str) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM test_step_runs WHERE event_id = '{}' AND step = '{}'",
            quote(event_id),
            quote(step)
        ))
        .await
    }

    /// How many times `step` ran, over all events.
    pub async fn runs_of(&self, step: &str) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM test_step_runs WHERE step = '{}'",
            quote(step)
        ))
        .await
    }

    /// Ledger rows of `event_id` (a transactional step's effect).
    pub async fn ledger_rows(&self, event_id: &str) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM test_ledger WHERE event_id = '{}'",
            quote(event_id)
        ))
        .await
    }

    /// Move an event's lease (or retry time) into the past: what a crashed
    /// worker's lease looks like once it has expired.
    pub async fn expire_lease(&self, event_seq: i64) {
        let sql = match self {
            Probe::Postgres(_) => format!(
                "UPDATE tickmark_events SET due_at = now() - interval '1 second' WHERE id = {event_seq}"
            ),
            Probe::Sqlite(_) => format!(
                "UPDATE tickmark_events SET due_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 second') WHERE id = {event_seq}"
            ),
        };
        assert_eq!(self.execute(&sql).await, 1, "event {event_seq} exists");
    }

    /// Move a waiting event's deadline into the past: what a wait looks
    /// like once its timeout has passed (or a timer's time has come).
    pub async fn expire_wait(&self, event_seq: i64) {
        let sql = match self {
            Probe::Postgres(_) => format!(
                "UPDATE tickmark_events SET due_at = now() - interval '1 second', \
                 wait_until = now() - interval '1 second' \
                 WHERE id = {event_seq} AND wait_until IS NOT NULL"
            ),
            Probe::Sqlite(_) => format!(
                "UPDATE tickmark_events SET \
                 due_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 second'), \
                 wait_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 second') \
                 WHERE id = {event_seq} AND wait_until IS NOT NULL"
            ),
        };
        assert_eq!(self.execute(&sql).await, 1, "event {event_seq} waits");
    }
}

fn quote(text: &str) -> String {
    text.replace('\'', "''")
}
