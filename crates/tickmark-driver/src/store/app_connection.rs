//! The application's own connection, in its own transaction, for
//! `Engine::accept_in`: tickmark writes the
//! inbox row there, and it commits (or rolls back) with the application's
//! business write.

use std::marker::PhantomData;

/// A connection of the application's, usually inside its transaction, that
/// `Engine::accept_in` records an event on.
/// Made from `&mut sqlx::Transaction<'_, Postgres>` or `&mut PgConnection`
/// (feature `postgres`), `&mut sqlx::Transaction<'_, Sqlite>` or
/// `&mut SqliteConnection` (feature `sqlite`): pass `&mut tx`.
#[derive(Debug)]
pub struct AppConnection<'c> {
    #[doc(hidden)]
    pub inner: Inner<'c>,
}

#[derive(Debug)]
#[doc(hidden)]
pub enum Inner<'c> {
    #[cfg(feature = "postgres")]
    #[doc(hidden)]
    Postgres(&'c mut sqlx::PgConnection),
    #[cfg(feature = "sqlite")]
    #[doc(hidden)]
    Sqlite(&'c mut sqlx::SqliteConnection),
    /// Keeps the lifetime when no backend is built in; never made.
    #[allow(dead_code)]
    Unreachable(std::convert::Infallible, PhantomData<&'c mut ()>),
}

impl AppConnection<'_> {
    /// Which backend the connection is on.
    pub fn backend(&self) -> super::Backend {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => super::Backend::Postgres,
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(_) => super::Backend::Sqlite,
            Inner::Unreachable(never, _) => match *never {},
        }
    }
}

#[cfg(feature = "postgres")]
impl<'c> From<&'c mut sqlx::PgConnection> for AppConnection<'c> {
    fn from(conn: &'c mut sqlx::PgConnection) -> Self {
        AppConnection {
            inner: Inner::Postgres(conn),
        }
    }
}

#[cfg(feature = "postgres")]
impl<'c> From<&'c mut sqlx::Transaction<'_, sqlx::Postgres>> for AppConnection<'c> {
    fn from(tx: &'c mut sqlx::Transaction<'_, sqlx::Postgres>) -> Self {
        AppConnection::from(&mut **tx)
    }
}

#[cfg(feature = "sqlite")]
impl<'c> From<&'c mut sqlx::SqliteConnection> for AppConnection<'c> {
    fn from(conn: &'c mut sqlx::SqliteConnection) -> Self {
        AppConnection {
            inner: Inner::Sqlite(conn),
        }
    }
}

#[cfg(feature = "sqlite")]
impl<'c> From<&'c mut sqlx::Transaction<'_, sqlx::Sqlite>> for AppConnection<'c> {
    fn from(tx: &'c mut sqlx::Transaction<'_, sqlx::Sqlite>) -> Self {
        AppConnection::from(&mut **tx)
    }
}
