//! Applying tickmark's SQLite migrations, recorded in its own table
//! (`tickmark_migrations`; why tickmark runs them itself:
//! store/migration/mod.rs).
//!
//! Every pending migration in one `BEGIN IMMEDIATE` transaction: it takes
//! the file's write lock before it reads the history, so processes that
//! open a new file at once take turns (each waits on `busy_timeout`), and
//! the second finds the first's migrations applied. A lock wait that runs
//! out is retried a few times ([`run`]).

use std::time::{Duration, Instant};

use sqlx::migrate::{Migration, Migrator};
use sqlx::{Executor, SqliteConnection, SqlitePool};

use tickmark_driver::store::migration::plan::{self, Recorded};
use tickmark_driver::store::migration::MigrationError;
use tickmark_driver::store::{Backend, StoreError};

// This crate's `migrations` is a symlink to the workspace's `migrations/sqlite`:
// one copy of the SQL, which `cargo package` follows into the published crate. Only
// the embedded migrations are read from it: tickmark runs them itself.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// This build's migrations, in order.
pub(super) fn migrations() -> &'static [Migration] {
    MIGRATOR.iter().as_slice()
}

/// tickmark's history: the columns of sqlx's `_sqlx_migrations`, so that an
/// earlier tickmark's rows move over as they are.
const CREATE_HISTORY: &str = "CREATE TABLE IF NOT EXISTS tickmark_migrations (
    version        BIGINT PRIMARY KEY,
    description    TEXT NOT NULL,
    installed_on   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success        BOOLEAN NOT NULL,
    checksum       BLOB NOT NULL,
    execution_time BIGINT NOT NULL
)";

const TABLE_EXISTS: &str =
    "SELECT count(*) > 0 FROM main.sqlite_master WHERE type = 'table' AND name = ?1";

const RECORDED: &str = "SELECT version, checksum FROM tickmark_migrations ORDER BY version";

const RECORD: &str = "INSERT INTO tickmark_migrations
    (version, description, success, checksum, execution_time) VALUES (?1, ?2, TRUE, ?3, ?4)";

const SHARED_RECORDED: &str = "SELECT version, checksum FROM _sqlx_migrations WHERE success";

/// One of tickmark's rows of the shared history, copied to tickmark's…
const ADOPT_COPY: &str = "INSERT OR IGNORE INTO tickmark_migrations
    (version, description, installed_on, success, checksum, execution_time)
SELECT version, description, installed_on, success, checksum, execution_time
FROM _sqlx_migrations WHERE version = ?1 AND checksum = ?2 AND success";
/// … then removed from the shared one.
const ADOPT_REMOVE: &str =
    "DELETE FROM _sqlx_migrations WHERE version = ?1 AND checksum = ?2 AND success";

/// How often a migration whose lock wait ran out is tried again.
const TRIES: u32 = 4;

/// Apply the schema on `pool` (the store's, or the application's).
pub async fn run(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut tries = 1;
    loop {
        match run_once(pool).await {
            Err(error) if error.is_transient() && tries < TRIES => {
                tracing::debug!(%error, "schema migration waited for another process; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(tries))).await;
                tries += 1;
            }
            done => return done,
        }
    }
}

async fn run_once(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    tx.execute(CREATE_HISTORY).await?;
    adopt(&mut tx).await?;
    let recorded: Vec<Recorded> = sqlx::query_as(RECORDED).fetch_all(&mut *tx).await?;
    for migration in plan::pending(Backend::Sqlite, migrations(), &recorded)? {
        let started = Instant::now();
        tx.execute(&*migration.sql)
            .await
            .map_err(|error| failed(migration, error))?;
        let took = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
        sqlx::query(RECORD)
            .bind(migration.version)
            .bind(&*migration.description)
            .bind(&*migration.checksum)
            .bind(took)
            .execute(&mut *tx)
            .await?;
        tracing::info!(version = migration.version, description = %migration.description, "applied tickmark schema migration");
    }
    tx.commit().await?;
    Ok(())
}

/// Move tickmark's rows of `_sqlx_migrations` (an earlier tickmark's
/// history) to `tickmark_migrations`; the application's rows stay.
async fn adopt(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let shared_exists: bool = sqlx::query_scalar(TABLE_EXISTS)
        .bind(tickmark_driver::store::migration::SHARED_HISTORY_TABLE)
        .fetch_one(&mut *conn)
        .await?;
    if !shared_exists {
        return Ok(());
    }
    let shared: Vec<Recorded> = sqlx::query_as(SHARED_RECORDED)
        .fetch_all(&mut *conn)
        .await?;
    let mut adopted = 0;
    for migration in plan::adoptable(migrations(), &shared) {
        for statement in [ADOPT_COPY, ADOPT_REMOVE] {
            sqlx::query(statement)
                .bind(migration.version)
                .bind(&*migration.checksum)
                .execute(&mut *conn)
                .await?;
        }
        adopted += 1;
    }
    if adopted > 0 {
        tracing::info!(
            adopted,
            "moved an earlier tickmark's schema history from _sqlx_migrations to tickmark_migrations"
        );
    }
    Ok(())
}

/// Whether the file holds exactly this build's schema (a store on the
/// application's pool checks, and does not migrate).
pub(super) async fn check_current(pool: &SqlitePool) -> Result<(), StoreError> {
    let exists: bool = sqlx::query_scalar(TABLE_EXISTS)
        .bind(tickmark_driver::store::migration::HISTORY_TABLE)
        .fetch_one(pool)
        .await?;
    let recorded: Vec<Recorded> = if exists {
        sqlx::query_as(RECORDED).fetch_all(pool).await?
    } else {
        Vec::new()
    };
    Ok(plan::current(Backend::Sqlite, migrations(), &recorded)?)
}

fn failed(migration: &Migration, error: sqlx::Error) -> StoreError {
    match StoreError::from(error) {
        StoreError::Database(source) => MigrationError::Failed {
            backend: Backend::Sqlite,
            version: migration.version,
            description: migration.description.to_string(),
            source,
        }
        .into(),
        other => other,
    }
}
