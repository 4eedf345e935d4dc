//! One source of truth for the schema. The SQL lives in the workspace's
//! `migrations/` (where people and tools such as sqlx-cli look);
//! each backend crate's `migrations` is a symlink to its folder there
//! (`crates/tickmark-postgres/migrations` → `migrations/postgres`), so
//! `sqlx::migrate!` embeds those very files and `cargo package` copies them
//! into the published crate (docs/releasing.md). These tests fail if the symlink is replaced by a copy
//! that could drift, or if what the build embeds is not what the folder holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tickmark_postgres as postgres;
use tickmark_sqlite as sqlite;

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
}

/// Every file under `dir` (following symlinks), by path relative to it.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(root, &path, into);
            } else {
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let relative = path.strip_prefix(root).expect("under root").to_path_buf();
                into.insert(relative, bytes);
            }
        }
    }
    let mut into = BTreeMap::new();
    walk(dir, dir, &mut into);
    into
}

#[test]
fn each_backend_embeds_its_workspace_migrations_through_a_symlink() {
    let root = workspace_root();
    for backend in ["postgres", "sqlite"] {
        let link = root
            .join("crates")
            .join(format!("tickmark-{backend}"))
            .join("migrations");
        let target = std::fs::read_link(&link).unwrap_or_else(|e| {
            panic!(
                "{} must be a symlink to ../../migrations/{backend} (the one copy of the \
                 SQL), not a directory of its own: {e}",
                link.display()
            )
        });
        assert_eq!(
            target,
            Path::new("../../migrations").join(backend),
            "{}",
            link.display()
        );
        let folder = root.join("migrations").join(backend);
        assert_eq!(
            link.canonicalize().expect("the symlink resolves"),
            folder.canonicalize().expect("migrations/<backend>"),
        );
        let embedded = files(&link);
        assert!(
            embedded
                .keys()
                .any(|path| path.extension().is_some_and(|e| e == "sql")),
            "{} holds the backend's .sql files: {:?}",
            link.display(),
            embedded.keys()
        );
        assert_eq!(
            embedded,
            files(&folder),
            "crates/tickmark-{backend}/migrations and migrations/{backend} differ"
        );
    }
}

/// The highest `NNNN_` prefix among the `.sql` files of `migrations/<dir>`.
fn newest_file(dir: &str) -> i64 {
    files(&workspace_root().join("migrations").join(dir))
        .keys()
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .filter_map(|path| path.to_str()?.split_once('_')?.0.parse::<i64>().ok())
        .max()
        .unwrap_or_else(|| panic!("no NNNN_*.sql file in migrations/{dir}"))
}

/// A migration added to the folder but not embedded (a stale build, or
/// `sqlx::migrate!` pointing elsewhere) fails here, not in production.
#[test]
fn the_embedded_schema_is_the_newest_file_of_each_folder() {
    assert_eq!(postgres::schema_version(), newest_file("postgres"));
    assert_eq!(sqlite::schema_version(), newest_file("sqlite"));
}
