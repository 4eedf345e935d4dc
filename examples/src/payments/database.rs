//! The app's own tables, in the engine's database: `accounts` (balances the
//! `credit_account` step changes in the engine's transaction) and `received`
//! (what the `record` step saw). Created at start with
//! `CREATE TABLE IF NOT EXISTS`, the same SQL on both backends.

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqlitePool;
use tickmark::store::postgres::{PoolExecutor, PostgresStore};
use tickmark::store::sqlite::SqliteStore;
use tickmark::{Store, StoreError};

const CREATE_TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS accounts (
        customer TEXT PRIMARY KEY,
        balance  BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS received (
        source   TEXT NOT NULL,
        event_id TEXT NOT NULL,
        kind     TEXT NOT NULL,
        PRIMARY KEY (source, event_id)
    )",
];

/// A pool on the engine's database, for the app's own tables.
#[derive(Debug, Clone)]
pub enum AppDatabase {
    /// On PostgreSQL: the store's executor, which also works through a
    /// transaction pooler (`?pooler=transaction`, docs/deploying.md).
    Postgres(PoolExecutor),
    /// On SQLite.
    Sqlite(SqlitePool),
}

/// Connect the engine's store at `url` (applying tickmark's schema) and
/// create the app's tables.
pub async fn open(url: &str) -> Result<(Arc<dyn Store>, AppDatabase), StoreError> {
    let (store, app): (Arc<dyn Store>, AppDatabase) = if url.starts_with("sqlite:") {
        let store = SqliteStore::connect(url).await?;
        let pool = store.pool().clone();
        (Arc::new(store), AppDatabase::Sqlite(pool))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let store = PostgresStore::connect(url).await?;
        let executor = store.executor().clone();
        (Arc::new(store), AppDatabase::Postgres(executor))
    } else {
        return Err(StoreError::UnsupportedUrl(
            tickmark::redact_url(url).into_owned(),
        ));
    };
    app.create_tables().await?;
    Ok((store, app))
}

impl AppDatabase {
    /// Create `accounts` and `received` if they do not exist.
    pub async fn create_tables(&self) -> Result<(), StoreError> {
        for statement in CREATE_TABLES {
            // Two PostgreSQL processes creating the same table at the same
            // moment can collide in the catalog; the second try sees it.
            let mut tries = 0;
            loop {
                let created = match self {
                    AppDatabase::Postgres(pool) => {
                        sqlx::query(statement).execute(pool).await.map(|_| ())
                    }
                    AppDatabase::Sqlite(pool) => {
                        sqlx::query(statement).execute(pool).await.map(|_| ())
                    }
                };
                match created {
                    Ok(_) => break,
                    Err(_) if tries < 3 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(100 * tries)).await;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
        Ok(())
    }

    /// A customer's balance, if the account exists.
    pub async fn balance(&self, customer: &str) -> Result<Option<i64>, sqlx::Error> {
        const SQL_PG: &str = "SELECT balance FROM accounts WHERE customer = $1";
        const SQL_LITE: &str = "SELECT balance FROM accounts WHERE customer = ?1";
        match self {
            AppDatabase::Postgres(pool) => {
                sqlx::query_scalar(SQL_PG)
                    .bind(customer)
                    .fetch_optional(pool)
                    .await
            }
            AppDatabase::Sqlite(pool) => {
                sqlx::query_scalar(SQL_LITE)
                    .bind(customer)
                    .fetch_optional(pool)
                    .await
            }
        }
    }

    /// How many events `record` has recorded.
    pub async fn received_count(&self) -> Result<i64, sqlx::Error> {
        const SQL: &str = "SELECT count(*) FROM received";
        match self {
            AppDatabase::Postgres(pool) => sqlx::query_scalar(SQL).fetch_one(pool).await,
            AppDatabase::Sqlite(pool) => sqlx::query_scalar(SQL).fetch_one(pool).await,
        }
    }
}
