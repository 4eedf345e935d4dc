//! One statement, written once, run in the engine's transaction on either
//! backend: a transactional step's SQL that does not care which database the
//! engine runs on.
//!
//! Both backends accept `$1`, `$2`, … placeholders (sqlx binds SQLite's
//! `$N` by its number), and most plain `INSERT`, `UPDATE`, `SELECT` and
//! `CREATE TABLE IF NOT EXISTS` statements mean the same on both. Arguments
//! are kept as [`SqlValue`]s until the backend is known, then bound with
//! sqlx's own encoders: nothing here builds SQL from values.

use super::transaction::{Inner, StepTransaction};

/// A value bound to a [`PortableQuery`] placeholder. Built with `From`:
/// integers, floats, booleans, strings, bytes, and `Option`s of them (`None`
/// is SQL `NULL`).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// SQL `NULL`.
    Null,
    /// A boolean (`BOOLEAN` on PostgreSQL, `0`/`1` on SQLite).
    Bool(bool),
    /// A 64-bit integer (`BIGINT`; PostgreSQL casts it to a narrower column on assignment).
    Int(i64),
    /// A 64-bit float (`DOUBLE PRECISION` / `REAL`).
    Float(f64),
    /// Text.
    Text(String),
    /// Bytes (`BYTEA` / `BLOB`).
    Bytes(Vec<u8>),
}

macro_rules! sql_value_from {
    ($($from:ty => $variant:ident $(as $via:ty)?),* $(,)?) => {$(
        impl From<$from> for SqlValue {
            fn from(value: $from) -> Self {
                SqlValue::$variant((value $(as $via)?).into())
            }
        }
    )*};
}

sql_value_from! {
    bool => Bool,
    i8 => Int, i16 => Int, i32 => Int, i64 => Int,
    u8 => Int, u16 => Int, u32 => Int,
    f32 => Float, f64 => Float,
    String => Text, &str => Text, &String => Text as &str,
    Vec<u8> => Bytes, &[u8] => Bytes,
}

impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(value: Option<T>) -> Self {
        value.map_or(SqlValue::Null, Into::into)
    }
}

/// A statement in SQL that both backends accept, with its arguments, ready
/// to run in a [`StepTransaction`]. Made by [`StepTransaction::query`].
///
/// ```no_run
/// # use tickmark::{StepContext, StepResult};
/// # async fn run(ctx: &mut StepContext<'_>) -> StepResult {
/// let amount = ctx.event().payload["amount"].as_i64().unwrap_or(0);
/// let tx = ctx.transaction()?;
/// tx.query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
///     .bind(amount)
///     .bind("cus_1")
///     .execute()
///     .await?;
/// let (balance,): (i64,) = tx
///     .query("SELECT balance FROM accounts WHERE id = $1")
///     .bind("cus_1")
///     .fetch_one()
///     .await?;
/// # Ok(serde_json::json!({ "balance": balance })) }
/// ```
#[must_use = "a query does nothing until it is executed or fetched"]
#[derive(Debug)]
pub struct PortableQuery<'t> {
    transaction: &'t mut StepTransaction,
    sql: &'t str,
    arguments: Vec<SqlValue>,
}

/// Rows a [`PortableQuery`] can decode on both backends: sqlx's tuples of
/// `i64`, `String`, `bool`, `f64`, `Vec<u8>`, `Option<…>`, or your own
/// `#[derive(sqlx::FromRow)]` struct of such fields. (Built with one backend
/// only, it asks only that backend's decoding.)
pub trait PortableRow: backend::PgRowOf + backend::SqliteRowOf + Send + Unpin {}

impl<T> PortableRow for T where T: backend::PgRowOf + backend::SqliteRowOf + Send + Unpin {}

