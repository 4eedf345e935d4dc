//! What tickmark's PostgreSQL statements rely on, pinned by tickmark rather
//! than taken from the session: READ COMMITTED (crates/tickmark-postgres/src/
//! isolation.rs) and each function's `search_path` (migration 0011).
//! PostgreSQL only.

use sqlx::{Connection, PgConnection};
use tickmark::store::postgres::PostgresStore;
use tickmark::Store;

use super::{engine, order_paid};
use crate::conformance::admin::three_steps;
use crate::TestDb;

async fn isolation_of(conn: &mut PgConnection) -> String {
    sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(conn)
        .await
        .expect("SHOW transaction_isolation")
}

/// The store's statements and transactions, and a step's transaction, run
/// at READ COMMITTED whatever the connection's default (`db.url` may set
/// another; `session_default` is what it sets).
pub async fn the_store_reads_committed_whatever_the_sessions_default(
    db: TestDb,
    session_default: &str,
) {
    let mut raw = PgConnection::connect(&db.url).await.unwrap();
    assert_eq!(
        isolation_of(&mut raw).await,
        session_default,
        "a plain connection from the URL has the URL's default"
    );
    let _ = raw.close().await;

    let store = PostgresStore::connect(&db.url).await.unwrap();
    let mut pooled = store.pool().acquire().await.unwrap();
    assert_eq!(isolation_of(&mut pooled).await, "read committed");
    drop(pooled);
    let mut transaction = store.step_transaction_begin().await.unwrap();
    let conn = transaction.postgres().expect("a PostgreSQL transaction");
    assert_eq!(isolation_of(conn).await, "read committed");
}

/// Every function of tickmark's schema finds tickmark's tables in that
/// schema, and pg_catalog's built-ins first (migration 0011); except an
/// immutable SQL expression that reads no table and names each operator
/// by its schema (`tickmark_rank`, migration 0019: settings would stop
/// PostgreSQL from inlining it into every write of a queue row).
pub async fn every_function_pins_its_search_path(db: TestDb) {
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let functions: Vec<(String, Option<Vec<String>>)> = sqlx::query_as(
        "SELECT p.proname::text, p.proconfig FROM pg_proc AS p
         JOIN pg_namespace AS n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema()
           AND NOT (p.provolatile = 'i'
                    AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql')
                    AND p.prosrc !~* '\\m(from|tickmark_\\w+)\\M'
                    AND p.prosrc !~ '[-+*/]\\s*[(''a-z0-9]'
                    AND p.prosrc ~ 'OPERATOR\\(pg_catalog\\.')
         ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let names: Vec<&str> = functions.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        names.contains(&"tickmark_claim") && names.contains(&"tickmark_key_hash"),
        "the schema's functions: {names:?}"
    );
    let pinned = format!("search_path=pg_catalog, {schema}, pg_temp");
    for (name, config) in &functions {
        let config = config.as_deref().unwrap_or_default();
        assert!(
            config.iter().any(|setting| setting == &pinned),
            "{name} must pin `{pinned}`; its settings: {config:?}"
        );
    }
}

/// A session that moved its `search_path` away from tickmark's schema (an
/// application sharing the pool, an operator's psql) still claims from
/// tickmark's tables when it calls the claim by its schema's name.
pub async fn the_claim_reads_its_schemas_tables_whatever_the_sessions_search_path(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_elsewhere").await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    sqlx::query("SET search_path = pg_catalog")
        .execute(&mut conn)
        .await
        .unwrap();
    let claimed: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT dedup_key FROM \"{schema}\".tickmark_claim('elsewhere', 10, 30, '{{}}', '{{}}')"
    ))
    .fetch_all(&mut conn)
    .await
    .expect("the claim finds its own schema's tables");
    assert_eq!(claimed, ["evt_elsewhere"]);
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE lease_owner = 'elsewhere'")
            .await,
        1
    );
}
