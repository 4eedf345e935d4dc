//! A throwaway PostgreSQL cluster that a test owns: it may stop it, kill it
//! and restart it without touching the machine's shared server.
//!
//! [`PgCluster::start`] runs `initdb` and `pg_ctl` (from
//! `/usr/lib/postgresql/<version>/bin`, the newest, or `TICKMARK_PG_BIN`) in a
//! temp dir, on a free loopback port, with its Unix socket in that dir. As
//! root (initdb refuses root) the temp dir is given to user `postgres` and the
//! tools run with `runuser -u postgres --`. Dropping the cluster stops it
//! (`-m immediate`) and removes the dir.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use tickmark_tests::pg_cluster::{PgCluster, StopMode};
//! let mut cluster = PgCluster::start().await?;
//! let url = cluster.url(); // postgres://postgres@127.0.0.1:<port>/postgres
//! cluster.stop(StopMode::Immediate).await?; // a crash: connections drop
//! cluster.start_again().await?; // same port, same data
//! # let _ = url; Ok(()) }
//! ```

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

/// How `pg_ctl stop` shuts the server down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// `-m fast`: roll back open transactions, disconnect clients, shut down cleanly.
    Fast,
    /// `-m immediate`: kill the server processes without a clean shutdown,
    /// as a crash would (recovery runs on the next start).
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A PostgreSQL cluster of the test's own, removed on drop.
#[derive(Debug)]
pub struct PgCluster {
    root: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    running: bool,
    /// More `-c name=value` server options, for every start.
    extra_options: String,
}

impl PgCluster {
    /// A new cluster for the running test, or `None` when this machine has no
    /// PostgreSQL server binaries: the skip is recorded
    /// ([`crate::skip::record`], which fails the test instead under
    /// `CI=true`). Panics when the binaries are there but the cluster does not
    /// start.
    pub async fn start_or_skip() -> Option<PgCluster> {
        if let Err(missing) = server_binaries() {
            crate::skip::record(&crate::skip::current_test(), &missing.to_string());
            return None;
        }
        Some(
            PgCluster::start()
                .await
                .unwrap_or_else(|e| panic!("start a throwaway PostgreSQL cluster: {e}")),
        )
    }

    /// `initdb` a new cluster and start it on a free port.
    pub async fn start() -> io::Result<PgCluster> {
        Self::start_with("").await
    }

