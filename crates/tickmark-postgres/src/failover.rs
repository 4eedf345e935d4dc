//! Following the primary across a failover.
//!
//! With several hosts in the URL (`hosts.rs`), the pool is pointed at the
//! first one that suits `target_session_attrs` (with `read-write`: the one
//! that accepts writes). A background task then checks that host every
//! [`PROBE_EVERY`] on a connection of its own; when it stops answering, or
//! becomes read-only, the task probes the hosts in order until one suits,
//! points the pool at it ([`Pool::set_connect_options`]) and makes the pool
//! drop every connection made before the switch (`before_acquire`). No
//! restart: in-flight statements on the old host fail as transient errors
//! (the receiver answers 503, workers back off) and the next ones run on the
//! new primary. The task ends when the last clone of the store is dropped.
//!
//! [`Pool::set_connect_options`]: sqlx::Pool::set_connect_options

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::hosts::{HostList, SessionAttrs};
use super::pooler::Pooler;
use tickmark_driver::store::StoreError;

/// How often the task checks that the pool's host still suits.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// How long a probe waits for one host to accept a connection (a host that
/// vanished from the network answers nothing; a stopped one refuses at once).
const PROBE_CONNECT: Duration = Duration::from_secs(2);

/// Whether the server accepts writes (libpq's `read-write` check, plus
/// recovery: a hot standby is read-only whatever its settings say).
const ACCEPTS_WRITES: &str =
    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'";

/// Keeps the task that follows the primary alive; dropping the last clone
/// stops it.
#[derive(Debug, Clone)]
pub(super) struct Follower {
    _stop: Arc<DropGuard>,
}

