//! A pg_auto_failover formation of the test's own: a monitor and two data
//! nodes, so that a failover is decided and carried out by a real HA
//! manager, not by the test (docs/deploying.md, "pg_auto_failover").
//!
//! [`Formation::start`] runs Debian's `pg_autoctl` (packages
//! `pg-auto-failover-cli` and `postgresql-<major>-auto-failover`) with the
//! PostgreSQL server binaries of [`server_binaries`], in a temp dir (given
//! to user `postgres` when running as root: `pg_autoctl` refuses root), on
//! free loopback ports, listening on 127.0.0.1 only, with `--auth trust`
//! and `--no-ssl`. Its configuration and state files go to the temp dir too
//! (`XDG_CONFIG_HOME`, `XDG_DATA_HOME`, `XDG_RUNTIME_DIR`); only the Unix
//! sockets are in PostgreSQL's default directory (`/var/run/postgresql`,
//! one per port, removed with the formation, even after a SIGKILL). Never
//! the machine's shared server.
//!
//! - `pg_autoctl create monitor`, then the monitor's health-check settings
//!   shortened ([`MONITOR_SETTINGS`], in the monitor's own
//!   `postgresql.auto.conf`) so that a failover takes seconds rather than
//!   the best part of a minute, then `pg_autoctl run`;
//! - `pg_autoctl create postgres --run` for `node1` (the first primary),
//!   then for `node2` (a `pg_basebackup` of it, its synchronous standby);
//! - [`Formation::wait_until_primary_and_secondary`] reads
//!   `pg_autoctl show state --json`; [`Formation::synchronous_standby_names`]
//!   checks that the primary waits for the standby.
//!
//! Every `pg_autoctl` process runs in a process group of its own, which
//! holds its sub-processes and the postmaster it supervises.
//! [`Formation::kill_node`] SIGKILLs that group and every child of the
//! postmaster (PostgreSQL's children run in sessions of their own): a
//! machine that dies, keeper and all. Nothing promotes by hand: the monitor
//! notices, and the standby's keeper promotes it.
//! [`Formation::restart_keeper`] starts the dead node's keeper again; it asks
//! the monitor first, is told it was demoted, rewinds (`pg_rewind`) and
//! rejoins as a standby. Dropping the formation SIGKILLs everything it
//! started and removes the temp dir.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::time::Duration;
//! use tickmark_tests::pg_auto_failover::Formation;
//! let mut formation = Formation::start().await?;
//! let url = formation.url(); // postgres://postgres@127.0.0.1:p1,127.0.0.1:p2/postgres?target_session_attrs=read-write&sslmode=prefer
//! let primary = formation.primary().await?;
//! formation.kill_node(primary).await?;
//! formation.wait_until_writable(1 - primary, Duration::from_secs(60)).await?;
//! formation.restart_keeper(primary).await?;
//! formation.wait_until_rejoined(primary, Duration::from_secs(60)).await?;
//! # let _ = url; Ok(()) }
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::pg_cluster::{free_port, postgres_ids, running_as_root, server_binaries};

/// The monitor settings the formation runs with: `(name, test value,
/// pg_auto_failover 2.0's default)`, in milliseconds except the retries.
///
/// With the defaults the monitor marks a dead primary unhealthy after about
/// 20 s (`node_considered_unhealthy_timeout`, once its health checks, every
/// 5 s with a 5 s connect timeout and 2 retries 2 s apart, have failed), and
/// then waits up to `primary_demote_timeout` (30 s) for the old primary to
/// report itself demoted before the standby takes writes: about 50 s from a
/// crash to a writable primary. The test's values make that about 5 s.
pub const MONITOR_SETTINGS: &[(&str, &str, &str)] = &[
    ("pgautofailover.health_check_period", "1000", "5000"),
    ("pgautofailover.health_check_timeout", "1000", "5000"),
    ("pgautofailover.health_check_max_retries", "1", "2"),
    ("pgautofailover.health_check_retry_delay", "500", "2000"),
    (
        "pgautofailover.node_considered_unhealthy_timeout",
        "3000",
        "20000",
    ),
    ("pgautofailover.primary_demote_timeout", "2000", "30000"),
    // No failover is decided in the monitor's first seconds after it starts.
    ("pgautofailover.startup_grace_period", "2000", "10000"),
];

