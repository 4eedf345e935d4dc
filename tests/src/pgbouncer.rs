//! A PgBouncer of a test's own in front of the shared PostgreSQL server
//! (docs/deploying.md, "PgBouncer, transaction mode").
//!
//! Each one gets a new login role and a schema that role owns, with the
//! role's `search_path` set to the schema (`ALTER ROLE … SET`, on a role the
//! test created): PgBouncer 1.18 refuses the `options` startup parameter
//! that [`TestDb`](crate::TestDb) uses to pick a schema, and a role setting
//! holds on every server connection PgBouncer opens, also after the
//! `DISCARD ALL` it runs between clients in session mode. In transaction
//! mode the pooler's pool is smaller than the store's, so that clients
//! share server connections, which is what that mode changes. PgBouncer refuses to run as root:
//! as root it runs as user `postgres` (`runuser`). Dropping it kills the
//! process (by the pid it wrote, not `runuser`'s), removes its temp dir,
//! and drops the schema and the role.

use std::path::PathBuf;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

use crate::db::postgres_url;
use crate::skip;

/// Where Debian's `pgbouncer` package puts the binary (`scripts/setup`
/// installs it).
const BINARY: &str = "/usr/sbin/pgbouncer";

/// Server connections PgBouncer opens to the database in transaction mode,
/// at most: fewer than the store's pool, so clients take turns on them.
pub const SERVER_CONNECTIONS: u32 = 3;

/// In session mode a client holds its server connection while connected:
/// room for the store's pool, its `LISTEN` and a test's extra engines.
const SESSION_SERVER_CONNECTIONS: u32 = 24;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A client keeps its server connection until it disconnects.
    Session,
    /// A client holds a server connection for one transaction at a time.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer, its role and its schema.
pub struct PgBouncer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    mode: PoolMode,
    role: String,
    admin_url: String,
    direct_url: String,
}

