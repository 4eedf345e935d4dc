//! The chaos run's database — a throwaway PostgreSQL cluster of its own
//! ([`PgCluster`], never the machine's shared server) or a SQLite file in a
//! temp dir — and the read-only queries that judge the run.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use crate::pg_auto_failover::Formation;
use crate::pg_cluster::PgCluster;
use crate::pg_replica::ReplicaPair;

/// A read-only view of the run's database.
#[derive(Debug, Clone)]
pub enum Judge {
    /// On PostgreSQL.
    Postgres(PgPool),
    /// On SQLite.
    Sqlite(SqlitePool),
}

/// How many rows per state, and the run's re-run figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tallies {
    /// Rows in `tickmark_events`.
    pub events: i64,
    /// Rows in state `done`.
    pub done: i64,
    /// Rows in `pending` or `running`.
    pub active: i64,
    /// Rows in `dead` or `parked`.
    pub stuck: i64,
    /// Σ `tickmark_events.takeovers`: claims that took over an expired lease.
    pub takeovers: i64,
    /// Σ (`attempts` − 1) over done steps in `tickmark_steps`: step runs beyond the first.
    pub reruns: i64,
    /// Done steps.
    pub steps_done: i64,
}

impl Judge {
    /// Connect to `url` (read-mostly: two connections, short timeouts).
    pub async fn connect(url: &str) -> Result<Judge, sqlx::Error> {
        if url.starts_with("sqlite:") {
            let options =
                SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(10));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            Ok(Judge::Sqlite(pool))
        } else {
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(2))
                .connect(url)
                .await?;
            Ok(Judge::Postgres(pool))
        }
    }

    async fn int(&self, sql: &str) -> Result<i64, sqlx::Error> {
        match self {
            Judge::Postgres(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Judge::Sqlite(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
        }
    }

    /// The figures of [`Tallies`].
    pub async fn tallies(&self) -> Result<Tallies, sqlx::Error> {
        Ok(Tallies {
            events: self.int("SELECT count(*) FROM tickmark_events").await?,
            done: self
                .int("SELECT count(*) FROM tickmark_events WHERE state = 'done'")
                .await?,
            active: self
                .int("SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')")
                .await?,
            stuck: self
                .int("SELECT count(*) FROM tickmark_events WHERE state IN ('dead', 'parked')")
                .await?,
            takeovers: self
                .int("SELECT CAST(coalesce(sum(takeovers), 0) AS BIGINT) FROM tickmark_events")
                .await?,
            reruns: self
                .int(
                    "SELECT CAST(coalesce(sum(attempts - 1), 0) AS BIGINT) FROM tickmark_steps \
                     WHERE state = 'done'",
                )
                .await?,
            steps_done: self
                .int("SELECT count(*) FROM tickmark_steps WHERE state = 'done'")
                .await?,
        })
    }

    /// Events that `owner` holds a lease on right now.
    pub async fn held_by(&self, owner: &str) -> Result<Vec<i64>, sqlx::Error> {
        match self {
            Judge::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT id FROM tickmark_events WHERE state = 'running' AND lease_owner = $1",
                )
                .bind(owner)
                .fetch_all(pool)
                .await
            }
            Judge::Sqlite(pool) => {
                sqlx::query_scalar(
                    "SELECT id FROM tickmark_events WHERE state = 'running' AND lease_owner = ?1",
                )
                .bind(owner)
                .fetch_all(pool)
                .await
            }
        }
    }

    /// Of `ids`, those no longer held by `owner` (claimed by another worker,
    /// or no longer running).
    pub async fn released_from(&self, owner: &str, ids: &[i64]) -> Result<Vec<i64>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Integers only: safe to inline, and the same text on both backends.
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT id FROM tickmark_events WHERE id IN ({list}) \
             AND (state <> 'running' OR lease_owner IS NULL OR lease_owner <> '{}')",
            owner.replace('\'', "''")
        );
        match self {
            Judge::Postgres(pool) => sqlx::query_scalar(&sql).fetch_all(pool).await,
            Judge::Sqlite(pool) => sqlx::query_scalar(&sql).fetch_all(pool).await,
        }
    }

    /// Every customer's balance, sorted by customer.
    pub async fn balances(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        const SQL: &str = "SELECT customer, balance FROM accounts ORDER BY customer";
        match self {
            Judge::Postgres(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
            Judge::Sqlite(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
        }
    }

    /// The dedup keys of every accepted Stripe event.
    pub async fn event_ids(&self) -> Result<Vec<String>, sqlx::Error> {
        const SQL: &str = "SELECT dedup_key FROM tickmark_events WHERE source = 'stripe'";
        match self {
            Judge::Postgres(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await,
            Judge::Sqlite(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await,
        }
    }

    /// Point the judge at another server (the promoted standby, after a
    /// failover); connections to the old one are dropped as they fail.
    pub fn repoint(&self, url: &str) -> Result<(), sqlx::Error> {
        if let Judge::Postgres(pool) = self {
            pool.set_connect_options(PgConnectOptions::from_str(url)?);
        }
        Ok(())
    }

    /// Close the pool.
    pub async fn close(&self) {
        match self {
            Judge::Postgres(pool) => pool.close().await,
            Judge::Sqlite(pool) => pool.close().await,
        }
    }
}

/// Where the run's database lives.
#[derive(Debug)]
pub enum ChaosDatabase {
    /// A cluster of the run's own (stopped and removed on drop).
    Postgres(PgCluster),
    /// A primary and its standby (`--failover sync|async`), removed on drop.
    Replicated(ReplicaPair),
    /// A pg_auto_failover formation (`--failover auto`), removed on drop
    /// (boxed: it is much larger than the others).
    AutoFailover(Box<Formation>),
    /// A SQLite file in this temp dir.
    Sqlite(tempfile::TempDir),
}

impl ChaosDatabase {
    /// The URL every node uses (both hosts of a replicated pair, with
    /// `target_session_attrs=read-write`).
    pub fn url(&self) -> String {
        match self {
            ChaosDatabase::Postgres(cluster) => cluster.url(),
            ChaosDatabase::Replicated(pair) => pair.url("postgres"),
            ChaosDatabase::AutoFailover(formation) => formation.url(),
            ChaosDatabase::Sqlite(dir) => {
                format!("sqlite://{}", dir.path().join("chaos.db").display())
            }
        }
    }

    /// The URL the judge uses: one host (the primary, until a failover
    /// repoints it).
    pub fn judge_url(&self) -> String {
        match self {
            ChaosDatabase::Replicated(pair) => pair.primary.url(),
            // node1 is the formation's first primary (Formation::start).
            ChaosDatabase::AutoFailover(formation) => formation.node_url(0),
            _ => self.url(),
        }
    }
}
