//! What the database holds, read every `--sample-every`: each table's size
//! with its indexes and TOAST (`pg_total_relation_size`), and its live and
//! dead tuples (`pg_stat_user_tables`), for the tables of the run's schema.

use sqlx::PgPool;

/// One table at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSize {
    /// The table's name (`tickmark_events`, `soak_effects`, …).
    pub name: String,
    /// `pg_total_relation_size`: heap, indexes, TOAST, free space map.
    pub total_bytes: i64,
    /// `pg_indexes_size`: its indexes alone.
    pub index_bytes: i64,
    /// `n_live_tup` (an estimate kept by the statistics system).
    pub live_tuples: i64,
    /// `n_dead_tup`: row versions deleted or updated, not yet vacuumed.
    pub dead_tuples: i64,
}

const SIZES: &str = "SELECT c.relname::text, pg_total_relation_size(c.oid), pg_indexes_size(c.oid),
        coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0)
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname NOT LIKE '\\_sqlx%'
    ORDER BY c.relname";

/// Every table of the connection's schema (sqlx's migration table excepted).
pub async fn table_sizes(pool: &PgPool) -> Result<Vec<TableSize>, sqlx::Error> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(SIZES).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, total_bytes, index_bytes, live_tuples, dead_tuples)| TableSize {
                name,
                total_bytes,
                index_bytes,
                live_tuples,
                dead_tuples,
            },
        )
        .collect())
}

/// Whether a table is one of tickmark's own (the soak's application table is not).
pub fn is_tickmark(name: &str) -> bool {
    name.starts_with("tickmark_")
}