/// How long setting the formation up may take (initdb, pg_basebackup, and
/// the state machine's first steps, on a busy machine).
const SETUP_WITHIN: Duration = Duration::from_secs(120);

/// What one node (or the monitor) reported, from `pg_autoctl show state --json`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct NodeState {
    /// `node1` or `node2`.
    pub nodename: String,
    /// Its PostgreSQL port.
    pub nodeport: u16,
    /// The state it reported (`primary`, `secondary`, `wait_primary`, …).
    pub current_group_state: String,
    /// The state the monitor assigned it.
    pub assigned_group_state: String,
    /// The timeline it reported.
    pub reported_tli: i64,
    /// The monitor's health check: 1 good, 0 bad, -1 unknown.
    pub health: i32,
}

/// One `pg_autoctl` service (a data node's keeper or the monitor) and the
/// PostgreSQL instance it manages.
#[derive(Debug)]
struct Service {
    pgdata: PathBuf,
    port: u16,
    log: PathBuf,
    /// `pg_autoctl run` (or `create … --run`), leader of its process group.
    process: Option<Child>,
}

/// A monitor and two data nodes, removed on drop.
#[derive(Debug)]
pub struct Formation {
    root: tempfile::TempDir,
    bin: PathBuf,
    pg_autoctl: PathBuf,
    as_postgres: bool,
    monitor: Service,
    /// `node1`, `node2`: index 0 and 1.
    nodes: Vec<Service>,
    url: String,
}

/// What is missing to run a formation, as a sentence that says what to
/// install; `None` when everything is there.
pub fn missing() -> Option<String> {
    let bin = match server_binaries() {
        Ok(bin) => bin,
        Err(error) => return Some(error.to_string()),
    };
    if pg_autoctl().is_none() {
        return Some(
            "pg_autoctl is missing: install Debian's pg-auto-failover-cli and \
             postgresql-<major>-auto-failover packages (scripts/setup does)"
                .to_owned(),
        );
    }
    let major = bin
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .unwrap_or("<major>")
        .to_owned();
    let extension = bin
        .parent()
        .map(|dir| dir.join("lib").join("pgautofailover.so"));
    if !extension.is_some_and(|so| so.exists()) {
        return Some(format!(
            "the pgautofailover extension of PostgreSQL {major} is missing: install Debian's \
             postgresql-{major}-auto-failover package (scripts/setup does)"
        ));
    }
    None
}

/// `pg_autoctl` on `PATH` or in `/usr/bin`.
fn pg_autoctl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("pg_autoctl"))
        .find(|candidate| candidate.exists())
}

impl Formation {
    /// A formation for the running test, or `None` when pg_auto_failover or
    /// PostgreSQL's server binaries are missing: the skip is recorded
    /// ([`crate::skip::record`], which fails the test instead under
    /// `CI=true`). Panics when they are there but the formation does not
    /// come up.
    pub async fn start_or_skip() -> Option<Formation> {
        if let Some(missing) = missing() {
            crate::skip::record(&crate::skip::current_test(), &missing);
            return None;
        }
        Some(
            Formation::start()
                .await
                .unwrap_or_else(|e| panic!("start a pg_auto_failover formation: {e}")),
        )
    }