/// What each backend asks of a row type and of a bound value; a backend that
/// is not compiled in asks nothing.
mod backend {
    /// Decodable from a PostgreSQL row.
    #[cfg(feature = "postgres")]
    pub trait PgRowOf: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> {}
    #[cfg(feature = "postgres")]
    impl<T> PgRowOf for T where T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> {}
    /// PostgreSQL is not compiled in: nothing to ask.
    #[cfg(not(feature = "postgres"))]
    pub trait PgRowOf {}
    #[cfg(not(feature = "postgres"))]
    impl<T> PgRowOf for T {}

    /// Decodable from a SQLite row.
    #[cfg(feature = "sqlite")]
    pub trait SqliteRowOf: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow> {}
    #[cfg(feature = "sqlite")]
    impl<T> SqliteRowOf for T where T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow> {}
    /// SQLite is not compiled in: nothing to ask.
    #[cfg(not(feature = "sqlite"))]
    pub trait SqliteRowOf {}
    #[cfg(not(feature = "sqlite"))]
    impl<T> SqliteRowOf for T {}

    /// Encodable for PostgreSQL.
    #[cfg(feature = "postgres")]
    pub trait PgValue:
        for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>
    {
    }
    #[cfg(feature = "postgres")]
    impl<V> PgValue for V where V: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> {}
    #[cfg(not(feature = "postgres"))]
    pub trait PgValue {}
    #[cfg(not(feature = "postgres"))]
    impl<V> PgValue for V {}

    /// Encodable for SQLite.
    #[cfg(feature = "sqlite")]
    pub trait SqliteValue:
        for<'q> sqlx::Encode<'q, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>
    {
    }
    #[cfg(feature = "sqlite")]
    impl<V> SqliteValue for V where V: for<'q> sqlx::Encode<'q, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> {}
    #[cfg(not(feature = "sqlite"))]
    pub trait SqliteValue {}
    #[cfg(not(feature = "sqlite"))]
    impl<V> SqliteValue for V {}
}

impl StepTransaction {
    /// A statement in SQL both backends accept (`$1`, `$2`, … placeholders),
    /// to run in this transaction: bind its arguments, then `execute()` or
    /// `fetch_one()` / `fetch_optional()` / `fetch_all()`.
    pub fn query<'t>(&'t mut self, sql: &'t str) -> PortableQuery<'t> {
        PortableQuery::new(self, sql)
    }
}

impl<'t> PortableQuery<'t> {
    fn new(transaction: &'t mut StepTransaction, sql: &'t str) -> Self {
        Self {
            transaction,
            sql,
            arguments: Vec::new(),
        }
    }

    /// Bind the next placeholder (`$1`, then `$2`, …).
    pub fn bind(mut self, value: impl Into<SqlValue>) -> Self {
        self.arguments.push(value.into());
        self
    }

    /// Run the statement; returns how many rows it changed.
    pub async fn execute(self) -> Result<u64, sqlx::Error> {
        match *self.transaction.inner_mut() {
            #[cfg(feature = "postgres")]
            Inner::Postgres(ref mut tx) => {
                let query = bind_all(sqlx::query(self.sql), self.arguments);
                Ok(query.execute(&mut **tx).await?.rows_affected())
            }
            #[cfg(feature = "sqlite")]
            Inner::Sqlite {
                ref mut transaction,
                ..
            } => {
                let query = bind_all(sqlx::query(self.sql), self.arguments);
                Ok(query.execute(&mut **transaction).await?.rows_affected())
            }
        }
    }

    /// Run the statement and decode its only row (an error if there is none).
    pub async fn fetch_one<T: PortableRow>(self) -> Result<T, sqlx::Error> {
        self.fetch_optional().await?.ok_or(sqlx::Error::RowNotFound)
    }

