//! The schema as the migrations leave it, one snapshot per backend
//! (docs/schema.md): `crates/tickmark-postgres/schema.sql` and
//! `crates/tickmark-sqlite/schema.sql`. Each test migrates a fresh database
//! through the store, as a worker does, reads the schema back from the
//! database's catalogs, and compares it with the committed file.
//!
//! The snapshots are generated, never applied. After changing a migration,
//! `TICKMARK_BLESS_SCHEMA=1 cargo test -p tickmark-tests --test it schema_snapshot::`
//! rewrites them; review the change and commit it with the migration.
//!
//! Catalogs rather than `pg_dump`: its output changes with its version
//! (headers, `SET` lines, ordering), and the catalog functions below give
//! the same text for the same schema, sorted by name.

use std::fmt::Write as _;
use std::path::PathBuf;

use sqlx::{Connection, PgConnection, SqliteConnection};
use tickmark::store::postgres::PostgresStore;
use tickmark::store::sqlite::SqliteStore;
use tickmark_tests::db::EmptySchema;

/// Set to `1` to rewrite the snapshots instead of comparing with them.
const BLESS_VAR: &str = "TICKMARK_BLESS_SCHEMA";

/// The command that rewrites the snapshots.
const REGENERATE: &str =
    "TICKMARK_BLESS_SCHEMA=1 cargo test -p tickmark-tests --test it schema_snapshot::";

/// The committed snapshot of `backend` (`postgres` or `sqlite`).
fn snapshot_path(backend: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join(format!("crates/tickmark-{backend}/schema.sql"))
}

/// The opening comment of each snapshot: what it is and how to remake it.
fn header(backend: &str, title: &str, notes: &[&str]) -> String {
    let mut text = format!(
        "-- GENERATED FILE, NOT APPLIED: tickmark's {title} schema as\n\
         -- migrations/{backend}/*.sql leave it. The migrations are the source; this\n\
         -- is their result, read back from a freshly migrated database's catalogs\n\
         -- by tests/tests/it/schema_snapshot.rs, which fails when the two differ.\n\
         -- Regenerate it after changing a migration, and commit it with the migration:\n\
         --   {REGENERATE}\n\
         -- What it holds and why not a dump: docs/schema.md.\n"
    );
    for note in notes {
        text.push_str(&format!("-- {note}\n"));
    }
    text
}

#[tokio::test]
async fn the_postgres_schema_is_the_committed_snapshot() {
    let Some(schema) = EmptySchema::new().await else {
        return;
    };
    let store = PostgresStore::connect(&schema.url)
        .await
        .expect("migrate a fresh PostgreSQL schema");
    store.pool().close().await;
    drop(store);
    let mut conn = PgConnection::connect(&schema.url)
        .await
        .expect("connect to the migrated schema");
    let snapshot = postgres_snapshot(&mut conn).await;
    let _ = conn.close().await;
    check_snapshot("postgres", &snapshot);
}

#[tokio::test]
async fn the_sqlite_schema_is_the_committed_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("tickmark.db").display());
    let store = SqliteStore::connect(&url)
        .await
        .expect("migrate a fresh SQLite file");
    drop(store);
    let mut conn = SqliteConnection::connect(&url)
        .await
        .expect("open the migrated file");
    let snapshot = sqlite_snapshot(&mut conn).await;
    let _ = conn.close().await;
    check_snapshot("sqlite", &snapshot);
}

/// Compare `generated` with the committed snapshot of `backend`, or rewrite
/// it under `TICKMARK_BLESS_SCHEMA=1`.
fn check_snapshot(backend: &str, generated: &str) {
    let path = snapshot_path(backend);
    if std::env::var(BLESS_VAR).is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("create its directory");
        std::fs::write(&path, generated)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("rewrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the {backend} schema snapshot {}: {e}\nGenerate it:\n  {REGENERATE}",
            path.display()
        )
    });
    if committed != generated {
        panic!(
            "the {backend} schema the migrations leave differs from {} \
             (- committed, + migrated):\n{}\n\
             If the migrations are right, regenerate the snapshot and commit it:\n  {REGENERATE}",
            path.display(),
            first_hunk(&committed, generated),
        );
    }
}

