//! Wake-ups for idle workers: `LISTEN/NOTIFY` on PostgreSQL, an in-process
//! signal on SQLite. Either can be missed (a dropped listener connection,
//! another process writing the SQLite file), so workers also poll, slowly.

#[cfg(feature = "postgres")]
use sqlx::postgres::PgListener;
use tokio::sync::watch;

/// A subscription to "events were accepted".
#[derive(Debug)]
pub struct Wakeups {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Local(watch::Receiver<u64>),
    /// No subscription: the caller's polling finds new events.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    None,
    #[cfg(feature = "postgres")]
    Postgres(Box<PgListener>),
}

impl Wakeups {
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    #[doc(hidden)]
    pub fn local(receiver: watch::Receiver<u64>) -> Self {
        Self {
            inner: Inner::Local(receiver),
        }
    }

    /// Never wakes: through a transaction pooler without a `listen_url`
    /// there is no connection to `LISTEN` on, and workers poll.
    #[cfg(feature = "postgres")]
    pub fn none() -> Self {
        Self { inner: Inner::None }
    }

    #[cfg(feature = "postgres")]
    #[doc(hidden)]
    pub fn postgres(listener: PgListener) -> Self {
        Self {
            inner: Inner::Postgres(Box::new(listener)),
        }
    }

    /// Wait until something may have been accepted. Spurious wake-ups are
    /// allowed; a broken subscription waits a second and wakes (the caller polls).
    pub async fn wait(&mut self) {
        match &mut self.inner {
            Inner::Local(receiver) => {
                if receiver.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            Inner::None => std::future::pending::<()>().await,
            #[cfg(feature = "postgres")]
            Inner::Postgres(listener) => match listener.recv().await {
                Ok(_) => {
                    // Drain what is already buffered: one claim serves them all.
                    while listener.next_buffered().is_some() {}
                }
                Err(error) => {
                    tracing::debug!(%error, "LISTEN connection lost; polling until it is back");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            },
        }
    }
}