    /// Run the statement and decode its first row, if any.
    pub async fn fetch_optional<T: PortableRow>(self) -> Result<Option<T>, sqlx::Error> {
        match *self.transaction.inner_mut() {
            #[cfg(feature = "postgres")]
            Inner::Postgres(ref mut tx) => {
                let query = bind_all(sqlx::query_as::<_, T>(self.sql), self.arguments);
                query.fetch_optional(&mut **tx).await
            }
            #[cfg(feature = "sqlite")]
            Inner::Sqlite {
                ref mut transaction,
                ..
            } => {
                let query = bind_all(sqlx::query_as::<_, T>(self.sql), self.arguments);
                query.fetch_optional(&mut **transaction).await
            }
        }
    }

    /// Run the statement and decode every row.
    pub async fn fetch_all<T: PortableRow>(self) -> Result<Vec<T>, sqlx::Error> {
        match *self.transaction.inner_mut() {
            #[cfg(feature = "postgres")]
            Inner::Postgres(ref mut tx) => {
                let query = bind_all(sqlx::query_as::<_, T>(self.sql), self.arguments);
                query.fetch_all(&mut **tx).await
            }
            #[cfg(feature = "sqlite")]
            Inner::Sqlite {
                ref mut transaction,
                ..
            } => {
                let query = bind_all(sqlx::query_as::<_, T>(self.sql), self.arguments);
                query.fetch_all(&mut **transaction).await
            }
        }
    }
}

/// Binds every argument with the backend's own encoder. Generic over the
/// query shape (`Query` and `QueryAs`) and the database, so each backend gets
/// the same arguments in the same order.
fn bind_all<Q: Bindable>(mut query: Q, arguments: Vec<SqlValue>) -> Q {
    for argument in arguments {
        query = match argument {
            SqlValue::Null => query.bind_value(None::<i64>),
            SqlValue::Bool(value) => query.bind_value(value),
            SqlValue::Int(value) => query.bind_value(value),
            SqlValue::Float(value) => query.bind_value(value),
            SqlValue::Text(value) => query.bind_value(value),
            SqlValue::Bytes(value) => query.bind_value(value),
        };
    }
    query
}

/// What `bind_all` needs of a sqlx query: `.bind()` for every type a
/// [`SqlValue`] holds.
trait Bindable: Sized {
    fn bind_value<V>(self, value: V) -> Self
    where
        V: BindableValue;
}

/// The value types a [`SqlValue`] holds, encodable on every backend built in.
trait BindableValue: backend::PgValue + backend::SqliteValue + Send + 'static {}

impl<V> BindableValue for V where V: backend::PgValue + backend::SqliteValue + Send + 'static {}

#[cfg(feature = "postgres")]
impl<'q> Bindable for sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    fn bind_value<V: BindableValue>(self, value: V) -> Self {
        self.bind(value)
    }
}

#[cfg(feature = "sqlite")]
impl<'q> Bindable for sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    fn bind_value<V: BindableValue>(self, value: V) -> Self {
        self.bind(value)
    }
}

#[cfg(feature = "postgres")]
impl<'q, T> Bindable for sqlx::query::QueryAs<'q, sqlx::Postgres, T, sqlx::postgres::PgArguments> {
    fn bind_value<V: BindableValue>(self, value: V) -> Self {
        self.bind(value)
    }
}

#[cfg(feature = "sqlite")]
impl<'q, T> Bindable
    for sqlx::query::QueryAs<'q, sqlx::Sqlite, T, sqlx::sqlite::SqliteArguments<'q>>
{
    fn bind_value<V: BindableValue>(self, value: V) -> Self {
        self.bind(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_convert_from_plain_rust_types() {
        assert_eq!(SqlValue::from(7_i32), SqlValue::Int(7));
        assert_eq!(SqlValue::from("a"), SqlValue::Text("a".into()));
        assert_eq!(SqlValue::from(None::<i64>), SqlValue::Null);
        assert_eq!(SqlValue::from(Some(true)), SqlValue::Bool(true));
        assert_eq!(SqlValue::from(&b"x"[..]), SqlValue::Bytes(vec![b'x']));
    }
}
