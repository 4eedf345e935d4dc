//! What can go wrong talking to the store.

/// An error from a [`Store`](super::Store).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The event's lease was taken over by another worker, or expired: this
    /// worker must change nothing more and stop working on the event.
    #[error("lease on event {event_seq} was lost (taken over or expired); this worker stops and another resumes the event")]
    LeaseLost {
        /// The event whose lease was lost.
        event_seq: i64,
    },
    /// A source's reconcile lease was taken by another process after it
    /// expired (or was given back, or reset by an operator): this process
    /// must stop reconciling the source and change nothing more; the holder
    /// of the newer lease goes on from the stored cursor.
    ///
    /// The field is `source_name`, not `source`: thiserror takes a field
    /// named `source` for the error's cause.
    #[error("reconcile lease on source `{source_name}` was lost (expired and taken over, or reset); this process stops reconciling it and the holder of the newer lease goes on from the stored cursor")]
    ReconcileLeaseLost {
        /// The receiver source whose reconcile lease was lost.
        source_name: String,
    },
    /// The database could not be reached, or refused for now (connection
    /// refused or dropped, pool exhausted, database starting up or locked).
    /// Transient: retry later.
    #[error("database unavailable ({0}); it will be retried — check that the database is running and reachable")]
    Unavailable(#[source] sqlx::Error),
    /// None of the hosts of a multi-host PostgreSQL URL accepts writes right
    /// now (each is unreachable, a standby, or read-only): a failover is
    /// under way, or every server is down. Transient: retry later. Lists
    /// each host with why it did not suit.
    #[error("no database host accepts writes right now ({0}); it will be retried — a failover may be under way")]
    NoWritableHost(String),
    /// Too many writes are queued for the database right now (the
    /// group-commit queue is full): refused at once rather than queued
    /// without bound. Transient: retry in a moment. The receiver answers 503
    /// `overloaded` with `Retry-After`.
    #[error("too many writes are waiting for the database; retry in a moment")]
    Overloaded,
    /// An event with the same key is being accepted in an application's
    /// transaction that is still open (`Engine::accept_in`): whether this
    /// one is new or a duplicate is known only when that transaction ends,
    /// and waiting for it would hold up other accepts. Nothing was written.
    /// Transient: retry later (the receiver answers 503 `accept_in_progress`
    /// with `Retry-After`; once the other transaction commits, the retry is
    /// a duplicate, and if it rolls back, the retry records the event).
    #[error("an event with this key is being accepted in another transaction that is still open; retry once it ends")]
    AcceptInProgress,
    /// The database answered with an error that retrying will not fix.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// tickmark's schema could not be applied, or is not the one this build
    /// needs (newer, edited, or not applied yet): the variant says what to do.
    #[error(transparent)]
    Migration(#[from] super::migration::MigrationError),
    /// A store on the application's own pool (`from_pool`) found a setting
    /// of the pool's connections that tickmark's statements cannot run
    /// under; tickmark's own pool sets it on each connection.
    #[error(
        "the application's pool has `{setting}` = `{found}`, and tickmark needs `{needed}`: {fix}"
    )]
    UnsuitablePool {
        /// The setting (a PostgreSQL parameter, a SQLite pragma).
        setting: &'static str,
        /// Its value on the pool's connection.
        found: String,
        /// What tickmark needs.
        needed: &'static str,
        /// How to set it.
        fix: &'static str,
    },
    /// `Engine::accept_in` cannot record this
    /// event in the caller's transaction; says why and what to do instead
    /// (nothing was written).
    #[error("cannot accept this event in the caller's transaction: {0}")]
    NotInCallerTransaction(String),
    /// A stored row that this build cannot read.
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),

    /// The engine's keys do not fit this database's sealed rows, or a
    /// payload could not be sealed (docs/privacy.md): nothing was written.
    #[error("{0}")]
    Sealing(String),
    /// The database URL names a backend this build was compiled without.
    #[error("this build of tickmark has no `{0}` backend: enable the `{0}` feature of the tickmark crate (it is on by default)")]
    BackendNotBuilt(super::Backend),
    /// The database URL names no backend tickmark supports.
    #[error("unsupported database URL `{0}`: use `sqlite://path/to/file.db` or `postgres://user@host/db`")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_)
                | StoreError::Overloaded
                | StoreError::NoWritableHost(_)
                | StoreError::AcceptInProgress
        )
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if let Some(explained) = unannounced_pooler(&error) {
            return StoreError::Database(sqlx::Error::Configuration(explained.into()));
        }
        if is_transient(&error) {
            StoreError::Unavailable(error)
        } else {
            StoreError::Database(error)
        }
    }
}

/// What to do, when `error` says a transaction pooler stands between the
/// store and PostgreSQL though the URL does not say so (`pooler=transaction`).
///
/// sqlx prepares each statement under a name of its client connection's
/// (`sqlx_s_1`, `sqlx_s_2`, …), and such a pooler hands a client's
/// statements to whichever server connection is free, which others' clients
/// used before: a name meets another client's (42P05, "already exists"), or
/// a server that never saw it (26000, "does not exist"). tickmark prepares no
/// statement by hand, so only a shared server connection explains either.
fn unannounced_pooler(error: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    let code = db.code()?;
    if !matches!(code.as_ref(), "42P05" | "26000") || !db.message().contains("\"sqlx_s_") {
        return None;
    }
    Some(format!(
        "{}: a connection pooler in transaction mode (such as PgBouncer's `pool_mode = \
         transaction`) stands between tickmark and PostgreSQL, and hands one client's prepared \
         statements to other server connections. Add `pooler=transaction` to the database URL \
         (`postgres://user@pooler:6432/db?pooler=transaction`; `listen_url=<a URL past the \
         pooler, percent-encoded>` keeps wake-ups prompt): docs/deploying.md, \"PgBouncer, \
         transaction mode\"",
        db.message()
    ))
}

fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            // PostgreSQL: class 08 connection exception, 57P01-03 shutting down or
            // starting up, 53300 too many connections, 40001/40P01 serialization
            // failure or deadlock, 25006 read-only transaction (the server is a
            // standby now, or not promoted yet: a failover is under way). SQLite: 5 SQLITE_BUSY, 6 SQLITE_LOCKED (and
            // their extended codes, which keep the primary code in the low byte).
            code.starts_with("08")
                || matches!(
                    code,
                    "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01" | "25006"
                )
                || code
                    .parse::<i32>()
                    .map(|c| matches!(c & 0xff, 5 | 6))
                    .unwrap_or(false)
        }
        _ => false,
    }
}
