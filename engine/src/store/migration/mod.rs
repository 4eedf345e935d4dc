//! tickmark's schema history: its own table, apart from the application's.
//!
//! sqlx's `Migrator` records what it applied in `_sqlx_migrations`, a name
//! fixed in sqlx (0.8: `sqlx-postgres/src/migrate.rs` and
//! `sqlx-sqlite/src/migrate.rs` write it literally), and an application
//! that runs its own `sqlx::migrate!` uses the same table: whichever
//! migrator ran second found the other's rows and failed (`VersionMissing`).
//! So tickmark records its migrations in [`HISTORY_TABLE`]
//! (`tickmark_migrations`, beside its other tables, the columns of sqlx's),
//! and applies the migrations that `sqlx::migrate!` embeds (number, name,
//! SQL, checksum) with a small runner of its own: per backend in
//! `postgres/migrate.rs` and `sqlite/migrate.rs`, the decisions here in
//! `plan.rs`. It is hand-written because sqlx takes no table name; it is
//! small because it only does what tickmark needs: every pending migration
//! in one transaction, checksums verified, a newer schema refused.
//!
//! A database migrated by an earlier tickmark has tickmark's rows in
//! `_sqlx_migrations`. Migrating **adopts** them: a row there whose number
//! *and* checksum are those of one of tickmark's migrations moves to
//! tickmark's table, in the migration's transaction; the application's own
//! rows stay where they are. After that, a process of an earlier tickmark
//! release cannot start on the database (its migrator no longer finds its
//! history): upgrade every process.

mod error;
pub(crate) mod plan;

use futures_util::future::BoxFuture;

pub use error::MigrationError;

use super::StoreError;

/// The table where tickmark records the schema migrations it applied, in
/// the schema of its other tables (PostgreSQL: the connection's
/// `current_schema()`; SQLite: the main database).
pub const HISTORY_TABLE: &str = "tickmark_migrations";

/// The history table of sqlx's `Migrator`, where an earlier tickmark
/// recorded its migrations, and where the application's own stay.
pub(crate) const SHARED_HISTORY_TABLE: &str = "_sqlx_migrations";

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
pub trait MigrationTarget: sealed::Sealed + Sync {
    /// Apply tickmark's schema (what [`migrate`] does).
    #[doc(hidden)]
    fn apply_tickmark_schema(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl Sealed for sqlx::PgPool {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::SqlitePool {}
}

#[cfg(feature = "postgres")]
impl MigrationTarget for sqlx::PgPool {
    fn apply_tickmark_schema(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(super::postgres::migrate_pool(self))
    }
}

#[cfg(feature = "sqlite")]
impl MigrationTarget for sqlx::SqlitePool {
    fn apply_tickmark_schema(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(super::sqlite::migrate_pool(self))
    }
}
