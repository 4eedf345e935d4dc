//! Serving a router on the internet: every listener tickmark serves (the
//! webhook receiver, the dashboard, `/metrics`) goes through [`serve`], with
//! one set of [`Limits`]:
//!
//! | limit | what it stops |
//! |---|---|
//! | [`Limits::header_read_timeout`] (also the idle keep-alive timeout) | a client that connects and sends nothing, or its head a byte at a time (slowloris) |
//! | [`Limits::body_read_timeout`] | a body sent a byte a second: 408 at the deadline |
//! | [`Limits::write_timeout`] | a client that pipelines requests and never reads the answers |
//! | [`Limits::max_requests_per_connection`] | one connection made to answer requests without end |
//! | [`Limits::shutdown_timeout`] | a stop that waits on a client: what is open at the deadline is closed |
//! | [`Limits::max_connections`] | more connections than the process has file descriptors for, and a few clients holding them all: at the cap a newcomer takes the place of the connection idle the longest (of a client over its fair share first), which is closed; 503 and close, at once, only when every connection has a request in progress and no client holds more than its share |
//! | [`Limits::max_connections_per_address`] | one client holding every connection: beyond it, the client's own connection idle the longest makes room, else 503 and close, at once |
//! | [`Limits::max_connection_age`] | a client that keeps to every deadline (a request every 9 s, its answers never read) holding its connection for hours: closed gracefully at this age |
//! | [`Limits::accept_backlog`] ([`bind`]) | the kernel's queue of connections not yet accepted |
//!
//! Requests served here carry the client's address as axum's
//! [`ConnectInfo`](axum::extract::ConnectInfo)`<SocketAddr>` (the dashboard's
//! sign-in throttle reads it). `axum::serve` works too, with none of these
//! limits: keep it for private addresses.
//!
//! ```no_run
//! use tickmark::serve::{bind, serve, Limits};
//! use tickmark::{Engine, Handlers, Receiver};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(tickmark::connect("sqlite://app.db").await?, Handlers::new())?;
//! let limits = Limits::default();
//! let ops = tickmark::ops::router(engine.clone(), None);
//! let listener = bind("127.0.0.1:9090".parse()?, &limits).await?;
//! tokio::spawn(serve(listener, ops, limits, std::future::pending()));
//! let webhooks = Receiver::new(engine).limits(limits);
//! let listener = bind("0.0.0.0:8080".parse()?, &limits).await?;
//! webhooks.serve(listener, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

// Attacker input reaches everything here: nothing that can panic compiles
// outside tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::string_slice
    )
)]

mod accept_loop;
mod client_key;
mod connection_life;
mod connection_table;
mod limits;
mod write_deadline;

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use axum::Router;
use tokio::net::{TcpListener, TcpSocket};

pub use limits::{
    Limits, DEFAULT_ACCEPT_BACKLOG, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, DEFAULT_MAX_CONNECTION_AGE,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_REQUESTS_PER_CONNECTION, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WRITE_TIMEOUT, OVERLOAD_RETRY_AFTER,
};

/// Serve `router` on `listener` within `limits` until `shutdown` completes;
/// then stop accepting, let the open connections finish their requests
/// (idle ones are closed at once) for at most [`Limits::shutdown_timeout`],
/// close the rest, and return. Every route's body must arrive within
/// [`Limits::body_read_timeout`]; a connection's head within
/// [`Limits::header_read_timeout`]; its answers must be taken within
/// [`Limits::write_timeout`]; a connection lives at most
/// [`Limits::max_connection_age`]. At [`Limits::max_connections`] or
/// [`Limits::max_connections_per_address`] a newcomer takes the place of
/// an idle connection (see those fields), or, with none to take, gets a
/// canned 503 and is closed before anything is read.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    accept_loop::serve(listener, router, limits, shutdown).await
}

/// A listener on `addr` whose accept queue holds at most
/// [`Limits::accept_backlog`] connections (address reuse on, as
/// `TcpListener::bind` does on unix).
pub async fn bind(addr: SocketAddr, limits: &Limits) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(limits.sanitised().accept_backlog)
}
