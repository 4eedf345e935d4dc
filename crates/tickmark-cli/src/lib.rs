//! `tickmark`, the operator's command line: what is stuck, why, and how to
//! fix it safely. It reads and changes the same database the engine uses
//! (SQLite or PostgreSQL), through the [`Admin`](tickmark_driver::store::admin::Admin)
//! side of the store, so it works against a running fleet without stopping it:
//! every action is one transaction that filters on the expected state, bumps
//! the fencing token and writes an audit row.
//!
//! Human tables by default, `--json` for scripts (one JSON document on
//! stdout); errors go to stderr with what to do next; the exit code says what
//! happened ([`EXIT_CODES`]). `docs/operations.md` is the operator's guide.
//!
//! | module | command |
//! |---|---|
//! | `migrate` | `tickmark migrate` |
//! | `status` | `tickmark status` |
//! | `events`, `explain`, `lookup` | `tickmark events list / show / explain / retry / cancel` |
//! | `steps` | `tickmark steps skip / mark-done` |
//! | `prune`, `retry_windows` | `tickmark prune` |
//! | `plans` | `tickmark plans check` |
//! | `keys`, `erase` | `tickmark keys new / status / rotate`, `tickmark erase --subject` |
//! | `reconcile` | `tickmark reconcile` (feature `reconcile`) |
//! | `table`, `format`, `duration`, `printable`, `progress_line` | plain-text tables, times, durations, text made safe for a terminal, progress on stderr |
//!
//! An operator binary that links the application's steps calls
//! [`main_with`] with its handlers: then `tickmark reconcile` can record the
//! events it pulls (each is stored with its handler's plan).

// Without a backend feature this crate still compiles (each crate is
// verified alone when packaged), but it has no database to open: the code
// that would use one is unused, which is not worth a warning. The facade
// always builds it with a backend.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unreachable_code)
)]

mod duration;
mod erase;
mod events;
mod explain;
mod format;
mod keys;
mod lookup;
mod migrate;
mod plans;
mod printable;
mod progress_line;
mod prune;
#[cfg(feature = "reconcile")]
mod reconcile;
mod retry_windows;
mod status;
mod steps;
mod table;
mod tenants;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use serde::Serialize;

use tickmark_core::handler::Handlers;
use tickmark_core::operator::AdminError;
use tickmark_driver::store::{MigrationError, Store, StoreError};
#[cfg(feature = "postgres")]
use tickmark_postgres::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
use tickmark_sqlite::{SqliteOptions, SqliteStore};

/// The exit codes, once, for `--help` and [`EXIT_CODES`].
macro_rules! exit_codes {
    () => {
        "Exit codes:
  0  ok
  1  database or other error (unreachable, unreadable, interrupted)
  2  usage: a bad flag or value, no database URL, an ID shared by several sources
  3  not found: no such event, or no step of that name in its plan
  4  refused: the event's state does not allow the action (the message says what would),
     or a newer tickmark migrated the database (upgrade this binary)
  5  plans check: some unfinished events carry plans this build cannot run"
    };
}

/// The exit codes, as `--help` and `docs/operations.md` list them.
pub const EXIT_CODES: &str = exit_codes!();

const AFTER_HELP: &str = concat!(
    "Examples:
  export DATABASE_URL=postgres://ops@db.internal/shop   # or sqlite://var/tickmark.db
  tickmark status                       # what is queued, running, dead, stuck
  tickmark events list --state dead     # the dead letters
  tickmark events explain 42            # why event 42 is where it is
  tickmark events retry 42              # re-queue it at its failed step
  tickmark prune --older-than 30d       # forget finished events
  tickmark erase --subject customer=42  # erase a customer's data, keep dedup

",
    exit_codes!()
);