    /// Create and run the monitor and both data nodes, and wait until
    /// `node1` (index 0) is the primary and `node2` its secondary.
    pub async fn start() -> io::Result<Formation> {
        if let Some(missing) = missing() {
            return Err(io::Error::new(io::ErrorKind::NotFound, missing));
        }
        let bin = server_binaries()?;
        let pg_autoctl = pg_autoctl().ok_or_else(|| io::Error::other("no pg_autoctl"))?;
        let as_postgres = running_as_root();
        let root = tempfile::Builder::new()
            .prefix("tickmark-pgaf-")
            .tempdir()?;
        for dir in ["config", "share", "run"] {
            std::fs::create_dir(root.path().join(dir))?;
        }
        if as_postgres {
            let (uid, gid) = postgres_ids()?;
            for dir in [".", "config", "share", "run"] {
                std::os::unix::fs::chown(root.path().join(dir), Some(uid), Some(gid))?;
            }
        }
        let service = |name: &str| -> io::Result<Service> {
            Ok(Service {
                pgdata: root.path().join(name),
                port: free_port()?,
                log: root.path().join(format!("{name}.log")),
                process: None,
            })
        };
        let mut formation = Formation {
            monitor: service("monitor")?,
            nodes: vec![service("node1")?, service("node2")?],
            root,
            bin,
            pg_autoctl,
            as_postgres,
            url: String::new(),
        };
        formation.start_monitor().await?;
        let monitor_uri = formation.monitor_uri().await?;
        for index in 0..2 {
            formation.create_node(index, &monitor_uri).await?;
            // node1 first, alone: it becomes the primary, node2 its copy.
            let want: &[&str] = if index == 0 {
                &["single", "wait_primary", "primary"]
            } else {
                &["secondary"]
            };
            formation
                .wait_for_state(SETUP_WITHIN, |states| {
                    states
                        .iter()
                        .find(|s| s.nodeport == formation.nodes[index].port)
                        .is_some_and(|s| want.contains(&s.current_group_state.as_str()))
                })
                .await?;
        }
        formation
            .wait_until_primary_and_secondary(SETUP_WITHIN)
            .await?;
        let primary = formation.primary().await?;
        if primary != 0 {
            return Err(formation.error(&format!(
                "node{} became the primary, not node1",
                primary + 1
            )));
        }
        formation.url = formation.formation_uri().await?;
        Ok(formation)
    }

