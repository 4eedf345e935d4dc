//! The `tickmark` binary as an operator installs it (`cargo install`, default
//! features): `--version` names the crate version and the schema version it
//! expects on each backend, and a database migrated by a newer tickmark is
//! refused, on SQLite and on PostgreSQL, with what to do and nothing changed;
//! so is one whose recorded migration was edited.
//!
//! The expected schema versions are read from the migration files in the
//! workspace's `migrations/`, not from the code under test.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tickmark::Backend;
use tickmark_tests::TestDb;

/// The `tickmark` binary, built with its default features (found through
/// Cargo, not guessed).
fn tickmark_binary() -> PathBuf {
    tickmark_tests::cargo_bin("tickmark", "tickmark")
}

/// tickmark's version: every package of the workspace takes
/// `[workspace.package] version`, this test's package too.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
}

/// The highest `NNNN_` prefix among the files of `migrations/<backend>`.
fn newest_migration_file(backend: Backend) -> i64 {
    let dir = workspace_root()
        .join("migrations")
        .join(backend.to_string());
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.split_once('_')?.0.parse::<i64>().ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no NNNN_*.sql migration in {}", dir.display()))
}

/// What one run of `tickmark` did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn tickmark(args: &[&str]) -> Run {
    let output = Command::new(tickmark_binary())
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run tickmark");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn version_names_the_crate_and_the_schema_of_each_backend() {
    let run = tickmark(&["--version"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let expected = format!(
        "tickmark {} (schema: postgres {}, sqlite {})\n",
        VERSION,
        newest_migration_file(Backend::Postgres),
        newest_migration_file(Backend::Sqlite),
    );
    assert_eq!(run.stdout, expected, "{run:?}");
}

/// Record a migration one past what this build knows, as a newer tickmark's
/// `migrate` would have.
async fn migrate_as_a_newer_tickmark(db: &TestDb, version: i64) {
    let checksum = match db.backend() {
        Backend::Postgres => "'\\x00'::bytea",
        Backend::Sqlite => "X'00'",
    };
    let inserted = db
        .probe
        .execute(&format!(
            "INSERT INTO tickmark_migrations (version, description, success, checksum, execution_time) \
             VALUES ({version}, 'from a newer tickmark', TRUE, {checksum}, 0)"
        ))
        .await;
    assert_eq!(inserted, 1);
}

async fn refuses_a_database_migrated_by_a_newer_tickmark(db: TestDb) {
    let backend = db.backend();
    let known = newest_migration_file(backend);

    // The same database, one version behind: migrate succeeds and says which.
    let current = tickmark(&["--database-url", &db.url, "--json", "migrate"]);
    assert_eq!(current.code, Some(0), "{current:?}");
    let current: Value = serde_json::from_str(&current.stdout).expect("one JSON document");
    assert_eq!(current["schema_version"], known);

    let newer = known + 1;
    migrate_as_a_newer_tickmark(&db, newer).await;
    let recorded = "SELECT count(*) FROM tickmark_migrations";
    let before = db.probe.scalar(recorded).await;

    let refused = tickmark(&["--database-url", &db.url, "migrate"]);
    assert_eq!(refused.code, Some(4), "exit 4, refused: {refused:?}");
    assert!(refused.stdout.is_empty(), "{refused:?}");
    for needle in [
        format!("refused: the {backend} database records schema migration {newer}"),
        format!("{backend} schema {known}"),
        "Upgrade this binary".to_owned(),
        "Nothing was changed".to_owned(),
    ] {
        assert!(refused.stderr.contains(&needle), "{needle}: {refused:?}");
    }

    let json = tickmark(&["--database-url", &db.url, "--json", "migrate"]);
    assert_eq!(json.code, Some(4), "{json:?}");
    let error: Value = serde_json::from_str(json.stderr.trim()).expect("a JSON error on stderr");
    assert_eq!(error["error"]["kind"], "refused", "{json:?}");

    assert_eq!(db.probe.scalar(recorded).await, before, "nothing applied");
    let still = format!("SELECT count(*) FROM tickmark_migrations WHERE version = {newer}");
    assert_eq!(db.probe.scalar(&still).await, 1, "the newer record is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_a_database_migrated_by_a_newer_tickmark() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    refuses_a_database_migrated_by_a_newer_tickmark(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_database_migrated_by_a_newer_tickmark() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    refuses_a_database_migrated_by_a_newer_tickmark(db).await;
}

/// A recorded migration whose checksum differs from this binary's (an
/// edited migration file) is refused with what to do, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_a_database_whose_recorded_migration_was_edited() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let edited = db
        .probe
        .execute("UPDATE tickmark_migrations SET checksum = X'00' WHERE version = 1")
        .await;
    assert_eq!(edited, 1);
    let refused = tickmark(&["--database-url", &db.url, "migrate"]);
    assert_eq!(refused.code, Some(4), "exit 4, refused: {refused:?}");
    for needle in [
        "refused: tickmark schema migration 1",
        "was edited",
        "Restore migrations/sqlite/",
    ] {
        assert!(refused.stderr.contains(needle), "{needle}: {refused:?}");
    }
}
