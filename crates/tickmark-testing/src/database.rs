//! Each test's own database: a SQLite file in a temp dir (removed with it),
//! or a new schema in a PostgreSQL database (dropped with it).

#[cfg(feature = "postgres")]
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

#[cfg(feature = "postgres")]
use tickmark_driver::store::StoreError;
use tickmark_driver::store::{Backend, Store};

#[cfg(feature = "sqlite")]
use super::clock::FakeClock;
use super::error::TestError;

/// Where a test engine's tables are, and what removes them afterwards.
#[derive(Debug)]
pub(crate) enum TestDatabase {
    #[cfg(feature = "sqlite")]
    Sqlite {
        url: String,
        /// Removed when the last clone of the test engine drops.
        _dir: tempfile::TempDir,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        url: String,
        admin_url: String,
        schema: String,
    },
}

impl TestDatabase {
    pub(crate) fn url(&self) -> &str {
        match *self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite { ref url, .. } => url,
            #[cfg(feature = "postgres")]
            Self::Postgres { ref url, .. } => url,
        }
    }
}

/// A new SQLite file whose store reads `clock`.
#[cfg(feature = "sqlite")]
pub(crate) async fn sqlite(clock: &FakeClock) -> Result<(TestDatabase, Arc<dyn Store>), TestError> {
    use tickmark_sqlite::{SqliteOptions, SqliteStore};

    let dir = tempfile::Builder::new()
        .prefix("tickmark-test-")
        .tempdir()
        .map_err(|source| TestError::Io {
            what: "create a temp dir for the test's SQLite file",
            source,
        })?;
    let url = format!("sqlite://{}", dir.path().join("tickmark.db").display());
    let options = SqliteOptions {
        clock: clock.store_clock(),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::connect_with(&url, options).await?;
    Ok((TestDatabase::Sqlite { url, _dir: dir }, Arc::new(store)))
}

/// A new schema in the PostgreSQL database at `admin_url`, and a store whose
/// connections have it as their `search_path`.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres(admin_url: &str) -> Result<(TestDatabase, Arc<dyn Store>), TestError> {
    use sqlx::Connection;

    use tickmark_postgres::{PostgresOptions, PostgresStore};

    static NEXT: AtomicU32 = AtomicU32::new(0);
    let schema = format!(
        "tickmark_test_{}_{}_{:04x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u16>()
    );
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .map_err(StoreError::from)?;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut admin)
        .await
        .map_err(StoreError::from)?;
    let _ = admin.close().await;
    let separator = if admin_url.contains('?') { '&' } else { '?' };
    // The application name tells this engine's connections from every other
    // test's on the server: a crash ends them, and only them.
    let url =
        format!("{admin_url}{separator}options[search_path]={schema}&application_name={schema}");
    let options = PostgresOptions {
        max_connections: 8,
        ..PostgresOptions::default()
    };
    let database = TestDatabase::Postgres {
        url: url.clone(),
        admin_url: admin_url.to_owned(),
        schema,
    };
    // From here on, `database` drops the schema should the store fail.
    let store = PostgresStore::connect_with(&url, options).await?;
    Ok((database, Arc::new(store)))
}

impl TestDatabase {
    /// End the server sessions a killed worker left in a transaction, as the
    /// server ends a crashed process's: their transactions roll back and
    /// their locks go. (An aborted task's connection goes back to the pool
    /// with its rollback only queued, holding its row locks.) SQLite's
    /// connections are this process's own: dropping them is enough.
    // With PostgreSQL the only backend, `Self::Postgres` is every value.
    #[cfg_attr(not(feature = "sqlite"), allow(irrefutable_let_patterns))]
    pub(crate) async fn end_killed_sessions(&self) -> Result<(), TestError> {
        #[cfg(feature = "postgres")]
        if let Self::Postgres {
            admin_url, schema, ..
        } = self
        {
            use sqlx::Connection;
            let mut admin = sqlx::PgConnection::connect(admin_url)
                .await
                .map_err(StoreError::from)?;
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1 AND state <> 'idle' AND pid <> pg_backend_pid()",
            )
            .bind(schema)
            .execute(&mut admin)
            .await
            .map_err(StoreError::from)?;
            let _ = admin.close().await;
        }
        Ok(())
    }

    pub(crate) fn backend(&self) -> Backend {
        match *self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite { .. } => Backend::Sqlite,
            #[cfg(feature = "postgres")]
            Self::Postgres { .. } => Backend::Postgres,
        }
    }
}

#[cfg(feature = "postgres")]
impl Drop for TestDatabase {
    #[cfg_attr(not(feature = "sqlite"), allow(irrefutable_let_patterns))]
    fn drop(&mut self) {
        let Self::Postgres {
            admin_url, schema, ..
        } = self
        else {
            return;
        };
        let (admin_url, schema) = (admin_url.clone(), schema.clone());
        // Drop may run inside a runtime that must not block: a thread of its own.
        let _ = std::thread::spawn(move || {
            use sqlx::Connection;
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
                    // Sessions still open on the schema (a pool not yet
                    // closed, a transaction dropped with its rollback only
                    // queued) would hold the drop up forever.
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name = $1 AND pid <> pg_backend_pid()",
                    )
                    .bind(&schema)
                    .execute(&mut admin)
                    .await;
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .execute(&mut admin)
                        .await;
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}