/// Inspect and repair tickmark's events in the engine's own database.
///
/// Reads and changes the same database the workers use (SQLite or
/// PostgreSQL), so it works against a running fleet: every action is one
/// short transaction that checks the event's state, fences out any worker
/// still holding an old lease, and writes an audit row.
#[derive(Debug, Parser)]
// `--version`: the crate version and the schema versions this binary knows.
#[command(name = "tickmark", version = migrate::version(), after_help = AFTER_HELP)]
struct Cli {
    /// The engine's database: `sqlite://path/to/tickmark.db` or
    /// `postgres://user@host/db`; with a standby, name every host and the
    /// primary is followed across a failover:
    /// `postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write`
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        value_name = "URL",
        hide_env_values = true
    )]
    database_url: Option<String>,

    /// Print one JSON document on stdout instead of tables (errors stay on stderr)
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply tickmark's schema (idempotent; every connection already does)
    #[command(long_about = migrate::LONG_ABOUT, after_help = migrate::AFTER_HELP)]
    Migrate,
    /// Counts by state and source, oldest pending age, dead letters, stuck leases, throughput
    #[command(long_about = status::LONG_ABOUT, after_help = status::AFTER_HELP)]
    Status(status::StatusArgs),
    /// List, show, explain, retry and cancel events
    #[command(subcommand)]
    Events(events::EventsCommand),
    /// Skip an event's current step, or record it as done by hand
    #[command(subcommand)]
    Steps(steps::StepsCommand),
    /// Delete finished events older than a window, with their steps and audit rows
    #[command(long_about = prune::LONG_ABOUT, after_help = prune::AFTER_HELP)]
    Prune(prune::PruneArgs),
    /// Before a deploy: which unfinished events carry plans this build cannot run
    #[command(subcommand)]
    Plans(PlansCommand),
    /// Fair share across tenants: list tenants, set a tenant's weight at run time
    #[command(subcommand)]
    Tenants(tenants::TenantsCommand),
    /// Encryption keys: make one, see which sealed the database, rotate to a new one
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Erase what tickmark holds about a subject (a customer, an email), keeping dedup
    #[command(long_about = erase::LONG_ABOUT, after_help = erase::AFTER_HELP)]
    Erase(erase::EraseArgs),
    /// Recover what a provider gave up on, from its own API (Stripe, GitHub, Shopify)
    #[cfg(feature = "reconcile")]
    #[command(long_about = reconcile::LONG_ABOUT, after_help = reconcile::AFTER_HELP)]
    Reconcile(reconcile::ReconcileArgs),
}

/// What a command may do to tickmark's schema when it opens the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SchemaUse {
    /// Bring it to this build's version first, as every tickmark process
    /// that opens its own pool does.
    Migrate,
    /// Leave it as it is, and refuse any but this build's version: the
    /// command only reads.
    // Only `reconcile`'s views read only so far.
    #[cfg_attr(not(feature = "reconcile"), allow(dead_code))]
    ReadOnly,
}

impl Command {
    /// Whether this command migrates: the reconcile views that only read
    /// (`--status`, `--dry-run`) do not.
    fn schema_use(&self) -> SchemaUse {
        match self {
            #[cfg(feature = "reconcile")]
            Command::Reconcile(args) if args.reads_only() => SchemaUse::ReadOnly,
            _ => SchemaUse::Migrate,
        }
    }
}

#[derive(Debug, Subcommand)]
enum PlansCommand {
    /// List unfinished events whose stored plans name step types this build does not know
    #[command(long_about = plans::LONG_ABOUT, after_help = plans::AFTER_HELP)]
    Check,
}

/// Parse the process's arguments and run: what `src/bin/tickmark.rs` calls.
pub fn main() -> ExitCode {
    run(std::env::args_os())
}

/// [`main`] in an operator binary that links the application's steps, with
/// its handlers: `tickmark reconcile` then records what it pulls.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     tickmark::cli::main_with(tickmark::Handlers::new() /* your handlers */)
/// }
/// ```
pub fn main_with(handlers: Handlers) -> ExitCode {
    run_with(std::env::args_os(), Some(handlers))
}

/// Run `tickmark` with these arguments (the first is the program name) and
/// return its exit code.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_with(args, None)
}

/// [`run`] with the application's handlers, if it has them.
pub fn run_with<I, T>(args: I, handlers: Option<Handlers>) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            // `--help` and `--version` exit 0; a usage error exits 2.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    let out = Output { json: cli.json };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return out.fail(Failure::Other(format!("cannot start: {error}"))),
    };
    match runtime.block_on(dispatch(cli, out, handlers)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => out.fail(failure),
    }
}

