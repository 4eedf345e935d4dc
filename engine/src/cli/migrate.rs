//! `tickmark migrate`: apply tickmark's schema.

use serde::Serialize;

use super::{Failure, Output};
use crate::store::Store;

pub(crate) const LONG_ABOUT: &str = "\
Apply tickmark's schema to the database (tables, indexes, the step-status view).

Idempotent: migrations already applied are skipped. Connecting already migrates — every
tickmark process (worker, receiver, this command line) does it at start — so this
command is for creating an empty database ahead of time (a new SQLite file is created)
or checking that the schema is current, e.g. in a deploy step before new workers start.";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  tickmark migrate --database-url sqlite://var/tickmark.db    # creates the file if missing
  DATABASE_URL=postgres://deploy@db.internal/shop tickmark migrate --json";

#[derive(Serialize)]
struct Migrated {
    backend: String,
    schema: &'static str,
}

pub(crate) async fn run(store: &dyn Store, out: Output) -> Result<(), Failure> {
    store.migrate().await?;
    let migrated = Migrated {
        backend: store.backend().to_string(),
        schema: "current",
    };
    out.emit(&migrated, || {
        format!(
            "schema is current on {} (connecting applies it too: every tickmark process \
             migrates at start)\n",
            migrated.backend
        )
    })
}