/// The first stretch of lines where `old` and `new` differ, as one hunk of
/// a unified diff: the common lines around it cut away, at most a screenful.
fn first_hunk(old: &str, new: &str) -> String {
    const CONTEXT: usize = 3;
    const MAX_LINES: usize = 20;
    let old: Vec<&str> = old.lines().collect();
    let new: Vec<&str> = new.lines().collect();
    let start = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let common_tail = old[start..]
        .iter()
        .rev()
        .zip(new[start..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let removed = &old[start..old.len() - common_tail];
    let added = &new[start..new.len() - common_tail];
    let mut hunk = format!("@@ line {} @@\n", start + 1);
    for line in &old[start.saturating_sub(CONTEXT)..start] {
        let _ = writeln!(hunk, " {line}");
    }
    for (sign, lines) in [('-', removed), ('+', added)] {
        for line in lines.iter().take(MAX_LINES) {
            let _ = writeln!(hunk, "{sign}{line}");
        }
        if lines.len() > MAX_LINES {
            let _ = writeln!(hunk, "{sign}… {} more lines", lines.len() - MAX_LINES);
        }
    }
    if removed.is_empty() && added.is_empty() {
        hunk.push_str(" (the same lines: only line endings or the final newline differ)\n");
    }
    let after = old.len() - common_tail;
    for line in old[after..].iter().take(CONTEXT) {
        let _ = writeln!(hunk, " {line}");
    }
    hunk
}

/// The PostgreSQL schema of `conn`'s `current_schema()`, read from the
/// catalogs: tables with their columns and constraints, indexes,
/// sequences, views, functions, triggers and types, each kind sorted by
/// name (byte order). The schema's own name, random per test, is written
/// `<schema>`, and the qualifier `<schema>.` is left out, as the migrations
/// leave it out.
async fn postgres_snapshot(conn: &mut PgConnection) -> String {
    let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(&mut *conn)
        .await
        .expect("the current schema");
    let mut out = header(
        "postgres",
        "PostgreSQL",
        &[
            "The schema's name is written <schema>: tickmark's objects live in the",
            "connection's search_path schema. Owners and privileges are left out.",
            "tickmark_migrations is the migration history, created by tickmark's",
            "migrator rather than by a migration: its shape is listed, its rows are not.",
        ],
    );

    let mut entries = Vec::new();
    let tables: Vec<(String, Option<String>)> = fetch(
        conn,
        "SELECT c.relname::text, array_to_string(c.reloptions, ', ') FROM pg_class AS c
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
         ORDER BY c.relname COLLATE \"C\"",
    )
    .await;
    let columns: Vec<Column> = fetch(
        conn,
        "SELECT c.relname::text AS table_name, a.attname::text AS name,
                format_type(a.atttypid, a.atttypmod) AS type_name, a.attnotnull AS not_null,
                pg_get_expr(d.adbin, d.adrelid) AS default_expr,
                a.attidentity::text AS identity, a.attgenerated::text AS generated
         FROM pg_attribute AS a
         JOIN pg_class AS c ON c.oid = a.attrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
           AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY c.relname COLLATE \"C\", a.attnum",
    )
    .await;
    // Not-null constraints are the columns' NOT NULL (PostgreSQL 18 lists
    // them in pg_constraint too, older servers do not).
    let constraints: Vec<(String, String, String)> = fetch(
        conn,
        "SELECT c.relname::text, k.conname::text, pg_get_constraintdef(k.oid)
         FROM pg_constraint AS k
         JOIN pg_class AS c ON c.oid = k.conrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND k.contype <> 'n'
         ORDER BY c.relname COLLATE \"C\", k.conname COLLATE \"C\"",
    )
    .await;
    for (table, options) in &tables {
        let mut lines = Vec::new();
        for column in columns.iter().filter(|c| &c.table_name == table) {
            let mut line = format!("    {} {}", column.name, column.type_name);
            if column.not_null {
                line.push_str(" NOT NULL");
            }
            let default = &column.default_expr;
            match (default, column.generated.as_str(), column.identity.as_str()) {
                (Some(expr), "s", _) => {
                    line.push_str(&format!(" GENERATED ALWAYS AS ({expr}) STORED"))
                }
                (Some(expr), _, _) => line.push_str(&format!(" DEFAULT {expr}")),
                (None, _, "a") => line.push_str(" GENERATED ALWAYS AS IDENTITY"),
                (None, _, "d") => line.push_str(" GENERATED BY DEFAULT AS IDENTITY"),
                _ => {}
            }
            lines.push(line);
        }
        for (_, name, definition) in constraints.iter().filter(|c| &c.0 == table) {
            lines.push(format!("    CONSTRAINT {name} {definition}"));
        }
        // Storage parameters (a fillfactor) are part of a table's definition.
        let with = options
            .as_deref()
            .map(|options| format!(" WITH ({options})"))
            .unwrap_or_default();
        entries.push(format!(
            "CREATE TABLE {table} (\n{}\n){with};",
            lines.join(",\n")
        ));
    }

    section(&mut out, "Tables", &entries, true);

    let indexes: Vec<(String,)> = fetch(
        conn,
        "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()
         ORDER BY tablename COLLATE \"C\", indexname COLLATE \"C\"",
    )
    .await;
    let entries: Vec<String> = indexes.iter().map(|(d,)| format!("{d};")).collect();
    section(
        &mut out,
        "Indexes (with those behind the constraints above)",
        &entries,
        false,
    );

    let sequences: Vec<Sequence> = fetch(
        conn,
        "SELECT c.relname::text AS name, format_type(s.seqtypid, NULL) AS type_name,
                s.seqstart AS start, s.seqincrement AS increment, s.seqmin AS min,
                s.seqmax AS max, s.seqcache AS cache, s.seqcycle AS cycle,
                (SELECT t.relname || '.' || a.attname FROM pg_depend AS d
                 JOIN pg_class AS t ON t.oid = d.refobjid
                 JOIN pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
                AS owned_by
         FROM pg_sequence AS s
         JOIN pg_class AS c ON c.oid = s.seqrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema()
         ORDER BY c.relname COLLATE \"C\"",
    )
    .await;
    let entries: Vec<String> = sequences
        .iter()
        .map(|s| {
            let cycle = if s.cycle { " CYCLE" } else { "" };
            let owner = s.owned_by.as_ref().map(|column| format!(" OWNED BY {column}"));
            format!(
                "CREATE SEQUENCE {} AS {} START {} INCREMENT {} MINVALUE {} MAXVALUE {} CACHE {}{cycle}{};",
                s.name,
                s.type_name,
                s.start,
                s.increment,
                s.min,
                s.max,
                s.cache,
                owner.unwrap_or_default()
            )
        })
        .collect();
    section(&mut out, "Sequences", &entries, false);

    let views: Vec<(String, String, String)> = fetch(
        conn,
        "SELECT c.relname::text,
                CASE c.relkind WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'VIEW' END,
                pg_get_viewdef(c.oid, true)
         FROM pg_class AS c
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind IN ('v', 'm')
         ORDER BY c.relname COLLATE \"C\"",
    )
    .await;
    let entries: Vec<String> = views
        .iter()
        .map(|(name, kind, definition)| {
            format!("CREATE {kind} {name} AS\n{}", definition.trim_end())
        })
        .collect();
    section(&mut out, "Views", &entries, true);

    let functions: Vec<(String,)> = fetch(
        conn,
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc AS p
         JOIN pg_namespace AS n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema() AND p.prokind <> 'a'
         ORDER BY p.proname COLLATE \"C\",
                  pg_get_function_identity_arguments(p.oid) COLLATE \"C\"",
    )
    .await;
    let entries: Vec<String> = functions
        .iter()
        .map(|(definition,)| format!("{};", definition.trim_end()))
        .collect();
    section(&mut out, "Functions", &entries, true);

    let triggers: Vec<(String,)> = fetch(
        conn,
        "SELECT pg_get_triggerdef(t.oid, true) FROM pg_trigger AS t
         JOIN pg_class AS c ON c.oid = t.tgrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND NOT t.tgisinternal
         ORDER BY c.relname COLLATE \"C\", t.tgname COLLATE \"C\"",
    )
    .await;
    let entries: Vec<String> = triggers.iter().map(|(d,)| format!("{d};")).collect();
    section(&mut out, "Triggers", &entries, false);

    // Types of their own (enums, domains, ranges, composites), not the row
    // types every table and view has.
    let types: Vec<(String, String, Option<String>)> = fetch(
        conn,
        "SELECT t.typname::text, t.typtype::text,
                CASE t.typtype
                    WHEN 'e' THEN (SELECT string_agg(quote_literal(e.enumlabel), ', '
                                                     ORDER BY e.enumsortorder)
                                   FROM pg_enum AS e WHERE e.enumtypid = t.oid)
                    WHEN 'd' THEN format_type(t.typbasetype, t.typtypmod)
                END
         FROM pg_type AS t
         JOIN pg_namespace AS n ON n.oid = t.typnamespace
         LEFT JOIN pg_class AS c ON c.oid = t.typrelid
         WHERE n.nspname = current_schema() AND t.typelem = 0
           AND (c.oid IS NULL OR c.relkind = 'c')
         ORDER BY t.typname COLLATE \"C\"",
    )
    .await;
    let entries: Vec<String> = types
        .iter()
        .map(|(name, kind, detail)| {
            let detail = detail.as_deref().unwrap_or_default();
            match kind.as_str() {
                "e" => format!("CREATE TYPE {name} AS ENUM ({detail});"),
                "d" => format!("CREATE DOMAIN {name} AS {detail};"),
                other => format!("-- type {name} (pg_type.typtype '{other}')"),
            }
        })
        .collect();
    section(&mut out, "Types", &entries, false);

    out.replace(&format!("{schema}."), "")
        .replace(&schema, "<schema>")
}

/// The SQLite schema of `conn`'s main database: each table, index, view and
/// trigger's statement as `sqlite_master` keeps it (SQLite rewrites it on
/// `ALTER TABLE`), each kind sorted by name; SQLite's own objects
/// (`sqlite_sequence`, the automatic indexes of UNIQUE and PRIMARY KEY) left
/// out.
async fn sqlite_snapshot(conn: &mut SqliteConnection) -> String {
    let mut out = header(
        "sqlite",
        "SQLite",
        &[
            "SQLite keeps each object's statement as written (comments included) and",
            "rewrites it on ALTER TABLE. tickmark_migrations is the migration history,",
            "created by tickmark's migrator rather than by a migration: its shape is",
            "listed, its rows are not.",
        ],
    );
    for (kind, heading) in [
        ("table", "Tables"),
        ("index", "Indexes"),
        ("view", "Views"),
        ("trigger", "Triggers"),
    ] {
        let statements: Vec<(String,)> = sqlx::query_as(
            "SELECT sql FROM main.sqlite_master
             WHERE type = ?1 AND sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
             ORDER BY name COLLATE BINARY",
        )
        .bind(kind)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("read the {kind}s from sqlite_master: {e}"));
        let entries: Vec<String> = statements
            .iter()
            .map(|(sql,)| format!("{};", sql.trim_end()))
            .collect();
        section(&mut out, heading, &entries, true);
    }
    out
}

/// A column of a table, from `pg_attribute` (and `pg_attrdef`).
#[derive(sqlx::FromRow)]
struct Column {
    table_name: String,
    name: String,
    type_name: String,
    not_null: bool,
    /// The default, or the expression of a generated column.
    default_expr: Option<String>,
    /// `a` (ALWAYS) or `d` (BY DEFAULT) for an identity column, else empty.
    identity: String,
    /// `s` for a stored generated column, else empty.
    generated: String,
}

/// A sequence, from `pg_sequence`, and the column that owns it if any.
#[derive(sqlx::FromRow)]
struct Sequence {
    name: String,
    type_name: String,
    start: i64,
    increment: i64,
    min: i64,
    max: i64,
    cache: i64,
    cycle: bool,
    owned_by: Option<String>,
}

/// Append a `-- heading` and its entries (`-- (none)` when there are none),
/// a blank line between entries when `spaced`.
fn section(out: &mut String, heading: &str, entries: &[String], spaced: bool) {
    let _ = write!(out, "\n-- {heading}\n\n");
    if entries.is_empty() {
        out.push_str("-- (none)\n");
    }
    let separator = if spaced { "\n\n" } else { "\n" };
    out.push_str(&entries.join(separator));
    if !entries.is_empty() {
        out.push('\n');
    }
}

/// All rows of a catalog query, which must succeed.
async fn fetch<T>(conn: &mut PgConnection, sql: &'static str) -> Vec<T>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(sql)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("catalog query failed: {e}\n{sql}"))
}
