//! Storage: the database tickmark keeps its inbox, plans and step-status
//! table in. [`connect`] by URL picks the backend; [`postgres`] and
//! [`sqlite`] build a store with options, or on an application's own pool
//! (then [`migrate`] it first). What the engine asks of a database is the
//! [`Store`] trait (tickmark's own stores implement it; read an engine's
//! state through [`Engine`](crate::Engine)).

use std::sync::Arc;

use futures_util::future::BoxFuture;

pub use tickmark_driver::store::{
    AppConnection, Backend, MigrationError, PortableQuery, PortableRow, SqlValue, StepTransaction,
    Store, StoreError,
};

/// The multi-machine backend (the `tickmark-postgres` crate).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    pub use tickmark_postgres::{PoolExecutor, PostgresOptions, PostgresStore};
}

/// The embedded backend: one file, no server (the `tickmark-sqlite` crate).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite {
    pub use tickmark_driver::store::Clock;
    pub use tickmark_sqlite::{SqliteOptions, SqliteStore};
}

/// Connect to the database at `url` and apply the schema.
///
/// `sqlite://path/to/file.db` (created if missing) or `postgres://user@host/db`;
/// each needs its backend's feature (`sqlite`, `postgres`: both on by default).
///
/// A PostgreSQL URL may name several hosts, as libpq allows, for a primary
/// and its standbys:
/// `postgres://user@host1:5432,host2:5432/db?target_session_attrs=read-write`.
/// The store then uses the host that accepts writes and moves to the new
/// primary after a failover, without a restart; while no host accepts
/// writes, its errors are transient (the receiver answers 503 with
/// `Retry-After`, workers back off). `target_session_attrs` may be
/// `read-write` (or `primary`) or `any` (the default, as in libpq: the
/// first host that answers). See docs/failover.md.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> = match tickmark_driver::store::backend_of(url) {
        #[cfg(feature = "sqlite")]
        Some(Backend::Sqlite) => Arc::new(tickmark_sqlite::SqliteStore::connect(url).await?),
        #[cfg(feature = "postgres")]
        Some(Backend::Postgres) => Arc::new(tickmark_postgres::PostgresStore::connect(url).await?),
        #[allow(unreachable_patterns)] // every backend compiled in is matched above
        Some(backend) => return Err(StoreError::BackendNotBuilt(backend)),
        None => {
            return Err(StoreError::UnsupportedUrl(
                crate::redact_url(url).into_owned(),
            ))
        }
    };
    Ok(store)
}

/// Apply tickmark's schema on the application's own pool: create its tables,
/// or bring them to this build's version, and adopt an earlier tickmark's
/// history from `_sqlx_migrations` (the application's own rows there are
/// left alone). Idempotent, and safe to run from several processes at once.
///
/// A store built on the application's pool (`PostgresStore::from_pool`,
/// `SqliteStore::from_pool`) does not migrate; call this first, beside the
/// application's own `sqlx::migrate!` (in either order):
///
/// ```no_run
/// # async fn start(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// tickmark::migrate(&pool).await?;
/// let store = tickmark::store::postgres::PostgresStore::from_pool(pool).await?;
/// # Ok(()) }
/// ```
///
/// Fails with [`StoreError::Migration`] when the database records a newer
/// tickmark's schema, or a migration whose SQL changed.
pub async fn migrate<P: MigrationTarget>(pool: &P) -> Result<(), StoreError> {
    pool.apply_tickmark_schema().await
}

/// A pool [`migrate`] can apply tickmark's schema on: `sqlx::PgPool` (with
/// the `postgres` feature) or `sqlx::SqlitePool` (with `sqlite`). Sealed.
pub trait MigrationTarget: pool_seal::Sealed + Sync {
    /// Apply tickmark's schema (what [`migrate`] does).
    #[doc(hidden)]
    fn apply_tickmark_schema(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

mod pool_seal {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl Sealed for sqlx::PgPool {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::SqlitePool {}
}

#[cfg(feature = "postgres")]
impl MigrationTarget for sqlx::PgPool {
    fn apply_tickmark_schema(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(tickmark_postgres::migrate_pool(self))
    }
}

#[cfg(feature = "sqlite")]
impl MigrationTarget for sqlx::SqlitePool {
    fn apply_tickmark_schema(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(tickmark_sqlite::migrate_pool(self))
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn an_unsupported_url_is_named_without_its_password() {
        let error = super::connect("mysql://app:s3cret@db/prod")
            .await
            .expect_err("mysql is not a backend");
        let said = error.to_string();
        assert!(!said.contains("s3cret"), "{said}");
        assert!(said.contains("mysql://app:***@db/prod"), "{said}");
    }
}
