//! The naive ceiling: the plain SQL a careful engineer would write by hand for
//! the same work, with no engine, on the same database at the same
//! concurrency — claim one job (`FOR UPDATE SKIP LOCKED`; SQLite:
//! `BEGIN IMMEDIATE`), one commit per step mark, one commit to finish — and
//! the database's rate of one-row insert commits.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::PgPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Naive events/s for `events` jobs of `steps` steps at `clients` concurrency.
pub async fn events_per_s(
    url: &str,
    events: usize,
    steps: usize,
    clients: usize,
) -> Result<f64, BoxError> {
    if url.starts_with("postgres") {
        postgres_events(url, events, steps, clients).await
    } else {
        sqlite_events(url, events, steps, clients).await
    }
}

/// One-row insert commits/s at `clients` concurrency.
pub async fn insert_commits_per_s(
    url: &str,
    inserts: usize,
    clients: usize,
) -> Result<f64, BoxError> {
    if url.starts_with("postgres") {
        let pool = pg_pool(url, clients).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS bench_insert (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
            .execute(&pool)
            .await?;
        let shared = pool.clone();
        let rate = run_clients(inserts, clients, move |_| {
            let pool = shared.clone();
            async move {
                sqlx::query("INSERT INTO bench_insert (body) VALUES ($1)")
                    .bind("{\"id\":\"evt\"}")
                    .execute(&pool)
                    .await?;
                Ok(true)
            }
        })
        .await?;
        pool.close().await;
        Ok(rate)
    } else {
        let pool = sqlite_pool(url, clients).await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_insert (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
        )
        .execute(&pool)
        .await?;
        let shared = pool.clone();
        let rate = run_clients(inserts, clients, move |_| {
            let pool = shared.clone();
            async move {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query("INSERT INTO bench_insert (body) VALUES (?1)")
                    .bind("{\"id\":\"evt\"}")
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(true)
            }
        })
        .await?;
        pool.close().await;
        Ok(rate)
    }
}

/// Run `clients` loops calling `work` until `total` calls returned true (or
/// every loop saw `false`: nothing left); the rate of successful calls per second.
async fn run_clients<F, Fut>(total: usize, clients: usize, work: F) -> Result<f64, BoxError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<bool, BoxError>> + Send,
{
    let work = Arc::new(work);
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients.max(1) {
        let work = Arc::clone(&work);
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            while done.load(Ordering::Relaxed) < total {
                if !work(client).await? {
                    break;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn pg_pool(url: &str, clients: usize) -> Result<PgPool, BoxError> {
    Ok(PgPoolOptions::new()
        .max_connections(u32::try_from(clients.clamp(1, 80)).unwrap_or(80))
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await?)
}

async fn sqlite_pool(url: &str, clients: usize) -> Result<SqlitePool, BoxError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30));
    Ok(SqlitePoolOptions::new()
        .max_connections(u32::try_from(clients.clamp(1, 16)).unwrap_or(16))
        .connect_with(options)
        .await?)
}

async fn postgres_events(
    url: &str,
    events: usize,
    steps: usize,
    clients: usize,
) -> Result<f64, BoxError> {
    let pool = pg_pool(url, clients).await?;
    for statement in [
        "CREATE TABLE IF NOT EXISTS bench_naive (id BIGSERIAL PRIMARY KEY, state TEXT NOT NULL DEFAULT 'pending', next_step INT NOT NULL DEFAULT 0, steps INT NOT NULL, lease_until TIMESTAMPTZ)",
        "CREATE INDEX IF NOT EXISTS bench_naive_pending ON bench_naive (id) WHERE state = 'pending'",
        "CREATE TABLE IF NOT EXISTS bench_naive_steps (job_id BIGINT NOT NULL, position INT NOT NULL, output JSON, PRIMARY KEY (job_id, position))",
    ] {
        sqlx::query(statement).execute(&pool).await?;
    }
    sqlx::query("INSERT INTO bench_naive (steps) SELECT $1 FROM generate_series(1, $2)")
        .bind(i32::try_from(steps)?)
        .bind(i64::try_from(events)?)
        .execute(&pool)
        .await?;
    let rate = run_clients(events, clients, move |_| {
        let pool = pool.clone();
        async move {
            let claimed: Option<(i64, i32)> = sqlx::query_as(
                "UPDATE bench_naive SET state = 'running', lease_until = now() + interval '30 seconds'
                 WHERE id = (SELECT id FROM bench_naive WHERE state = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING id, steps",
            )
            .fetch_optional(&pool)
            .await?;
            let Some((id, steps)) = claimed else {
                return Ok(false);
            };
            for position in 0..steps {
                sqlx::query(
                    "WITH advanced AS (UPDATE bench_naive SET next_step = next_step + 1 WHERE id = $1 AND next_step = $2 RETURNING id)
                     INSERT INTO bench_naive_steps (job_id, position, output) SELECT id, $2, 'null'::json FROM advanced",
                )
                .bind(id)
                .bind(position)
                .execute(&pool)
                .await?;
            }
            sqlx::query("UPDATE bench_naive SET state = 'done' WHERE id = $1")
                .bind(id)
                .execute(&pool)
                .await?;
            Ok(true)
        }
    })
    .await?;
    Ok(rate)
}

async fn sqlite_events(
    url: &str,
    events: usize,
    steps: usize,
    clients: usize,
) -> Result<f64, BoxError> {
    let pool = sqlite_pool(url, clients).await?;
    for statement in [
        "CREATE TABLE IF NOT EXISTS bench_naive (id INTEGER PRIMARY KEY, state TEXT NOT NULL DEFAULT 'pending', next_step INTEGER NOT NULL DEFAULT 0, steps INTEGER NOT NULL, lease_until TEXT)",
        "CREATE INDEX IF NOT EXISTS bench_naive_pending ON bench_naive (id) WHERE state = 'pending'",
        "CREATE TABLE IF NOT EXISTS bench_naive_steps (job_id INTEGER NOT NULL, position INTEGER NOT NULL, output TEXT, PRIMARY KEY (job_id, position))",
    ] {
        sqlx::query(statement).execute(&pool).await?;
    }
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2)
         INSERT INTO bench_naive (steps) SELECT ?1 FROM n",
    )
    .bind(i64::try_from(steps)?)
    .bind(i64::try_from(events)?)
    .execute(&pool)
    .await?;
    let rate = run_clients(events, clients, move |_| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            let claimed: Option<(i64, i64)> = sqlx::query_as(
                "UPDATE bench_naive SET state = 'running', lease_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+30 seconds')
                 WHERE id = (SELECT id FROM bench_naive WHERE state = 'pending' ORDER BY id LIMIT 1)
                 RETURNING id, steps",
            )
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
            let Some((id, steps)) = claimed else {
                return Ok(false);
            };
            for position in 0..steps {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query("UPDATE bench_naive SET next_step = next_step + 1 WHERE id = ?1 AND next_step = ?2")
                    .bind(id)
                    .bind(position)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("INSERT INTO bench_naive_steps (job_id, position, output) VALUES (?1, ?2, 'null')")
                    .bind(id)
                    .bind(position)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query("UPDATE bench_naive SET state = 'done' WHERE id = ?1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(true)
        }
    })
    .await?;
    Ok(rate)
}
