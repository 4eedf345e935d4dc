//! How much of a listener one client may hold, and for how long: the
//! connection and time limits of [`serve`](super::serve) (which
//! `Receiver::serve` and the operations
//! port use alike), the accept queue of [`bind`](super::bind), and the
//! receiver's in-flight cap (`Receiver::router`).
//!
//! Providers send a small body quickly and then wait for the answer, and an
//! operator's browser does too, so the defaults are tight for anything
//! slower: a client that holds a connection without finishing its request is
//! cut off after seconds, not minutes, and the number of connections (in
//! all, and from one address) and of deliveries being handled at once is
//! capped, so that many such clients cannot lock the providers out or grow
//! the process without bound. At the connection caps a newcomer takes the
//! place of a connection that is doing nothing (idle the longest, from the
//! client holding the most; see `connection_table.rs`), and a connection
//! lives at most [`Limits::max_connection_age`], so that clients that keep
//! to every deadline cannot hold the caps either. Where no place can be made
//! the server refuses at once (a closed connection, or 503 with
//! `Retry-After`), it never queues.

use std::time::Duration;

/// The default [`Limits::header_read_timeout`]: 10 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Limits::body_read_timeout`]: 10 s. GitHub gives up on a
/// delivery after 10 s, Shopify after 5 s: no provider takes longer to send.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Limits::write_timeout`]: 10 s. A provider or a browser takes
/// an answer of a few KiB at once; a client that leaves it in the socket for
/// 10 s is not reading.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Limits::shutdown_timeout`]: 10 s, as long as the longest of
/// the other deadlines, so a request that keeps to them finishes.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Limits::max_requests_per_connection`]: 1,000, as nginx's
/// `keepalive_requests`. A provider opens a connection per delivery or keeps
/// one for a burst; 1,000 answers on one connection is a client pipelining.
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: usize = 1000;

/// The default [`Limits::max_connections`]: 512, half of the common limit of
/// 1,024 open files, so that the database, the log and the process's other
/// files always have descriptors left.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The default [`Limits::max_connections_per_address`]: 128, a quarter of
/// [`DEFAULT_MAX_CONNECTIONS`], so that one client cannot take every
/// connection (and at the total cap, a client holding more than its fair
/// share gives up its idle connections first, so four clients cannot hold
/// the cap either). Behind a reverse proxy every connection comes from the
/// proxy's address: raise it to `max_connections` there (the proxy then
/// enforces its own per-client limits; at its share, the proxy's idle
/// keep-alive connections make room for its new ones).
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 128;

/// The default [`Limits::max_connection_age`]: 5 minutes. A client that
/// keeps to every deadline (a request every 9 s, its answers left unread
/// in socket buffers that hold them all) would otherwise keep its
/// connection for hours (1,000 requests at 9 s); 5 minutes returns every
/// connection to the table often, and costs a provider that keeps a
/// connection busy one new handshake per 5 minutes (HTTP clients reopen a
/// connection closed after an answer without failing a request). Load
/// balancers bound connections the same way (Envoy's
/// `max_connection_duration`, gRPC's `MAX_CONNECTION_AGE`).
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(5 * 60);

/// The default [`Limits::accept_backlog`]: 1,024 connections the kernel may
/// hold completed but not yet accepted (what `tokio::net::TcpListener::bind`
/// uses too; Linux caps it at `net.core.somaxconn`).
pub const DEFAULT_ACCEPT_BACKLOG: u32 = 1024;