// Only `reconcile` needs the handlers.
#[cfg_attr(not(feature = "reconcile"), allow(unused_variables))]
async fn dispatch(cli: Cli, out: Output, handlers: Option<Handlers>) -> Result<(), Failure> {
    if matches!(cli.command, Command::Keys(keys::KeysCommand::New)) {
        return keys::new_key(out);
    }
    let url = cli.database_url.ok_or_else(|| {
        Failure::Usage(
            "no database given: pass --database-url URL or set DATABASE_URL, e.g. \
             sqlite://path/to/tickmark.db or postgres://user@host/db (the URL the workers use)"
                .to_owned(),
        )
    })?;
    let creates = matches!(cli.command, Command::Migrate);
    let store = open(&url, creates, cli.command.schema_use()).await?;
    match cli.command {
        Command::Migrate => migrate::run(store.as_ref(), out).await,
        Command::Status(args) => status::run(store.as_ref(), out, args).await,
        Command::Events(command) => events::run(store.as_ref(), out, command).await,
        Command::Steps(command) => steps::run(store.as_ref(), out, command).await,
        Command::Prune(args) => prune::run(store.as_ref(), out, args).await,
        Command::Plans(PlansCommand::Check) => plans::check(store.as_ref(), out).await,
        Command::Tenants(command) => tenants::run(store.as_ref(), out, command).await,
        Command::Keys(command) => keys::run(store.as_ref(), out, command).await,
        Command::Erase(args) => erase::run(store.as_ref(), out, args).await,
        #[cfg(feature = "reconcile")]
        Command::Reconcile(args) => reconcile::run(store, out, args, handlers).await,
    }
}

/// Connect (which applies the schema, as every tickmark process does, unless
/// the command only reads: `schema`). A SQLite file must already exist
/// unless `creates`: a mistyped path would otherwise show an empty new
/// database.
async fn open(url: &str, creates: bool, schema: SchemaUse) -> Result<Arc<dyn Store>, Failure> {
    if let Some(path) = sqlite_path(url) {
        if !creates && !std::path::Path::new(path).exists() {
            return Err(Failure::Other(format!(
                "no SQLite database at `{path}`: check the path in the URL (the workers' \
                 DATABASE_URL), or create an empty one with `tickmark migrate`"
            )));
        }
    }
    let connected = connect_for_one_command(url, schema).await;
    connected.map_err(|error| match error {
        StoreError::UnsupportedUrl(_) | StoreError::BackendNotBuilt(_) => {
            Failure::Usage(error.to_string())
        }
        StoreError::Migration(MigrationError::Unmigrated {
            recorded, needed, ..
        }) => Failure::Refused(format!(
            "the database does not hold tickmark's schema at this build's version (recorded: \
             {}; this build needs {needed}), and this command only reads: it changed nothing. \
             Check --database-url (or DATABASE_URL); to bring the schema up, run `tickmark \
             migrate` (or start the workers, which migrate), then run this again",
            recorded.map_or_else(|| "none".to_owned(), |v| format!("up to {v}"))
        )),
        StoreError::Migration(MigrationError::NewerSchema { recorded, .. }) => {
            migrate::newer_schema(url, recorded)
        }
        // An edited migration: the error says which, and what to do.
        StoreError::Migration(error @ MigrationError::ChecksumMismatch { .. }) => {
            Failure::Refused(error.to_string())
        }
        error => Failure::Other(format!(
            "cannot open the database: {error}; check --database-url (or DATABASE_URL)"
        )),
    })
}

/// Connect as `tickmark::connect` does, but with a PostgreSQL pool sized for
/// one command at a time, which may wait longer for a connection than a
/// receiver that must answer quickly.
async fn connect_for_one_command(
    url: &str,
    schema: SchemaUse,
) -> Result<Arc<dyn Store>, StoreError> {
    #[cfg(feature = "postgres")]
    if tickmark_driver::store::backend_of(url) == Some(tickmark_driver::Backend::Postgres) {
        let options = PostgresOptions {
            max_connections: 2,
            acquire_timeout: std::time::Duration::from_secs(10),
        };
        let store = match schema {
            SchemaUse::Migrate => PostgresStore::connect_with(url, options).await?,
            SchemaUse::ReadOnly => PostgresStore::connect_without_migrating(url, options).await?,
        };
        return Ok(Arc::new(store));
    }
    #[cfg(feature = "sqlite")]
    if tickmark_driver::store::backend_of(url) == Some(tickmark_driver::Backend::Sqlite) {
        let store = match schema {
            SchemaUse::Migrate => SqliteStore::connect(url).await?,
            SchemaUse::ReadOnly => {
                SqliteStore::connect_without_migrating(url, SqliteOptions::default()).await?
            }
        };
        return Ok(Arc::new(store));
    }
    Err(match tickmark_driver::store::backend_of(url) {
        Some(backend) => StoreError::BackendNotBuilt(backend),
        None => StoreError::UnsupportedUrl(tickmark_core::redact_url(url).into_owned()),
    })
}

