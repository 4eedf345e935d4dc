//! The engine's own database transaction, lent to a transactional step so that
//! its writes commit together with its mark.

#[cfg(feature = "postgres")]
use sqlx::{PgConnection, Postgres};
#[cfg(feature = "sqlite")]
use sqlx::{Sqlite, SqliteConnection};
#[cfg(feature = "sqlite")]
use tokio::sync::OwnedMutexGuard;

use super::{Backend, StoreError};

/// An open transaction on the engine's database. A transactional step writes
/// through it; the engine then marks the step done in it and commits. If the
/// mark is refused (the lease was lost) or the step fails, everything rolls back.
///
/// Write the SQL once for both backends with [`query`](Self::query) (`$1`,
/// `$2` placeholders), or reach the backend's own connection with
/// [`postgres`](Self::postgres) / [`sqlite`](Self::sqlite) for what only one
/// of them can say.
///
/// ```no_run
/// # use tickmark::{StepContext, StepResult};
/// # async fn run(ctx: &mut StepContext<'_>) -> StepResult {
/// let customer = ctx.event().payload["customer"].as_str().unwrap_or_default().to_owned();
/// ctx.transaction()?
///     .query("INSERT INTO credits (customer) VALUES ($1)")
///     .bind(customer)
///     .execute()
///     .await?;
/// # Ok(serde_json::Value::Null) }
/// ```
#[derive(Debug)]
pub struct StepTransaction {
    inner: Inner,
}

#[derive(Debug)]
#[doc(hidden)]
pub enum Inner {
    #[cfg(feature = "postgres")]
    #[doc(hidden)]
    Postgres(sqlx::Transaction<'static, Postgres>),
    #[cfg(feature = "sqlite")]
    #[doc(hidden)]
    Sqlite {
        #[doc(hidden)]
        transaction: sqlx::Transaction<'static, Sqlite>,
        // Held until commit or rollback: this process's writers take turns.
        #[doc(hidden)]
        _write_turn: OwnedMutexGuard<()>,
    },
}

impl StepTransaction {
    #[cfg(feature = "postgres")]
    #[doc(hidden)]
    pub fn postgres_from(transaction: sqlx::Transaction<'static, Postgres>) -> Self {
        Self {
            inner: Inner::Postgres(transaction),
        }
    }

    #[cfg(feature = "sqlite")]
    #[doc(hidden)]
    pub fn sqlite_from(
        transaction: sqlx::Transaction<'static, Sqlite>,
        write_turn: OwnedMutexGuard<()>,
    ) -> Self {
        Self {
            inner: Inner::Sqlite {
                transaction,
                _write_turn: write_turn,
            },
        }
    }

    #[doc(hidden)]
    pub fn into_inner(self) -> Inner {
        self.inner
    }

    #[doc(hidden)]
    pub fn inner_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }

    /// Commit a transaction opened with `Engine::transaction`. (A transactional
    /// step never commits its own: the engine commits it with the mark.)
    pub async fn commit(self) -> Result<(), StoreError> {
        match self.inner {
            #[cfg(feature = "postgres")]
            Inner::Postgres(transaction) => transaction.commit().await?,
            #[cfg(feature = "sqlite")]
            Inner::Sqlite { transaction, .. } => transaction.commit().await?,
        }
        Ok(())
    }

    /// Which database the transaction is on.
    pub fn backend(&self) -> Backend {
        match self.inner {
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "sqlite")]
            Inner::Sqlite { .. } => Backend::Sqlite,
        }
    }

    /// The connection, if the engine runs on PostgreSQL.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(&mut self) -> Option<&mut PgConnection> {
        match &mut self.inner {
            Inner::Postgres(transaction) => Some(&mut **transaction),
            #[cfg(feature = "sqlite")]
            Inner::Sqlite { .. } => None,
        }
    }

    /// The connection, if the engine runs on SQLite.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite(&mut self) -> Option<&mut SqliteConnection> {
        match &mut self.inner {
            Inner::Sqlite { transaction, .. } => Some(&mut **transaction),
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => None,
        }
    }
}
