//! [`per_backend!`](crate::per_backend!): one test per case and backend, the
//! one way the integration tests stamp a case out for SQLite and PostgreSQL.

/// The backend, for [`per_backend!`](crate::per_backend!)'s expansion in
/// crates that do not name `tickmark` themselves.
#[doc(hidden)]
pub use tickmark::Backend as __Backend;

/// Stamp out one `#[tokio::test]` per case and backend: the tests of module
/// `sqlite` and module `postgres`, each calling the case, an `async fn` of
/// the invoking module, with what the form below gives it.
///
/// ```text
/// // `async fn case(db: TestDb)`, on a fresh database; a backend that is
/// // not there skips (TestDb::new). Tests `sqlite::case`, `postgres::case`.
/// per_backend!(fresh_db => [case, other_case]);
///
/// // `async fn case(backend: Backend)`: the case makes its own database.
/// per_backend!(backend => [case, other_case]);
///
/// // `async fn case(backend: Backend, transport: Transport)`, once per
/// // module listed: tests `sqlite::in_process::case`, `sqlite::socket::case`, …
/// per_backend!(backend, in_process: Transport::InProcess, socket: Transport::Socket => [case]);
///
/// // One backend: each case on a database of its own that `$db` (an
/// // `Option<TestDb>` future, evaluated per test) makes, as tests of the
/// // invoking module itself: the same cases on a database set up
/// // differently (through PgBouncer, REPEATABLE READ). Only the
/// // `module::case` and `name => function()` forms: a plain `case` would
/// // name the test itself.
/// per_backend!(db from TestDb::through_pgbouncer(…) => [inbox::case]);
/// ```
///
/// A case is written three ways:
/// - `case`: the test `case` calls `case(…)`;
/// - `module::case`: the test `case` calls `module::case(…)` (the
///   conformance suite's cases: `module` as the invoking module names it);
/// - `test_name => function(arguments)`: the test `test_name` calls
///   `function(arguments, …)`, the form's own arguments last (one function
///   under several names: a provider per test).
///
/// The generated modules see the invoking module's names (`use super::*`),
/// so arguments read as they would where the macro is invoked.
#[macro_export]
macro_rules! per_backend {
    (fresh_db => $cases:tt) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $crate::per_backend!(@tests [super]
                [db: $crate::TestDb::new($crate::per_backend::__Backend::Sqlite)] $cases);
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $crate::per_backend!(@tests [super]
                [db: $crate::TestDb::new($crate::per_backend::__Backend::Postgres)] $cases);
        }
    };
    (backend => $cases:tt) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $crate::per_backend!(@tests [super]
                [$crate::per_backend::__Backend::Sqlite] $cases);
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $crate::per_backend!(@tests [super]
                [$crate::per_backend::__Backend::Postgres] $cases);
        }
    };
    (backend, $($variant:ident: $argument:expr),+ $(,)? => $cases:tt) => {
        mod sqlite {
            $(
                mod $variant {
                    #[allow(unused_imports)]
                    use super::super::*;
                    $crate::per_backend!(@tests [super::super]
                        [$crate::per_backend::__Backend::Sqlite, $argument] $cases);
                }
            )+
        }
        mod postgres {
            $(
                mod $variant {
                    #[allow(unused_imports)]
                    use super::super::*;
                    $crate::per_backend!(@tests [super::super]
                        [$crate::per_backend::__Backend::Postgres, $argument] $cases);
                }
            )+
        }
    };
    (db from $db:expr => $cases:tt) => {
        $crate::per_backend!(@tests [self] [db: $db] $cases);
    };

    // One test per case: `$base` is where the invoking module is, seen from
    // the tests; `[db: …]` makes a database, `[…]` is passed as it is.
    (@tests $base:tt $with:tt [
        $(
            $case:ident $(:: $in_module:ident)?
            $(=> $($function:ident)::+ ($($before:expr),* $(,)?))?
        ),+ $(,)?
    ]) => {
        $(
            $crate::per_backend!(@test $base $with
                $case $(:: $in_module)? $(=> $($function)::+ ($($before),*))?);
        )+
    };
    (@test $base:tt [db: $db:expr] $($case:tt)+) => {
        $crate::per_backend!(@fn $base [db] {
            let Some(db) = $db.await else { return };
        } $($case)+);
    };
    (@test $base:tt [$($argument:expr),+] $($case:tt)+) => {
        $crate::per_backend!(@fn $base [$($argument),+] {} $($case)+);
    };
    (@fn [$($base:tt)*] [$($argument:expr),+] {$($setup:tt)*} $module:ident :: $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $($setup)*
            $($base)*::$module::$case($($argument),+).await;
        }
    };
    (@fn [$($base:tt)*] [$($argument:expr),+] {$($setup:tt)*} $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $($setup)*
            $($base)*::$case($($argument),+).await;
        }
    };
    (@fn [$($base:tt)*] [$($argument:expr),+] {$($setup:tt)*}
        $test:ident => $($function:ident)::+ ($($before:expr),*)) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $($setup)*
            $($base)*::$($function)::+($($before,)* $($argument),+).await;
        }
    };
}