/// The file of a `sqlite:` URL, unless it is in memory.
fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// How results are printed: tables for people, or one JSON document.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    json: bool,
}

impl Output {
    /// Print `value` as JSON, or what `human` renders.
    pub(crate) fn emit<T: Serialize>(
        &self,
        value: &T,
        human: impl FnOnce() -> String,
    ) -> Result<(), Failure> {
        let text = if self.json {
            let mut text = serde_json::to_string_pretty(value)
                .map_err(|error| Failure::Other(format!("cannot encode JSON: {error}")))?;
            text.push('\n');
            text
        } else {
            // Whatever a command printed, no control character but the
            // line break reaches the terminal (see `printable`).
            printable::block(&human())
        };
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|error| Failure::Other(format!("cannot write the output: {error}")))
    }

    fn fail(&self, failure: Failure) -> ExitCode {
        let code = failure.exit_code();
        let message = failure.message();
        if self.json {
            let error = serde_json::json!({
                "error": { "kind": failure.kind(), "exit_code": code, "message": message }
            });
            eprintln!("{error}");
        } else {
            eprintln!("tickmark: {}", printable::block(&message));
        }
        ExitCode::from(code)
    }
}

/// Why a command did not do what was asked; each kind has its exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Exit 1: the database failed, or something else went wrong.
    Other(String),
    /// Exit 2: the command line cannot be carried out as given.
    Usage(String),
    /// Exit 3: no such event, or no such step.
    NotFound(String),
    /// Exit 4: the event's state does not allow the action.
    Refused(String),
    /// Exit 5: `plans check` found plans this build cannot run.
    Stranded(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Other(_) => 1,
            Failure::Usage(_) => 2,
            Failure::NotFound(_) => 3,
            Failure::Refused(_) => 4,
            Failure::Stranded(_) => 5,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Failure::Other(_) => "error",
            Failure::Usage(_) => "usage",
            Failure::NotFound(_) => "not_found",
            Failure::Refused(_) => "refused",
            Failure::Stranded(_) => "stranded",
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Other(message) => format!("error: {message}"),
            Failure::Usage(message) => format!("usage: {message}"),
            Failure::NotFound(message) => format!("not found: {message}"),
            Failure::Refused(message) => format!("refused: {message}"),
            Failure::Stranded(message) => format!("stranded: {message}"),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(source) => Failure::Other(format!(
                "the database is unavailable ({source}): check that it is running and reachable \
                 from here, then run the command again"
            )),
            error => Failure::Other(error.to_string()),
        }
    }
}

impl From<AdminError> for Failure {
    fn from(error: AdminError) -> Self {
        match error {
            AdminError::NotFound(_) | AdminError::UnknownStep { .. } => {
                Failure::NotFound(error.to_string())
            }
            AdminError::Refused(message) => Failure::Refused(message),
            AdminError::Store(error) => error.into(),
            // `AdminError` is non-exhaustive: a reason this build does not
            // know yet is a refusal, in the error's own words.
            other => Failure::Refused(other.to_string()),
        }
    }
}

/// Who acts, when `--actor` is not given: `$USER@hostname`.
pub(crate) fn default_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .ok()
        .filter(|user| !user.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{user}@{host}")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(sqlite_path("sqlite://var/t.db"), Some("var/t.db"));
        assert_eq!(
            sqlite_path("sqlite:///abs/t.db?mode=rwc"),
            Some("/abs/t.db")
        );
        assert_eq!(sqlite_path("sqlite:t.db"), Some("t.db"));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("postgres://h/db"), None);
    }

    #[test]
    fn every_failure_has_its_exit_code() {
        let refused: Failure = AdminError::Refused("x".into()).into();
        let missing: Failure = AdminError::NotFound("7".into()).into();
        let unknown: Failure = AdminError::UnknownStep {
            event_seq: 1,
            step: "a".into(),
            known: "b".into(),
        }
        .into();
        let other: Failure = StoreError::Corrupt("x".into()).into();
        assert_eq!(
            [refused, missing, unknown, other].map(|f| f.exit_code()),
            [4, 3, 3, 1]
        );
        assert!(EXIT_CODES.contains("4  refused") && AFTER_HELP.contains(EXIT_CODES));
    }
}
