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
pub mod plan;

pub use error::MigrationError;

/// The table where tickmark records the schema migrations it applied, in
/// the schema of its other tables (PostgreSQL: the connection's
/// `current_schema()`; SQLite: the main database).
pub const HISTORY_TABLE: &str = "tickmark_migrations";

/// The history table of sqlx's `Migrator`, where an earlier tickmark
/// recorded its migrations, and where the application's own stay.
pub const SHARED_HISTORY_TABLE: &str = "_sqlx_migrations";