    /// `initdb` a new cluster and start it on a free port with more server
    /// options (`-c name=value …`), kept for every start.
    pub async fn start_with(extra_options: &str) -> io::Result<PgCluster> {
        let mut cluster = Self::unstarted(extra_options)?;
        let data = cluster.data_dir();
        cluster
            .run_tool(
                "initdb",
                &[
                    "-D",
                    path_str(&data)?,
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
            )
            .await?;
        cluster.start_on_a_free_port().await?;
        Ok(cluster)
    }

    /// A temp dir (given to user `postgres` when running as root) with no
    /// data directory yet: `initdb` or `pg_basebackup` makes it.
    pub(crate) fn unstarted(extra_options: &str) -> io::Result<PgCluster> {
        let bin = server_binaries()?;
        let as_postgres = running_as_root();
        let root = tempfile::Builder::new().prefix("tickmark-pg-").tempdir()?;
        if as_postgres {
            let (uid, gid) = postgres_ids()?;
            std::os::unix::fs::chown(root.path(), Some(uid), Some(gid))?;
        }
        Ok(PgCluster {
            root,
            bin,
            port: 0,
            as_postgres,
            running: false,
            extra_options: extra_options.to_owned(),
        })
    }

    /// Start the data directory on a free port. A port that was free a
    /// moment ago may be taken by the time the server binds it: try a few.
    pub(crate) async fn start_on_a_free_port(&mut self) -> io::Result<()> {
        let mut last_error = None;
        for _ in 0..5 {
            self.port = free_port()?;
            match self.start_again().await {
                Ok(()) => return Ok(()),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("could not start PostgreSQL")))
    }

    /// Start the (stopped) cluster again, on the same port with the same data.
    pub async fn start_again(&mut self) -> io::Result<()> {
        let data = self.data_dir();
        let log = self.log_path();
        // fsync and full-page writes only matter when the machine crashes; a
        // killed server loses nothing without them. Commits stay synchronous:
        // an acknowledged commit must survive `-m immediate`.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
             -c max_connections=100 {}",
            self.port,
            path_str(self.root.path())?,
            self.extra_options
        );
        self.run_tool(
            "pg_ctl",
            &[
                "-D",
                path_str(&data)?,
                "-l",
                path_str(&log)?,
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .await?;
        self.running = true;
        Ok(())
    }

    /// Stop the cluster; every connection to it breaks.
    pub async fn stop(&mut self, mode: StopMode) -> io::Result<()> {
        let data = self.data_dir();
        self.run_tool(
            "pg_ctl",
            &[
                "-D",
                path_str(&data)?,
                "-m",
                mode.as_arg(),
                "-w",
                "-t",
                "60",
                "stop",
            ],
        )
        .await?;
        self.running = false;
        Ok(())
    }

    /// Stop with `mode`, then start again on the same port.
    pub async fn restart(&mut self, mode: StopMode) -> io::Result<()> {
        if self.running {
            self.stop(mode).await?;
        }
        self.start_again().await
    }

    /// Whether the server was last started (and not stopped) by this handle.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// The URL of the `postgres` database as superuser `postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `database` as superuser `postgres`.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("server.log")
    }

    /// Run one of the server tools (`pg_ctl`, `pg_basebackup`, …) as the
    /// cluster's owner, in its temp dir.
    pub(crate) async fn run_tool(&self, tool: &str, args: &[&str]) -> io::Result<()> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        command
            .args(args)
            // Keep the tools out of the test's current directory, which
            // user `postgres` may not be allowed to enter.
            .current_dir(self.root.path())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = command.output().await?;
        if output.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{tool} {} failed ({}): {}{}\n{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                self.log()
            )))
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        let program = self.bin.join("pg_ctl");
        let data = self.data_dir();
        let mut command = if self.as_postgres {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            std::process::Command::new(&program)
        };
        let _ = command
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .current_dir(self.root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // The TempDir then removes the data directory.
    }
}

/// The directory of the PostgreSQL server binaries (`initdb`, `pg_ctl`):
/// `TICKMARK_PG_BIN`, or the newest `/usr/lib/postgresql/<version>/bin` with
/// both. The error says what to install.
pub fn server_binaries() -> io::Result<PathBuf> {
    let has_tools = |bin: &Path| bin.join("initdb").exists() && bin.join("pg_ctl").exists();
    if let Ok(dir) = std::env::var("TICKMARK_PG_BIN") {
        let bin = PathBuf::from(&dir);
        return if has_tools(&bin) {
            Ok(bin)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "TICKMARK_PG_BIN={dir} has no initdb and pg_ctl: point it at PostgreSQL's \
                     server binaries (Debian's postgresql package puts them in \
                     /usr/lib/postgresql/<version>/bin)"
                ),
            ))
        };
    }
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, bin)| bin).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the PostgreSQL server binaries (initdb, pg_ctl under /usr/lib/postgresql/<version>/bin) \
             are missing: install Debian's postgresql package (apt-get install postgresql), \
             or set TICKMARK_PG_BIN to their directory",
        )
    })
}

pub(crate) fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// The uid and gid of user `postgres`, from `/etc/passwd`.
pub(crate) fn postgres_ids() -> io::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            if fields.next()? != "postgres" {
                return None;
            }
            let _password = fields.next()?;
            let uid = fields.next()?.parse().ok()?;
            let gid = fields.next()?.parse().ok()?;
            Some((uid, gid))
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no user `postgres`"))
}

pub(crate) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str()
        .ok_or_else(|| io::Error::other(format!("path {} is not UTF-8", path.display())))
}