    async fn start_monitor(&mut self) -> io::Result<()> {
        let pgdata = path_str(&self.monitor.pgdata)?.to_owned();
        let port = self.monitor.port.to_string();
        let pg_ctl = self.pg_ctl()?;
        self.autoctl(&[
            "create",
            "monitor",
            "--pgdata",
            &pgdata,
            "--pgport",
            &port,
            "--hostname",
            "127.0.0.1",
            "--listen",
            "127.0.0.1",
            "--auth",
            "trust",
            "--no-ssl",
            "--pgctl",
            &pg_ctl,
        ])
        .await?;
        // The monitor's own instance, stopped by `create`: its settings
        // before `run` starts it (read at start; all reloadable too).
        let settings: String = MONITOR_SETTINGS
            .iter()
            .map(|(name, value, _)| format!("{name} = {value}\n"))
            .collect();
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.monitor.pgdata.join("postgresql.auto.conf"))?
            .write_all(settings.as_bytes())?;
        let process = self.spawn(&["run", "--pgdata", &pgdata], &self.monitor.log)?;
        self.monitor.process = Some(process);
        // Up, with the settings above.
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover",
            self.monitor.port
        );
        let deadline = Instant::now() + SETUP_WITHIN;
        let (name, value, _) = MONITOR_SETTINGS[4];
        loop {
            if let Ok(mut conn) = PgConnection::connect(&url).await {
                // pg_settings: in the unit the setting is written in (ms).
                let setting: Result<String, _> =
                    sqlx::query_scalar("SELECT setting FROM pg_settings WHERE name = $1")
                        .bind(name)
                        .fetch_one(&mut conn)
                        .await;
                match setting {
                    Ok(setting) if setting == value => return Ok(()),
                    Ok(setting) => {
                        return Err(io::Error::other(format!(
                            "the monitor runs with {name} = {setting}, not {value}"
                        )))
                    }
                    Err(_) => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(self.error("the monitor did not start"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The monitor's URI, as `pg_autoctl show uri` gives it.
    async fn monitor_uri(&self) -> io::Result<String> {
        #[derive(Deserialize)]
        struct Uri {
            uri: Option<String>,
            #[serde(rename = "type")]
            kind: String,
        }
        let monitor = path_str(&self.monitor.pgdata)?;
        let out = self
            .autoctl(&["show", "uri", "--pgdata", monitor, "--json"])
            .await?;
        let uris: Vec<Uri> = serde_json::from_str(&out).map_err(|e| {
            io::Error::other(format!("pg_autoctl show uri --json said {out:?}: {e}"))
        })?;
        uris.into_iter()
            .find(|u| u.kind == "monitor")
            .and_then(|u| u.uri)
            .ok_or_else(|| io::Error::other(format!("no monitor URI in {out:?}")))
    }

    async fn create_node(&mut self, index: usize, monitor_uri: &str) -> io::Result<()> {
        let node = &self.nodes[index];
        let pgdata = path_str(&node.pgdata)?.to_owned();
        let port = node.port.to_string();
        let name = format!("node{}", index + 1);
        let pg_ctl = self.pg_ctl()?;
        let process = self.spawn(
            &[
                "create",
                "postgres",
                "--pgdata",
                &pgdata,
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--listen",
                "127.0.0.1",
                "--name",
                &name,
                "--dbname",
                "postgres",
                "--auth",
                "trust",
                "--no-ssl",
                "--monitor",
                monitor_uri,
                "--pgctl",
                &pg_ctl,
                "--run",
            ],
            &node.log,
        )?;
        self.nodes[index].process = Some(process);
        Ok(())
    }

    /// Every node and database in one URL, as `pg_autoctl show uri
    /// --formation default` gives it (`target_session_attrs=read-write`),
    /// with user `postgres` (the nodes trust it on 127.0.0.1).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    async fn formation_uri(&self) -> io::Result<String> {
        let monitor = path_str(&self.monitor.pgdata)?;
        let out = self
            .autoctl(&["show", "uri", "--pgdata", monitor, "--formation", "default"])
            .await?;
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        parse_formation_uri(out.trim(), &ports)
    }

    /// The URL of one node alone, as superuser `postgres`.
    pub fn node_url(&self, index: usize) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.nodes[index].port
        )
    }

    /// A node's PostgreSQL port.
    pub fn port(&self, index: usize) -> u16 {
        self.nodes[index].port
    }

    /// What the monitor says of each data node.
    pub async fn state(&self) -> io::Result<Vec<NodeState>> {
        let monitor = path_str(&self.monitor.pgdata)?;
        let out = self
            .autoctl(&["show", "state", "--pgdata", monitor, "--json"])
            .await?;
        serde_json::from_str(&out).map_err(|e| {
            io::Error::other(format!("pg_autoctl show state --json said {out:?}: {e}"))
        })
    }

    /// The index of the node the monitor has as the primary.
    pub async fn primary(&self) -> io::Result<usize> {
        let states = self.state().await?;
        states
            .iter()
            .find(|s| s.current_group_state == "primary" && s.assigned_group_state == "primary")
            .and_then(|s| self.nodes.iter().position(|n| n.port == s.nodeport))
            .ok_or_else(|| io::Error::other(format!("no primary in {states:?}")))
    }

    /// Wait until one node is `primary` and the other `secondary` (reported
    /// and assigned), the formation's steady state.
    pub async fn wait_until_primary_and_secondary(&self, within: Duration) -> io::Result<()> {
        self.wait_for_state(within, |states| {
            let count = |state: &str| {
                states
                    .iter()
                    .filter(|s| s.current_group_state == state && s.assigned_group_state == state)
                    .count()
            };
            states.len() == 2 && count("primary") == 1 && count("secondary") == 1
        })
        .await
    }

    /// Poll `pg_autoctl show state` every 100 ms until `done` holds.
    async fn wait_for_state(
        &self,
        within: Duration,
        done: impl Fn(&[NodeState]) -> bool,
    ) -> io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let last = match self.state().await {
                Ok(states) if done(&states) => return Ok(()),
                Ok(states) => format!("{states:?}"),
                Err(error) => error.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(self.error(&format!(
                    "the formation did not reach the state wanted within {within:?}; last: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `synchronous_standby_names` on node `primary`, once a standby
    /// streams to it synchronously (`sync_state` `sync` or `quorum` in
    /// `pg_stat_replication`): a commit there returns only once the standby
    /// has flushed it. An error when that does not happen within `within`.
    ///
    /// With one standby, pg_auto_failover 2.0's `number_sync_standbys` is 0
    /// (and 1 is refused: it needs two standbys), which already makes the
    /// primary wait for the one standby: `ANY 1 (pgautofailover_standby_2)`.
    pub async fn synchronous_standby_names(
        &self,
        primary: usize,
        within: Duration,
    ) -> io::Result<String> {
        let deadline = Instant::now() + within;
        let mut conn = PgConnection::connect(&self.node_url(primary))
            .await
            .map_err(io::Error::other)?;
        loop {
            let (names, streaming): (String, bool) = sqlx::query_as(
                "SELECT current_setting('synchronous_standby_names'), EXISTS (SELECT 1 FROM \
                 pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))",
            )
            .fetch_one(&mut conn)
            .await
            .map_err(io::Error::other)?;
            if !names.is_empty() && streaming {
                return Ok(names);
            }
            if Instant::now() >= deadline {
                return Err(self.error(&format!(
                    "node{} has no synchronous standby (synchronous_standby_names = {names:?})",
                    primary + 1
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `number_sync_standbys` of the default formation, from the monitor.
    pub async fn number_sync_standbys(&self) -> io::Result<u32> {
        let monitor = path_str(&self.monitor.pgdata)?;
        let out = self
            .autoctl(&[
                "get",
                "formation",
                "number-sync-standbys",
                "--pgdata",
                monitor,
            ])
            .await?;
        out.trim()
            .parse()
            .map_err(|e| io::Error::other(format!("number-sync-standbys said {out:?}: {e}")))
    }

    /// Kill node `index` as a machine that dies would: SIGKILL its keeper's
    /// process group (the keeper, its services, the postmaster) and every
    /// child of its postmaster at once, then wait until its port refuses
    /// connections. Returns the moment the signals were sent.
    pub async fn kill_node(&mut self, index: usize) -> io::Result<Instant> {
        let node = &mut self.nodes[index];
        let mut targets: Vec<String> = Vec::new();
        if let Some(process) = &node.process {
            if let Some(pid) = process.id() {
                targets.push(format!("-{pid}"));
            }
        }
        let postmaster = Postmaster::of(&node.pgdata);
        if let Some(postmaster) = &postmaster {
            targets.extend(postmaster.kill_targets());
        }
        if targets.is_empty() {
            return Err(io::Error::other(format!(
                "node{} runs nothing to kill",
                index + 1
            )));
        }
        // `kill` fails when any one target is gone already: a backend that
        // exited between the listing and the kill (connections come and go
        // all the time mid-stream). That is no failure to kill the node;
        // what proves the kill is the port going quiet, waited for below.
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg("--")
            .args(&targets)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        let killed_at = Instant::now();
        if let Some(mut process) = node.process.take() {
            let _ = process.wait().await;
        }
        let port = node.port;
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "node{} still answers on port {port} after SIGKILL",
                    index + 1
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(postmaster) = &postmaster {
            postmaster.remove_its_socket();
        }
        Ok(killed_at)
    }

    /// Wait until node `index` accepts writes as libpq's
    /// `target_session_attrs=read-write` sees it (not in recovery,
    /// `transaction_read_only` off: pg_auto_failover keeps a standby it has
    /// just promoted read-only until the old primary is out of the way).
    /// Returns the moment it was first seen writable.
    pub async fn wait_until_writable(&self, index: usize, within: Duration) -> io::Result<Instant> {
        let deadline = Instant::now() + within;
        let url = self.node_url(index);
        let mut conn: Option<PgConnection> = None;
        loop {
            if conn.is_none() {
                conn = PgConnection::connect(&url).await.ok();
            }
            if let Some(c) = conn.as_mut() {
                let writable: Result<bool, _> = sqlx::query_scalar(
                    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'",
                )
                .fetch_one(c)
                .await;
                match writable {
                    Ok(true) => return Ok(Instant::now()),
                    Ok(false) => {}
                    Err(_) => conn = None,
                }
            }
            if Instant::now() >= deadline {
                return Err(self.error(&format!(
                    "node{} did not accept writes within {within:?}",
                    index + 1
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Start node `index`'s keeper again (`pg_autoctl run`) after
    /// [`Formation::kill_node`]: it asks the monitor what it is now before
    /// it starts PostgreSQL for clients.
    pub async fn restart_keeper(&mut self, index: usize) -> io::Result<()> {
        if self.nodes[index].process.is_some() {
            return Err(io::Error::other(format!(
                "node{}'s keeper still runs",
                index + 1
            )));
        }
        let pgdata = path_str(&self.nodes[index].pgdata)?.to_owned();
        let process = self.spawn(&["run", "--pgdata", &pgdata], &self.nodes[index].log)?;
        self.nodes[index].process = Some(process);
        Ok(())
    }

    /// Wait until node `index` is the formation's `secondary` (reported and
    /// assigned), the other node its `primary`, and `index` in recovery.
    pub async fn wait_until_rejoined(&self, index: usize, within: Duration) -> io::Result<()> {
        let port = self.nodes[index].port;
        self.wait_for_state(within, |states| {
            let of = |want_self: bool| {
                states
                    .iter()
                    .find(|s| (s.nodeport == port) == want_self)
                    .map(|s| {
                        (
                            s.current_group_state.as_str(),
                            s.assigned_group_state.as_str(),
                        )
                    })
            };
            of(true) == Some(("secondary", "secondary"))
                && of(false) == Some(("primary", "primary"))
        })
        .await?;
        let mut conn = PgConnection::connect(&self.node_url(index))
            .await
            .map_err(io::Error::other)?;
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .map_err(io::Error::other)?;
        if in_recovery {
            Ok(())
        } else {
            Err(self.error(&format!(
                "node{} is the secondary yet not in recovery",
                index + 1
            )))
        }
    }

    /// What node `index`'s keeper did, from its log: its state machine's
    /// transitions, rewinds and base backups, with their times.
    pub fn transitions(&self, index: usize) -> String {
        let log = std::fs::read_to_string(&self.nodes[index].log).unwrap_or_default();
        log.lines()
            .filter(|line| {
                [
                    "FSM transition",
                    "pg_rewind",
                    "pg_basebackup",
                    "Transition complete",
                    "ERROR",
                ]
                .iter()
                .any(|word| line.contains(word))
            })
            .map(|line| format!("{line}\n"))
            .collect()
    }

    /// The last lines of every `pg_autoctl` log (for a failing test's
    /// message).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (name, service) in [("monitor", &self.monitor)]
            .into_iter()
            .chain([("node1", &self.nodes[0]), ("node2", &self.nodes[1])])
        {
            let log = std::fs::read_to_string(&service.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            out.push_str(&format!("--- {name} ({})\n", service.log.display()));
            for line in &lines[lines.len().saturating_sub(30)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    fn error(&self, what: &str) -> io::Error {
        io::Error::other(format!("{what}\n{}", self.logs()))
    }

    fn pg_ctl(&self) -> io::Result<String> {
        Ok(path_str(&self.bin.join("pg_ctl"))?.to_owned())
    }

    /// `pg_autoctl` as the formation's owner, with its files in the temp dir.
    fn command(&self) -> Command {
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&self.pg_autoctl);
            command
        } else {
            Command::new(&self.pg_autoctl)
        };
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(
            std::iter::once(self.bin.clone()).chain(std::env::split_paths(&path)),
        )
        .unwrap_or(path);
        command
            .env("PATH", path)
            .env("PG_CONFIG", self.bin.join("pg_config"))
            .env("XDG_CONFIG_HOME", self.root.path().join("config"))
            .env("XDG_DATA_HOME", self.root.path().join("share"))
            .env("XDG_RUNTIME_DIR", self.root.path().join("run"))
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGDATA")
            // Out of the test's current directory, which user `postgres`
            // may not be allowed to enter.
            .current_dir(self.root.path())
            .stdin(Stdio::null());
        command
    }

    /// Run a `pg_autoctl` command to its end; its stdout.
    async fn autoctl(&self, args: &[&str]) -> io::Result<String> {
        let output = self
            .command()
            .args(args)
            .kill_on_drop(true)
            .output()
            .await?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "pg_autoctl {} failed ({}): {}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            )))
        }
    }

    /// Start a long-running `pg_autoctl` command in a process group of its
    /// own, its output appended to `log`.
    fn spawn(&self, args: &[&str], log: &Path) -> io::Result<Child> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut command = self.command();
        command
            .args(args)
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0)
            .kill_on_drop(true);
        command.spawn()
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        let mut targets: Vec<String> = Vec::new();
        let mut postmasters = Vec::new();
        for service in std::iter::once(&self.monitor).chain(&self.nodes) {
            if let Some(pid) = service.process.as_ref().and_then(Child::id) {
                targets.push(format!("-{pid}"));
            }
            if let Some(postmaster) = Postmaster::of(&service.pgdata) {
                targets.extend(postmaster.kill_targets());
                postmasters.push(postmaster);
            }
        }
        if !targets.is_empty() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg("--")
                .args(&targets)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        for postmaster in &postmasters {
            postmaster.remove_its_socket();
        }
        // The TempDir then removes the data directories.
    }
}

/// Check the URI `pg_autoctl show uri --formation` printed: both nodes'
/// ports in order, `target_session_attrs=read-write`; add user `postgres`
/// when it names none.
pub fn parse_formation_uri(uri: &str, ports: &[u16]) -> io::Result<String> {
    let bad = |why: &str| io::Error::other(format!("the formation URI {uri:?} {why}"));
    let rest = uri
        .strip_prefix("postgres://")
        .or_else(|| uri.strip_prefix("postgresql://"))
        .ok_or_else(|| bad("is not a postgres:// URL"))?;
    let (authority, path) = rest.split_once('/').ok_or_else(|| bad("has no database"))?;
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (user.to_owned(), hosts),
        None => ("postgres".to_owned(), authority),
    };
    let listed: Vec<u16> = hosts
        .split(',')
        .map(|host| {
            host.rsplit_once(':')
                .and_then(|(_, port)| port.parse().ok())
                .ok_or_else(|| bad("has a host without a port"))
        })
        .collect::<io::Result<_>>()?;
    if listed != ports {
        return Err(bad(&format!("lists ports {listed:?}, not {ports:?}")));
    }
    let query = path.split_once('?').map(|(_, q)| q).unwrap_or_default();
    if !query
        .split('&')
        .any(|pair| pair == "target_session_attrs=read-write")
    {
        return Err(bad("lacks target_session_attrs=read-write"));
    }
    Ok(format!("postgres://{user}@{hosts}/{path}"))
}

/// A running postmaster, from its `postmaster.pid`.
struct Postmaster {
    pid: u32,
    pgdata: PathBuf,
    port: u16,
    /// Where its Unix socket and the socket's lock file are.
    socket_dir: Option<PathBuf>,
}

impl Postmaster {
    /// Read `pgdata/postmaster.pid`: pid, data dir, start time, port,
    /// socket directory, one a line.
    fn of(pgdata: &Path) -> Option<Postmaster> {
        let file = std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = file.lines().collect();
        Some(Postmaster {
            pid: lines.first()?.trim().parse().ok()?,
            pgdata: PathBuf::from(lines.get(1)?.trim()),
            port: lines.get(3)?.trim().parse().ok()?,
            socket_dir: lines
                .get(4)
                .map(|dir| dir.trim())
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
        })
    }

    /// The postmaster and its children, as arguments of `kill`.
    fn kill_targets(&self) -> Vec<String> {
        std::iter::once(self.pid)
            .chain(children_of(self.pid))
            .map(|pid| pid.to_string())
            .collect()
    }

    /// A postmaster killed with SIGKILL leaves its socket and the socket's
    /// lock file behind in the (shared) socket directory: remove them, if
    /// the lock file still names this data directory.
    fn remove_its_socket(&self) {
        let Some(dir) = &self.socket_dir else {
            return;
        };
        let socket = dir.join(format!(".s.PGSQL.{}", self.port));
        let lock = dir.join(format!(".s.PGSQL.{}.lock", self.port));
        let ours = std::fs::read_to_string(&lock)
            .ok()
            .and_then(|text| {
                text.lines()
                    .nth(1)
                    .map(|line| Path::new(line.trim()) == self.pgdata)
            })
            .unwrap_or(false);
        if ours {
            let _ = std::fs::remove_file(&socket);
            let _ = std::fs::remove_file(&lock);
        }
    }
}

/// The pids of `parent`'s children, from `/proc/<pid>/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str()
        .ok_or_else(|| io::Error::other(format!("path {} is not UTF-8", path.display())))
}

#[cfg(test)]
mod tests {
    use super::parse_formation_uri;

    #[test]
    fn the_formation_uri_gets_a_user_and_must_ask_for_the_writable_host() {
        assert_eq!(
            parse_formation_uri(
                "postgres://127.0.0.1:5501,127.0.0.1:5502/postgres?target_session_attrs=read-write&sslmode=prefer",
                &[5501, 5502]
            )
            .unwrap(),
            "postgres://postgres@127.0.0.1:5501,127.0.0.1:5502/postgres?target_session_attrs=read-write&sslmode=prefer"
        );
        assert!(parse_formation_uri(
            "postgres://127.0.0.1:5501,127.0.0.1:5502/postgres?sslmode=prefer",
            &[5501, 5502]
        )
        .is_err());
        assert!(parse_formation_uri(
            "postgres://127.0.0.1:5501/postgres?target_session_attrs=read-write",
            &[5501, 5502]
        )
        .is_err());
    }
}
