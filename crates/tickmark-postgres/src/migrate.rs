//! Applying tickmark's PostgreSQL migrations, recorded in its own table
//! (`tickmark_migrations`; why tickmark runs them itself:
//! store/migration/mod.rs).
//!
//! Every pending migration in one transaction, which holds one server
//! connection through a transaction pooler, and which no other process sees
//! half done: a worker of the previous release, claiming during a rolling
//! upgrade, sees the schema before the upgrade or after it.
//!
//! The lock is the transaction's own ([`MIGRATE_LOCK`]), so that it ends
//! with it, and a second process waits for this one's commit before it
//! reads which migrations are applied. Not a session lock
//! (`pg_advisory_lock`, as sqlx's migrator takes): a failed migration
//! returned before sqlx unlocked, a rollback keeps a session lock, and a
//! pooler keeps the server connection after its client has gone, so
//! through a transaction pooler the next start waited for ever.

use std::time::Instant;

use sqlx::migrate::{Migration, Migrator};
use sqlx::{Executor, PgConnection};

use super::pooler::{PoolExecutor, Pooler};
use tickmark_driver::store::migration::plan::{self, Recorded};
use tickmark_driver::store::migration::MigrationError;
use tickmark_driver::store::{Backend, StoreError};

// This crate's `migrations` is a symlink to the workspace's `migrations/postgres`:
// one copy of the SQL, which `cargo package` follows into the published crate. Only
// the embedded migrations are read from it: tickmark runs them itself.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// This build's migrations, in order.
pub(super) fn migrations() -> &'static [Migration] {
    MIGRATOR.iter().as_slice()
}

/// Migrations take turns, each process's until its commit or rollback.
const MIGRATE_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('tickmark.migrate:' || current_schema(), 0))";

/// tickmark's history: the columns of sqlx's `_sqlx_migrations`, so that an
/// earlier tickmark's rows move over as they are.
const CREATE_HISTORY: &str = "CREATE TABLE IF NOT EXISTS tickmark_migrations (
    version        BIGINT PRIMARY KEY,
    description    TEXT NOT NULL,
    installed_on   TIMESTAMPTZ NOT NULL DEFAULT now(),
    success        BOOLEAN NOT NULL,
    checksum       BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
)";

/// Whether a table of this name is in the schema of tickmark's tables.
const TABLE_EXISTS: &str =
    "SELECT to_regclass(format('%I.%I', current_schema(), $1::text)) IS NOT NULL";

const RECORDED: &str = "SELECT version, checksum FROM tickmark_migrations ORDER BY version";

const RECORD: &str = "INSERT INTO tickmark_migrations
    (version, description, success, checksum, execution_time) VALUES ($1, $2, TRUE, $3, $4)";

const SHARED_RECORDED: &str = "SELECT version, checksum FROM _sqlx_migrations WHERE success";

/// One of tickmark's rows of the shared history, moved to tickmark's.
const ADOPT: &str = "WITH moved AS (
    DELETE FROM _sqlx_migrations WHERE version = $1 AND checksum = $2 AND success
    RETURNING version, description, installed_on, success, checksum, execution_time
)
INSERT INTO tickmark_migrations (version, description, installed_on, success, checksum, execution_time)
SELECT * FROM moved
ON CONFLICT (version) DO NOTHING";

/// Apply the schema through `db` (the store's pool, as its pooler needs).
pub(super) async fn run(db: &PoolExecutor) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    sqlx::query(MIGRATE_LOCK).execute(&mut *tx).await?;
    apply_on(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Apply the schema on the application's pool (`tickmark::migrate`).
pub async fn run_on_pool(pool: &sqlx::PgPool) -> Result<(), StoreError> {
    run(&PoolExecutor::new(pool.clone(), Pooler::None)).await
}

/// Adopt an earlier tickmark's history, then apply what is pending, on
/// `conn` in its transaction (the caller holds the lock and commits).
async fn apply_on(conn: &mut PgConnection) -> Result<(), StoreError> {
    conn.execute(CREATE_HISTORY).await?;
    adopt(conn).await?;
    let recorded: Vec<Recorded> = sqlx::query_as(RECORDED).fetch_all(&mut *conn).await?;
    for migration in plan::pending(Backend::Postgres, migrations(), &recorded)? {
        let started = Instant::now();
        conn.execute(&*migration.sql)
            .await
            .map_err(|error| failed(migration, error))?;
        let took = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
        sqlx::query(RECORD)
            .bind(migration.version)
            .bind(&*migration.description)
            .bind(&*migration.checksum)
            .bind(took)
            .execute(&mut *conn)
            .await?;
        tracing::info!(version = migration.version, description = %migration.description, "applied tickmark schema migration");
    }
    Ok(())
}

/// Move tickmark's rows of `_sqlx_migrations` (an earlier tickmark's
/// history) to `tickmark_migrations`; the application's rows stay.
async fn adopt(conn: &mut PgConnection) -> Result<(), StoreError> {
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
        sqlx::query(ADOPT)
            .bind(migration.version)
            .bind(&*migration.checksum)
            .execute(&mut *conn)
            .await?;
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

/// Whether the database holds exactly this build's schema (a store on the
/// application's pool checks, and does not migrate).
pub(super) async fn check_current(db: &PoolExecutor) -> Result<(), StoreError> {
    let exists: bool = sqlx::query_scalar(TABLE_EXISTS)
        .bind(tickmark_driver::store::migration::HISTORY_TABLE)
        .fetch_one(db)
        .await?;
    let recorded: Vec<Recorded> = if exists {
        sqlx::query_as(RECORDED).fetch_all(db).await?
    } else {
        Vec::new()
    };
    Ok(plan::current(Backend::Postgres, migrations(), &recorded)?)
}

/// A migration's SQL failed: named, unless the error says more about the
/// connection (a pooler the URL does not announce, an outage).
fn failed(migration: &Migration, error: sqlx::Error) -> StoreError {
    match StoreError::from(error) {
        StoreError::Database(source) if !matches!(source, sqlx::Error::Configuration(_)) => {
            MigrationError::Failed {
                backend: Backend::Postgres,
                version: migration.version,
                description: migration.description.to_string(),
                source,
            }
            .into()
        }
        other => other,
    }
}