impl PgBouncer {
    /// Start one in `mode`, with a new role whose `search_path` is a new
    /// schema, and whose other defaults are `role_settings` (such as
    /// `("default_transaction_isolation", "repeatable read")`). `None` when
    /// PostgreSQL tests are skipped or PgBouncer is not installed (recorded;
    /// a failure under `CI=true`).
    pub async fn start(mode: PoolMode, role_settings: &[(&str, &str)]) -> Option<PgBouncer> {
        let admin_url = postgres_url()?;
        if !std::path::Path::new(BINARY).exists() {
            skip::record(
                &skip::current_test(),
                "PgBouncer is not installed (/usr/sbin/pgbouncer): run scripts/setup, which \
                 installs Debian's pgbouncer package",
            );
            return None;
        }
        let server = PgConnectOptions::from_str(&admin_url).expect("DATABASE_URL parses");
        let role = format!(
            "tm_pgb_{}_{}_{:04x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u16>()
        );
        let mut admin = PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {admin_url} is unreachable: {e}"));
        let mut statements = vec![
            format!("CREATE ROLE {role} LOGIN"),
            format!("CREATE SCHEMA {role} AUTHORIZATION {role}"),
            format!("ALTER ROLE {role} SET search_path = {role}"),
        ];
        for (name, value) in role_settings {
            statements.push(format!("ALTER ROLE {role} SET {name} = '{value}'"));
        }
        for statement in &statements {
            sqlx::raw_sql(statement)
                .execute(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
        let _ = admin.close().await;

        let direct_url = format!(
            "postgres://{role}@{}:{}/{}",
            server.get_host(),
            server.get_port(),
            server.get_database().unwrap_or("test")
        );
        // Made before PgBouncer runs, so that a failure from here on still
        // drops the role and the schema.
        let mut bouncer = PgBouncer {
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
            port: 0,
            mode,
            role,
            admin_url,
            direct_url,
        };
        // A port chosen free can be taken before PgBouncer binds it (tests
        // run side by side): PgBouncer then exits, and another port is tried.
        for _ in 0..3 {
            bouncer.stop();
            bouncer.port = free_port();
            bouncer.write_config(&server);
            bouncer.child = Some(bouncer.spawn());
            if bouncer.ready().await {
                return Some(bouncer);
            }
        }
        panic!("PgBouncer exited three times:\n{}", bouncer.log());
    }

    fn write_config(&self, server: &PgConnectOptions) {
        let dir = self.dir.path();
        let ini = format!(
            "[databases]\n\
             tickmark = host={host} port={server_port} dbname={database}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 200\n\
             server_round_robin = 1\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            host = server.get_host(),
            server_port = server.get_port(),
            database = server.get_database().unwrap_or("test"),
            port = self.port,
            dir = dir.display(),
            mode = self.mode.as_str(),
            pool_size = match self.mode {
                PoolMode::Transaction => SERVER_CONNECTIONS,
                PoolMode::Session => SESSION_SERVER_CONNECTIONS,
            },
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("write pgbouncer.ini");
        std::fs::write(
            dir.join("userlist.txt"),
            format!("\"{}\" \"\"\n", self.role),
        )
        .expect("write userlist.txt");
        if running_as_root() {
            // User postgres reads the config and writes the log and pid files.
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown the PgBouncer dir to postgres");
        }
    }

    fn spawn(&self) -> Child {
        let mut command = if running_as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--", BINARY]);
            command
        } else {
            Command::new(BINARY)
        };
        command
            .arg(self.dir.path().join("pgbouncer.ini"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start pgbouncer")
    }

    /// Whether PgBouncer came up (false: it exited, as on a port in use).
    async fn ready(&mut self) -> bool {
        // Without tickmark's parameters, which sqlx alone would warn about.
        let url = format!("postgres://{}@127.0.0.1:{}/tickmark", self.role, self.port);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(conn) = PgConnection::connect(&url).await {
                let _ = conn.close().await;
                return true;
            }
            let child = self.child.as_mut().expect("spawned");
            if child.try_wait().expect("PgBouncer's status").is_some() {
                return false;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "PgBouncer did not accept connections within 20 s:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The store's URL through the pooler (`pooler=transaction` or
    /// `pooler=session`), with `listen_url` pointing past it when `listen`.
    pub fn url(&self, listen: bool) -> String {
        let mut url = format!(
            "postgres://{}@127.0.0.1:{}/tickmark?pooler={}",
            self.role,
            self.port,
            self.mode.as_str()
        );
        if listen {
            url.push_str("&listen_url=");
            url.push_str(&encode(&self.direct_url));
        }
        url
    }

    /// The URL through the pooler without tickmark's parameters, as one
    /// who has not read docs/deploying.md writes it: no `pooler=…`.
    pub fn url_without_pooler(&self) -> String {
        format!("postgres://{}@127.0.0.1:{}/tickmark", self.role, self.port)
    }

    /// A URL past the pooler, to the same schema (the role's `search_path`).
    pub fn direct_url(&self) -> &str {
        &self.direct_url
    }

    /// PgBouncer's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }

    /// Server connections PgBouncer has open now, as the server sees them.
    pub async fn server_connections(&self) -> i64 {
        let mut admin = PgConnection::connect(&self.admin_url).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND client_addr IS NOT NULL",
        )
        .bind(&self.role)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        let _ = admin.close().await;
        n
    }
}

impl PgBouncer {
    /// Stop PgBouncer itself: the child may be `runuser`, which killing
    /// would leave PgBouncer running, so by the pid PgBouncer wrote.
    fn stop(&mut self) {
        let pidfile = self.dir.path().join("pgbouncer.pid");
        if let Ok(pid) = std::fs::read_to_string(&pidfile) {
            let pid = pid.trim();
            if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", pid])
                    .stderr(Stdio::null())
                    .status();
            }
            // Not read again: the pid may be another process's later.
            let _ = std::fs::remove_file(&pidfile);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
        let (admin_url, role) = (self.admin_url.clone(), self.role.clone());
        // Drop runs outside any runtime we may block, so use a thread of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let Ok(mut admin) = PgConnection::connect(&admin_url).await else {
                    return;
                };
                for statement in [
                    format!(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
                    ),
                    format!("DROP SCHEMA IF EXISTS {role} CASCADE"),
                    format!("DROP ROLE IF EXISTS {role}"),
                ] {
                    let _ = sqlx::raw_sql(&statement).execute(&mut admin).await;
                }
                let _ = admin.close().await;
            });
        })
        .join();
    }
}

fn running_as_root() -> bool {
    // `id -u` rather than libc: the tests crate has no libc dependency.
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A port nothing listens on now (PgBouncer binds it a moment later).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// `value` percent-encoded for a URL parameter.
fn encode(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

impl std::fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBouncer")
            .field("port", &self.port)
            .field("mode", &self.mode)
            .field("role", &self.role)
            .finish()
    }
}