/// The default [`Limits::max_in_flight`]: 256 deliveries handled at once.
/// The inbox commits many deliveries together, so this is plenty for
/// thousands of deliveries a second.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// What `Retry-After` says when the receiver sheds load (a cap is full).
pub const OVERLOAD_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The connection and time limits of every listener tickmark serves (the
/// receiver, the dashboard and `/metrics`). Start from [`Limits::default`]
/// and change what you need:
///
/// ```
/// use std::time::Duration;
/// use tickmark::serve::Limits;
///
/// let mut limits = Limits::default();
/// limits.max_connections = 2_000; // after `ulimit -n 8192`
/// limits.max_connections_per_address = 2_000; // behind a reverse proxy
/// limits.max_connection_age = Duration::from_secs(60);
/// limits.body_read_timeout = Duration::from_secs(5);
/// # let _ = limits;
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a connection may take to send a complete request head
    /// (request line and headers), counted from the moment the server waits
    /// for one: from the accept for the first request, from the previous
    /// answer on a kept-alive connection. So this is **also the idle
    /// keep-alive timeout**: hyper runs one timer for both, and a connection
    /// that sends nothing, or a header byte now and then, is closed when it
    /// runs out. Applies to [`serve`](super::serve).
    pub header_read_timeout: Duration,
    /// How long a request may take to send its whole body, counted from the
    /// end of its head. A body still arriving then is refused with 408
    /// `body_timeout` and the connection is closed (the dashboard's forms:
    /// 408). Applies to [`serve`](super::serve), and to
    /// `Receiver::router` however it is
    /// served.
    pub body_read_timeout: Duration,
    /// How long the server's answers may wait for the client to take them:
    /// the deadline starts when the socket's send buffer is full (the client
    /// is not reading) and restarts when everything written so far has been
    /// taken. At the deadline the connection is closed. This is what frees a
    /// connection that pipelines requests and never reads the answers (the
    /// header-read timeout does not run while the server waits to write).
    /// Applies to [`serve`](super::serve).
    pub write_timeout: Duration,
    /// Most requests answered on one connection: the answer to the last one
    /// says `Connection: close` and the connection is closed after it. With
    /// [`Limits::write_timeout`] this bounds what one pipelining client can
    /// make the server do on one connection; hyper's read buffer (64 KiB)
    /// bounds what it holds of requests not yet answered. Applies to
    /// [`serve`](super::serve).
    pub max_requests_per_connection: usize,
    /// After the shutdown signal: how long the open connections may take to
    /// finish their requests (idle ones are closed at once). Connections
    /// still open then are closed, so a stop never waits on a client.
    /// Applies to [`serve`](super::serve).
    pub shutdown_timeout: Duration,
    /// Most connections open at once. A connection accepted at the cap
    /// takes the place of one that is *idle* (no request of it in the
    /// service: not yet sent a complete head, between requests, or its
    /// answers unread), which is closed: the one idle the longest of a
    /// client holding more than its fair share (the cap divided by the
    /// clients holding connections), else of anyone; else the one busy the
    /// longest of a client over its fair share. A newcomer whose client
    /// already holds its fair share may only replace its own idle
    /// connection. With no place to make, the newcomer is answered `503`
    /// with `Retry-After` (best effort) and closed at once, before anything
    /// is read. Keep it below the process's open-file limit (`ulimit -n`).
    /// Applies to [`serve`](super::serve).
    pub max_connections: usize,
    /// Most connections open at once from one client address (an IPv4
    /// address, or an IPv6 /64: one host's share of addresses). A connection
    /// beyond it takes the place of that client's own connection idle the
    /// longest, or, with none idle, is refused as at `max_connections`.
    /// Applies to [`serve`](super::serve); see
    /// [`DEFAULT_MAX_CONNECTIONS_PER_ADDRESS`] for reverse proxies.
    pub max_connections_per_address: usize,
    /// Longest a connection stays open: then it is closed gracefully (the
    /// request in progress is answered with `Connection: close`, an idle
    /// connection is closed at once), and closed outright if it has not
    /// finished [`Limits::shutdown_timeout`] later. Applies to
    /// [`serve`](super::serve); see [`DEFAULT_MAX_CONNECTION_AGE`].
    pub max_connection_age: Duration,
    /// How many connections the kernel may queue, handshake done, before
    /// they are accepted (the `listen(2)` backlog). Connections beyond it
    /// wait in SYN retries or are refused by the kernel. Applies to
    /// [`bind`](super::bind).
    pub accept_backlog: u32,
    /// Most deliveries (`POST /hooks/…`) handled at once, from the end of the
    /// head to the answer. A delivery beyond it is answered 503
    /// `overloaded` with `Retry-After` at once, its body unread. `/healthz`
    /// is not counted. Applies to
    /// `Receiver::router`.
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_requests_per_connection: DEFAULT_MAX_REQUESTS_PER_CONNECTION,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_connection_age: DEFAULT_MAX_CONNECTION_AGE,
            accept_backlog: DEFAULT_ACCEPT_BACKLOG,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl Limits {
    /// The same limits, with zero caps and timeouts raised to the smallest
    /// workable value (a zero cap would refuse everything; a zero timeout
    /// would cut every request).
    pub fn sanitised(self) -> Self {
        let at_least = |d: Duration| d.max(Duration::from_millis(1));
        Self {
            header_read_timeout: at_least(self.header_read_timeout),
            body_read_timeout: at_least(self.body_read_timeout),
            write_timeout: at_least(self.write_timeout),
            max_requests_per_connection: self.max_requests_per_connection.max(1),
            // Zero is a workable shutdown deadline: close everything at once.
            shutdown_timeout: self.shutdown_timeout,
            max_connections: self.max_connections.max(1),
            max_connections_per_address: self.max_connections_per_address.max(1),
            max_connection_age: at_least(self.max_connection_age),
            accept_backlog: self.accept_backlog.max(1),
            max_in_flight: self.max_in_flight.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_limits_become_workable() {
        let zero = Limits {
            header_read_timeout: Duration::ZERO,
            body_read_timeout: Duration::ZERO,
            write_timeout: Duration::ZERO,
            max_requests_per_connection: 0,
            shutdown_timeout: Duration::ZERO,
            max_connections: 0,
            max_connections_per_address: 0,
            max_connection_age: Duration::ZERO,
            accept_backlog: 0,
            max_in_flight: 0,
        }
        .sanitised();
        assert_eq!((zero.max_connections, zero.max_in_flight), (1, 1));
        assert_eq!(
            (zero.max_connections_per_address, zero.accept_backlog),
            (1, 1)
        );
        assert!(zero.header_read_timeout > Duration::ZERO);
        assert!(zero.body_read_timeout > Duration::ZERO);
        assert!(zero.write_timeout > Duration::ZERO);
        assert!(zero.max_connection_age > Duration::ZERO);
        assert_eq!(zero.max_requests_per_connection, 1);
        assert_eq!(Limits::default().sanitised(), Limits::default());
    }
}
