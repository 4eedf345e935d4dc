//! What can go wrong with tickmark's schema history, each saying what to do next.

use crate::store::Backend;

/// Why tickmark's schema could not be applied or is not the one this build
/// needs (reached as [`StoreError::Migration`](crate::store::StoreError::Migration)).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// tickmark's history table records a migration this build does not
    /// know: a newer tickmark migrated the database. Nothing was changed.
    #[error(
        "the {backend} database records tickmark schema migration {recorded}, newer than this \
         build knows (its newest is {known}): a newer tickmark migrated it. Nothing was changed. \
         Upgrade this binary (or the tickmark crate) to the version the other processes run; \
         never roll the schema back by hand"
    )]
    NewerSchema {
        /// Which database.
        backend: Backend,
        /// The newest migration the database records.
        recorded: i64,
        /// The newest migration this build applies.
        known: i64,
    },
    /// A migration recorded as applied differs from this build's file of the
    /// same number: a released migration was edited.
    #[error(
        "tickmark schema migration {version} ({description}) recorded in the {backend} database \
         differs from this build's (its checksum changed): a released migration file was edited. \
         Restore migrations/{backend}/ as released (a schema change is a new migration), then \
         start again"
    )]
    ChecksumMismatch {
        /// Which database.
        backend: Backend,
        /// The migration's number.
        version: i64,
        /// The migration's name in this build.
        description: String,
    },
    /// The database does not hold tickmark's schema at this build's version
    /// (none at all, an older one, or one recorded only in the old shared
    /// history): a store on the application's own pool
    /// (`from_pool`) does not migrate.
    #[error(
        "the {backend} database does not hold tickmark's schema at this build's version \
         (recorded: {}; this build needs {needed}). Apply it first: call \
         `tickmark::migrate(&pool).await` at start-up, or run `tickmark migrate`",
        recorded.map_or_else(|| "none".to_owned(), |v| format!("up to {v}"))
    )]
    Unmigrated {
        /// Which database.
        backend: Backend,
        /// The newest migration tickmark's history records, if any.
        recorded: Option<i64>,
        /// The newest migration this build applies.
        needed: i64,
    },
    /// A migration's SQL failed; the transaction rolled back, nothing of
    /// this run's migrations is applied.
    #[error("tickmark schema migration {version} ({description}) failed on {backend}, nothing was applied: {source}")]
    Failed {
        /// Which database.
        backend: Backend,
        /// The migration's number.
        version: i64,
        /// The migration's name.
        description: String,
        /// The database's answer.
        #[source]
        source: sqlx::Error,
    },
}
