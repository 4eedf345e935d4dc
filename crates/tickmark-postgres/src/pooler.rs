//! Running through a connection pooler such as PgBouncer (docs/deploying.md).
//!
//! In **session** mode a client keeps one server connection for as long as
//! it is connected, so nothing changes: `pooler=session` is accepted and
//! means what no `pooler` means.
//!
//! In **transaction** mode (`pooler=transaction`) the pooler hands the
//! server connection to another client whenever the server is idle, that
//! is between transactions *and* between the messages of one statement
//! that is not in a transaction: sqlx sends `Parse`/`Sync`, waits, then
//! `Bind`/`Execute`/`Sync`, and the `Bind` may reach a server that never
//! saw the `Parse` — or another client's statement of the same name. So
//! the store, in this mode:
//!
//! - runs every statement inside a transaction ([`PoolExecutor`]'s [`Executor`]:
//!   a statement alone becomes `BEGIN` … `COMMIT`), which holds one server
//!   connection from `Parse` to `COMMIT`;
//! - keeps no prepared statement across transactions: the statement cache
//!   is off (`statement_cache_capacity(0)`), and since sqlx still names the
//!   statements it prepares (`sqlx_s_1`, `sqlx_s_2`… per client connection,
//!   so two clients' names meet on a shared server), each transaction
//!   runs `DEALLOCATE ALL` right after its `BEGIN`, in the same round trip;
//! - takes only transaction-scoped advisory locks (all of tickmark's are,
//!   `pg_advisory_xact_lock`, the migrations' too: tickmark runs them
//!   itself, without sqlx's session lock), and runs the migrations in one
//!   transaction (`postgres/migrate.rs`): a session lock that a failed migration
//!   left on a server connection would outlive its client there;
//! - sets no session state (the isolation level is set per transaction);
//! - `LISTEN`s on a connection of its own to `listen_url`, a URL that
//!   bypasses the pooler, or, without one, does not listen: workers then
//!   find new events by polling (`WorkerConfig::poll_every`, 2 s by
//!   default). `NOTIFY` is sent inside the accept's transaction and works
//!   through the pooler.
//!
//! The price: four round trips for a statement alone (`BEGIN`, `Parse`,
//! `Bind`/`Execute`, `COMMIT`) where a direct connection's cached statement
//! takes one.

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::postgres::{PgPool, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Describe, Either, Error, Execute, Executor, Postgres, Transaction};

use super::isolation;

/// Which connection pooler stands between tickmark and PostgreSQL: the
/// `pooler` parameter of the URL (`none`, `session` or `transaction`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// A direct connection (the default).
    #[default]
    None,
    /// A pooler in session mode: the same as a direct connection.
    Session,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`):
    /// every statement in a transaction, no statement cache, no `LISTEN`
    /// through the pooler.
    Transaction,
}

impl Pooler {
    /// The value of a URL's `pooler` parameter.
    pub(super) fn parse(value: &str) -> Option<Pooler> {
        match value {
            "none" => Some(Pooler::None),
            "session" => Some(Pooler::Session),
            "transaction" => Some(Pooler::Transaction),
            _ => None,
        }
    }

    /// Whether the server connection may change between transactions.
    pub(super) fn per_transaction(self) -> bool {
        self == Pooler::Transaction
    }
}

/// The store's pool as an sqlx [`Executor`] that runs each statement the
/// way the URL's `pooler` needs: as on the pool, or, through a transaction
/// pooler, in a READ COMMITTED transaction of its own. The application's
/// own queries on tickmark's database go through a transaction pooler
/// safely this way ([`PostgresStore::executor`](super::PostgresStore::executor)),
/// and their transactions begin with [`begin`](Self::begin).
#[derive(Debug, Clone)]
pub struct PoolExecutor {
    pool: PgPool,
    pinned: bool,
}

/// How a transaction begins through a transaction pooler: the server
/// connection it lands on is cleared of other clients' statements first.
const POOLED_BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; DEALLOCATE ALL";

impl PoolExecutor {
    pub(super) fn new(pool: PgPool, pooler: Pooler) -> PoolExecutor {
        PoolExecutor {
            pool,
            pinned: pooler.per_transaction(),
        }
    }

    /// Whether every statement runs in a transaction (a transaction pooler).
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// A transaction at READ COMMITTED, whatever the role's default, which
    /// holds one server connection through a transaction pooler.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, Error> {
        if self.pinned {
            self.pool.begin_with(POOLED_BEGIN).await
        } else {
            isolation::begin(&self.pool).await
        }
    }
}

/// Statements on `&PoolExecutor` run as on the pool; through a transaction pooler,
/// each in a transaction of its own.
impl<'c> Executor<'c> for &'_ PoolExecutor {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return self.pool.fetch_many(query);
        }
        let db = self.clone();
        // Read to the end before COMMIT: a statement's effects are only
        // known once it has committed.
        let all = async move {
            let mut tx = db.begin().await?;
            let items: Vec<_> = tx.fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, Error>(items)
        };
        Box::pin(
            stream::once(all)
                .map(|result| match result {
                    Ok(items) => stream::iter(items.into_iter().map(Ok)).left_stream(),
                    Err(error) => stream::once(async { Err(error) }).right_stream(),
                })
                .flatten(),
        )
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return self.pool.fetch_optional(query);
        }
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let row = tx.fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    // Preparing and describing go to the pool as they are: a prepared
    // statement does not outlive its transaction through a transaction
    // pooler, and tickmark prepares none by hand.
    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, Result<Describe<Postgres>, Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}
