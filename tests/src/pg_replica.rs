//! A throwaway primary and its streaming-replication standby, for failover
//! tests: kill the primary, promote the standby, and see what survived.
//!
//! Both are [`PgCluster`]s of the test's own (temp dirs, free loopback
//! ports, removed on drop; never the machine's shared server). The primary
//! runs with `wal_level=replica` and, in [`Replication::Sync`] mode,
//! `synchronous_standby_names` naming the standby, so a commit returns only
//! once the standby has flushed it. The standby is a `pg_basebackup -R` of
//! it, streaming under `application_name` [`STANDBY_NAME`]. The primary's
//! replication settings are server options, not files, so the standby (a
//! copy of the files) does not inherit them: promoted, it commits alone.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use tickmark_tests::pg_replica::{ReplicaPair, Replication};
//! let mut pair = ReplicaPair::start(Replication::Sync).await?;
//! let url = pair.url("postgres"); // postgres://postgres@h:p1,h:p2/postgres?target_session_attrs=read-write
//! pair.kill_primary().await?; // pg_ctl stop -m immediate
//! pair.promote().await?; // pg_ctl promote: the standby takes writes
//! # let _ = url; Ok(()) }
//! ```

use std::io;
use std::io::Write;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::pg_cluster::{server_binaries, PgCluster, StopMode};

/// The standby's `application_name`, which `synchronous_standby_names` names.
pub const STANDBY_NAME: &str = "tickmark_standby";

/// How the primary waits for its standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = tickmark_standby`: a commit returns once
    /// the standby has flushed its WAL (`synchronous_commit = on`).
    Sync,
    /// No synchronous standby: a commit returns once the primary has it;
    /// the standby follows as fast as it can.
    Async,
}

impl Replication {
    /// `sync` or `async`.
    pub fn as_str(self) -> &'static str {
        match self {
            Replication::Sync => "sync",
            Replication::Async => "async",
        }
    }
}

/// A primary and its standby.
#[derive(Debug)]
pub struct ReplicaPair {
    /// The primary, until it is killed.
    pub primary: PgCluster,
    /// The standby, a primary once promoted.
    pub standby: PgCluster,
    replication: Replication,
}

impl ReplicaPair {
    /// A pair for the running test, or `None` when this machine has no
    /// PostgreSQL server binaries (the skip is recorded, and fails the test
    /// under `CI=true`). Panics when the binaries are there but the pair
    /// does not start.
    pub async fn start_or_skip(replication: Replication) -> Option<ReplicaPair> {
        if let Err(missing) = server_binaries() {
            crate::skip::record(&crate::skip::current_test(), &missing.to_string());
            return None;
        }
        Some(
            ReplicaPair::start(replication)
                .await
                .unwrap_or_else(|e| panic!("start a throwaway primary and standby: {e}")),
        )
    }

    /// `initdb` and start a primary, copy it with `pg_basebackup`, start the
    /// copy as its standby, and wait until it streams (as the synchronous
    /// standby in [`Replication::Sync`] mode).
    pub async fn start(replication: Replication) -> io::Result<ReplicaPair> {
        let mut options = "-c wal_level=replica -c max_wal_senders=5".to_owned();
        if replication == Replication::Sync {
            options.push_str(&format!(" -c synchronous_standby_names={STANDBY_NAME}"));
        }
        let primary = PgCluster::start_with(&options).await?;
        // initdb's pg_hba.conf (`-A trust`) already lets 127.0.0.1 replicate.
        let mut standby = PgCluster::unstarted("-c hot_standby=on")?;
        let data = standby.data_dir();
        let data = data
            .to_str()
            .ok_or_else(|| io::Error::other("the standby's path is not UTF-8"))?;
        let source = format!(
            "host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}",
            primary.port()
        );
        standby
            .run_tool(
                "pg_basebackup",
                &[
                    "-D",
                    data,
                    "-d",
                    &source,
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    "-R",
                    "--no-sync",
                ],
            )
            .await?;
        // `-R` wrote primary_conninfo; say the standby's name explicitly
        // whatever this version of pg_basebackup copied (the last line wins).
        std::fs::OpenOptions::new()
            .append(true)
            .open(standby.data_dir().join("postgresql.auto.conf"))?
            .write_all(format!("primary_conninfo = '{source}'\n").as_bytes())?;
        standby.start_on_a_free_port().await?;
        let pair = ReplicaPair {
            primary,
            standby,
            replication,
        };
        pair.wait_until_streaming().await?;
        Ok(pair)
    }

    /// The replication mode.
    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Both hosts in one URL, as libpq takes it, for database `database`:
    /// `postgres://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>/<database>?target_session_attrs=read-write`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.primary.port(),
            self.standby.port()
        )
    }

    /// Kill the primary as a crash would (`pg_ctl stop -m immediate`: its
    /// processes exit at once, nothing more is sent to the standby).
    pub async fn kill_primary(&mut self) -> io::Result<()> {
        self.primary.stop(StopMode::Immediate).await
    }

    /// Promote the standby (`pg_ctl promote -w`): it returns once the
    /// standby accepts writes.
    pub async fn promote(&mut self) -> io::Result<()> {
        let data = self.standby.data_dir();
        let data = data
            .to_str()
            .ok_or_else(|| io::Error::other("the standby's path is not UTF-8"))?;
        self.standby
            .run_tool("pg_ctl", &["-D", data, "-w", "-t", "60", "promote"])
            .await
    }

    /// Cut the standby off from the primary, as a slow or broken network
    /// would: its WAL receiver stops (`primary_conninfo` emptied and
    /// reloaded). From then on, with [`Replication::Async`] the primary
    /// commits what the standby will never have; with [`Replication::Sync`]
    /// commits wait for the standby and return nothing.
    pub async fn cut_standby(&self) -> io::Result<()> {
        let mut conn = connect(&self.standby.url()).await?;
        for statement in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::query(statement)
                .execute(&mut conn)
                .await
                .map_err(io::Error::other)?;
        }
        let receiving = "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_wal_receiver)";
        wait_for(&mut conn, receiving, "the standby's WAL receiver to stop").await
    }

    /// On the standby: wait until it has replayed all the WAL it received,
    /// so that a query sees every commit it has (a synchronous commit is
    /// flushed on the standby before it returns, and replayed soon after).
    pub async fn wait_for_replay(&self) -> io::Result<()> {
        let mut conn = connect(&self.standby.url()).await?;
        let caught_up =
            "SELECT coalesce(pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn(), true)";
        wait_for(
            &mut conn,
            caught_up,
            "the standby to replay what it received",
        )
        .await
    }

    async fn wait_until_streaming(&self) -> io::Result<()> {
        let mut conn = connect(&self.primary.url()).await?;
        let state = match self.replication {
            Replication::Sync => "sync",
            Replication::Async => "async",
        };
        let streaming = format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = \
             '{STANDBY_NAME}' AND state = 'streaming' AND sync_state = '{state}')"
        );
        wait_for(&mut conn, &streaming, "the standby to stream").await
    }
}

async fn connect(url: &str) -> io::Result<PgConnection> {
    PgConnection::connect(url).await.map_err(io::Error::other)
}

/// Poll `query` (one boolean) every 50 ms until it is true, for at most 60 s.
async fn wait_for(conn: &mut PgConnection, query: &str, what: &str) -> io::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done: bool = sqlx::query_scalar(query)
            .fetch_one(&mut *conn)
            .await
            .map_err(io::Error::other)?;
        if done {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(io::Error::other(format!("gave up waiting for {what}")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
