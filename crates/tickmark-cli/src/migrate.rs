//! `tickmark migrate`: apply tickmark's schema; the schema versions this
//! binary knows (`tickmark --version`); and the refusal of a database that a
//! newer tickmark has migrated.

use std::sync::OnceLock;

use serde::Serialize;

use super::{Failure, Output};
use tickmark_driver::store::{Backend, Store};

pub(crate) const LONG_ABOUT: &str = "\
Apply tickmark's schema to the database (tables, indexes, the step-status view).

Idempotent: migrations already applied are skipped. tickmark records them in its own table,
`tickmark_migrations`, never in the `_sqlx_migrations` of the application's own sqlx
migrations; a database migrated by an earlier tickmark has its rows moved over from there
(the application's rows stay). Connecting already migrates — every tickmark process that
opens its own pool (worker, receiver, this command line) does it at start — so this command
is for creating an empty database ahead of time (a new SQLite file is created), for a
deploy step before new workers start, or for an application that hands tickmark its own
pool (`from_pool` does not migrate: run this, or call `tickmark::migrate(&pool)`).

A database migrated by a newer tickmark (it records a migration this binary does not
know) is refused and left as it is: upgrade this binary (`tickmark --version` shows the
schema versions it knows). So is one whose recorded migration differs from this binary's
(an edited migration file).";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  tickmark migrate --database-url sqlite://var/tickmark.db    # creates the file if missing
  DATABASE_URL=postgres://deploy@db.internal/shop tickmark migrate --json";

/// The newest migration this binary applies on `backend` (0 for a backend
/// it was built without).
pub(crate) fn schema_version(backend: Backend) -> i64 {
    schema_version_built(backend).unwrap_or(0)
}

/// The newest migration this binary applies on `backend`, or `None` when it
/// was built without that backend.
fn schema_version_built(backend: Backend) -> Option<i64> {
    match backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres => Some(tickmark_postgres::schema_version()),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => Some(tickmark_sqlite::schema_version()),
        #[allow(unreachable_patterns)] // every backend compiled in is matched above
        _ => None,
    }
}

/// What `tickmark --version` prints after the name: the crate version and the
/// newest migration it knows per backend built in, e.g. `0.1.0 (schema:
/// postgres 8, sqlite 6)`. The backends number their migrations apart, so
/// each is shown.
pub(crate) fn version() -> &'static str {
    // clap wants a `&'static str`; the schema versions are only known at run
    // time (the migrations embedded by `sqlx::migrate!`), so build it once.
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let schemas: Vec<String> = [Backend::Postgres, Backend::Sqlite]
            .into_iter()
            .filter_map(|backend| {
                schema_version_built(backend).map(|version| format!("{backend} {version}"))
            })
            .collect();
        format!(
            "{} (schema: {})",
            env!("CARGO_PKG_VERSION"),
            schemas.join(", ")
        )
    })
}

/// The refusal of the database at `url`, which records migration `applied`
/// that this binary does not know: a newer tickmark migrated it. Nothing was
/// applied (the recorded migrations are checked before any is applied).
pub(crate) fn newer_schema(url: &str, applied: i64) -> Failure {
    // `postgres:` and `postgresql:`, as `open` tells them apart.
    let backend = if url.starts_with("postgres") {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    Failure::Refused(format!(
        "the {backend} database records schema migration {applied}, newer than this tickmark \
         binary knows (tickmark {}, {backend} schema {}): a newer tickmark migrated it. \
         Nothing was changed. Upgrade this binary to the tickmark version your workers run \
         (e.g. `cargo install tickmark --version <that version>`), then run the command again; \
         never roll the schema back by hand",
        env!("CARGO_PKG_VERSION"),
        schema_version(backend),
    ))
}

#[derive(Serialize)]
struct Migrated {
    backend: String,
    schema: &'static str,
    schema_version: i64,
}

pub(crate) async fn run(store: &dyn Store, out: Output) -> Result<(), Failure> {
    store.migrate().await?;
    let backend = store.backend();
    let migrated = Migrated {
        backend: backend.to_string(),
        schema: "current",
        schema_version: schema_version(backend),
    };
    out.emit(&migrated, || {
        format!(
            "schema is current on {} (version {}; connecting applies it too: every tickmark \
             process migrates at start)\n",
            migrated.backend, migrated.schema_version
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_the_crate_and_each_schema() {
        let version = version();
        assert!(version.starts_with(env!("CARGO_PKG_VERSION")), "{version}");
        for backend in [Backend::Postgres, Backend::Sqlite] {
            let known = schema_version(backend);
            assert!(known >= 1, "{backend}: no migration embedded");
            assert!(version.contains(&format!("{backend} {known}")), "{version}");
        }
    }

    #[test]
    fn a_newer_schema_is_refused_with_what_to_do() {
        let failure = newer_schema("sqlite://var/tickmark.db", 99);
        assert_eq!(failure.exit_code(), 4);
        let message = failure.message();
        for needle in ["migration 99", "Upgrade this binary", "Nothing was changed"] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }
}
