//! One connection's life after the accept: served until the client or hyper
//! ends it, or until something ends it from outside:
//!
//! | what | how the connection ends |
//! |---|---|
//! | it reaches [`Limits::max_connection_age`] | gracefully: the request in progress is answered (with `Connection: close`), an idle connection is closed at once; whatever is left after [`Limits::shutdown_timeout`] more is closed |
//! | the server stops | gracefully, the same way |
//! | another connection takes its place ([`ConnectionTable`]) | at once: it was idle, or its client holds more than its share |
//! | the shutdown deadline passes | at once |
//!
//! hyper's `graceful_shutdown` does the graceful part (it stops keep-alive
//! and closes an idle connection); hyper-util's `GracefulShutdown` would
//! signal every connection at once, and a connection's own age needs it
//! one at a time, so the signals are tokens and a timer here.
//!
//! [`Limits::max_connection_age`]: super::Limits::max_connection_age
//! [`Limits::shutdown_timeout`]: super::Limits::shutdown_timeout
//! [`ConnectionTable`]: super::connection_table::ConnectionTable

use std::error::Error as StdError;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::HttpService;
use tokio_util::sync::CancellationToken;

/// What ends a connection from outside.
#[derive(Debug, Clone)]
pub struct Ends {
    /// Cancelled when the server stops accepting: finish, then close.
    pub drain: CancellationToken,
    /// Cancelled at the shutdown deadline: close now.
    pub close_all: CancellationToken,
    /// How long the connection may stay open before it is drained.
    pub max_age: Duration,
    /// How long a drained connection may take to finish.
    pub grace: Duration,
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// hyper is done with it: the client closed it, a deadline of hyper's
    /// or the write deadline passed, or it was drained and finished.
    Served,
    /// Another connection took its place.
    Replaced,
    /// Drained (too old, or the server stopping) and not finished in time.
    GraceExpired,
    /// The server's shutdown deadline passed.
    ShutdownDeadline,
}

/// Serve `connection` until it ends (see the module's table); `evicted` is
/// its place's token in the connection table.
pub async fn run<I, S, B>(
    connection: http1::Connection<I, S>,
    ends: Ends,
    evicted: CancellationToken,
) -> End
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: Body + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    tokio::pin!(connection);
    let too_old = tokio::time::sleep(ends.max_age);
    tokio::pin!(too_old);
    // Set once the connection is drained: the end of its grace.
    let mut grace_ends: Option<tokio::time::Instant> = None;
    loop {
        let drain_now = tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    // Timeouts, resets and malformed requests end up here:
                    // the client's doing, not an error of this process.
                    tracing::debug!(%error, "connection closed");
                }
                return End::Served;
            }
            () = evicted.cancelled() => return End::Replaced,
            () = ends.close_all.cancelled() => return End::ShutdownDeadline,
            () = wait_until(grace_ends) => return End::GraceExpired,
            () = ends.drain.cancelled(), if grace_ends.is_none() => "the server stops",
            () = &mut too_old, if grace_ends.is_none() => "it reached max_connection_age",
        };
        tracing::debug!(
            why = drain_now,
            "closing the connection after its request in progress"
        );
        connection.as_mut().graceful_shutdown();
        grace_ends = Some(tokio::time::Instant::now() + ends.grace);
    }
}

/// Complete at `deadline`; never without one.
async fn wait_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