/// A pool on the host of `list` that suits its `target_session_attrs`, and,
/// when the list names several hosts, the task that keeps it there.
/// Through a transaction pooler, connections keep no statement cache
/// (`pooler.rs`).
pub(super) async fn connect(
    list: HostList,
    pool_options: PgPoolOptions,
    pooler: Pooler,
) -> Result<(PgPool, Option<Follower>), StoreError> {
    let options = list
        .hosts
        .iter()
        .map(|host| {
            let options = host.options()?;
            Ok(if pooler.per_transaction() {
                options.statement_cache_capacity(0)
            } else {
                options
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    if list.hosts.len() == 1 && list.attrs == SessionAttrs::Any {
        // One host, no condition: the pool as sqlx makes it.
        return Ok((pool_options.connect_with(options[0].clone()).await?, None));
    }
    let (current, watch) = find(&list, &options).await?;
    if list.hosts.len() == 1 {
        // `read-write` on one host: checked once, as libpq does; the
        // statements that write fail (25006, transient) if it changes.
        drop(watch);
        return Ok((pool_options.connect_with(options[0].clone()).await?, None));
    }
    let last_switch = Arc::new(LastSwitch::default());
    let pool = {
        let last_switch = Arc::clone(&last_switch);
        pool_options
            .before_acquire(move |_, meta| {
                let fresh = last_switch.made_since(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(options[current].clone())
            .await?
    };
    tracing::info!(host = %list.hosts[current].name, "connected to the database host that suits target_session_attrs");
    let stop = CancellationToken::new();
    tokio::spawn(
        Follow {
            pool: pool.clone(),
            list,
            options,
            current,
            watch: Some(watch),
            last_switch,
        }
        .run(stop.clone()),
    );
    Ok((
        pool,
        Some(Follower {
            _stop: Arc::new(stop.drop_guard()),
        }),
    ))
}

/// When the pool last moved to another host.
#[derive(Debug, Default)]
struct LastSwitch(Mutex<Option<Instant>>);

impl LastSwitch {
    fn record(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// Whether a connection `age` old was made after the last switch (a
    /// connection to the old host is dropped rather than used).
    fn made_since(&self, age: Duration) -> bool {
        match *self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(at) => at.elapsed() >= age,
            None => true,
        }
    }
}

/// The task that keeps the pool on a host that suits.
struct Follow {
    pool: PgPool,
    list: HostList,
    options: Vec<PgConnectOptions>,
    current: usize,
    /// A connection of the task's own to the current host.
    watch: Option<PgConnection>,
    last_switch: Arc<LastSwitch>,
}

impl Follow {
    async fn run(mut self, stop: CancellationToken) {
        let mut looking_since: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(PROBE_EVERY) => {}
            }
            if let Some(watch) = self.watch.as_mut() {
                if matches!(suits(watch, self.list.attrs).await, Ok(true)) {
                    continue;
                }
            }
            self.watch = None;
            if looking_since.is_none() {
                looking_since = Some(Instant::now());
                tracing::warn!(
                    host = %self.list.hosts[self.current].name,
                    "the database host stopped answering or no longer accepts writes; \
                     looking for the new primary"
                );
            }
            let found = tokio::select! {
                _ = stop.cancelled() => return,
                found = find(&self.list, &self.options) => found,
            };
            let Ok((index, watch)) = found else {
                // Nothing suits yet (the standby is not promoted): next round.
                continue;
            };
            self.watch = Some(watch);
            let searched_ms = looking_since
                .take()
                .map_or(0, |since| since.elapsed().as_millis() as u64);
            if index == self.current {
                tracing::info!(host = %self.list.hosts[index].name, searched_ms, "the database host is back");
                continue;
            }
            self.pool.set_connect_options(self.options[index].clone());
            self.last_switch.record();
            tracing::info!(
                host = %self.list.hosts[index].name,
                from = %self.list.hosts[self.current].name,
                searched_ms,
                "the database pool moved to the new primary"
            );
            self.current = index;
        }
    }
}

/// The first host, in the list's order, that suits, with a connection to it.
async fn find(
    list: &HostList,
    options: &[PgConnectOptions],
) -> Result<(usize, PgConnection), StoreError> {
    let mut reasons = Vec::new();
    let mut worth_retrying = false;
    let mut first_error = None;
    for (index, (host, options)) in list.hosts.iter().zip(options).enumerate() {
        match probe(options, list.attrs).await {
            Ok(Some(conn)) => return Ok((index, conn)),
            Ok(None) => {
                worth_retrying = true;
                reasons.push(format!("{}: read-only (a standby?)", host.name));
            }
            Err(error) => {
                worth_retrying |= error.is_transient();
                reasons.push(format!("{}: {error}", host.name));
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        // Every host refused for a reason a retry will not fix (a wrong
        // password, a missing database): say that reason.
        Some(error) if !worth_retrying => Err(error),
        _ => Err(StoreError::NoWritableHost(reasons.join("; "))),
    }
}

/// A connection to the host, if it suits; `None` if it answers but does not.
async fn probe(
    options: &PgConnectOptions,
    attrs: SessionAttrs,
) -> Result<Option<PgConnection>, StoreError> {
    let mut conn = tokio::time::timeout(PROBE_CONNECT, PgConnection::connect_with(options))
        .await
        .map_err(|_| {
            StoreError::Unavailable(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {PROBE_CONNECT:?}"),
            )))
        })??;
    if suits(&mut conn, attrs).await? {
        Ok(Some(conn))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

/// Whether the server at the other end of `conn` suits `attrs`.
async fn suits(conn: &mut PgConnection, attrs: SessionAttrs) -> Result<bool, sqlx::Error> {
    let check = async {
        match attrs {
            SessionAttrs::Any => conn.ping().await.map(|()| true),
            SessionAttrs::ReadWrite => sqlx::query_scalar(ACCEPTS_WRITES).fetch_one(conn).await,
        }
    };
    // A host that stopped answering mid-check counts as gone.
    tokio::time::timeout(PROBE_CONNECT, check)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {PROBE_CONNECT:?}"),
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_made_before_a_switch_are_dropped_and_later_ones_kept() {
        let last_switch = LastSwitch::default();
        assert!(
            last_switch.made_since(Duration::from_secs(3600)),
            "no switch yet"
        );
        last_switch.record();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !last_switch.made_since(Duration::from_secs(1)),
            "made before"
        );
        assert!(
            last_switch.made_since(Duration::from_millis(1)),
            "made after"
        );
    }
}
