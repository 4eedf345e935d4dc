//! The accept loop: a router served on a listener within the connection
//! limits: a table of the open connections with a cap in all and per client
//! address, where a newcomer at a cap replaces a connection idle the longest
//! rather than being refused ([`ConnectionTable`]), hyper's header-read
//! timeout (which is also the idle keep-alive timeout), a write deadline
//! ([`WriteDeadline`]), a cap on the requests one connection is answered, a
//! bound on a connection's age, and a deadline on the graceful shutdown
//! ([`connection_life`]).
//!
//! Why not `axum::serve`: it exposes neither hyper's `header_read_timeout`
//! nor a connection cap, and a listener on the internet needs both (a client
//! that connects and sends nothing would otherwise hold its connection, and a
//! file descriptor, for ever). So this is axum's accept loop with those
//! added, and everything else left to the libraries: hyper's HTTP/1
//! connection builder with tokio's timer and its graceful shutdown, and the
//! axum router as the hyper service. The hand-written parts are the
//! connection table, the canned 503 written to a connection refused, before
//! closing it, the write deadline, the count of answers per connection (the
//! last says `Connection: close`, which hyper honours), marking a connection
//! busy while a request of it is in the service, ending connections from
//! outside ([`connection_life`]), and the peer address put in each request's
//! extensions as axum's [`ConnectInfo`], as
//! `into_make_service_with_connect_info` would.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tower_http::timeout::RequestBodyDeadlineLayer;

use super::connection_life::{self, End, Ends};
use super::connection_table::ConnectionTable;
use super::limits::{Limits, OVERLOAD_RETRY_AFTER};
use super::write_deadline::WriteDeadline;

/// hyper's buffer per connection: what it holds of a request head, and of
/// pipelined requests not yet answered (hyper's default is about 400 KiB).
/// 64 KiB takes any head a provider or a browser sends (nginx takes 32 KiB
/// by default) and keeps 512 pipelining clients to 32 MiB.
const CONNECTION_BUFFER_BYTES: usize = 64 * 1024;

/// What a connection refused at a cap is sent before it is closed: the same
/// JSON refusal as an overloaded delivery, as raw bytes because nothing of
/// the request has been read.
static REFUSED: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let body = serde_json::json!({
        "status": "error",
        "error": "overloaded",
        "message": "too many open connections: retry in a moment",
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        OVERLOAD_RETRY_AFTER.as_secs().max(1),
        body.len()
    )
    .into_bytes()
});

/// How long to wait before accepting again after an accept error that is not
/// about one connection (out of file descriptors, most often): long enough
/// for connections to close, short enough that providers barely notice.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(250);

/// Accept connections on `listener` and serve `router` on each, within
/// `limits`, until `shutdown` completes; then stop accepting, let the open
/// connections finish their requests (idle ones are closed at once), and
/// return.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let limits = limits.sanitised();
    let connections =
        ConnectionTable::new(limits.max_connections, limits.max_connections_per_address);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(CONNECTION_BUFFER_BYTES);
    let ends = Ends {
        drain: CancellationToken::new(),
        // Cancelled when the graceful shutdown's deadline passes: every
        // connection still open is then closed.
        close_all: CancellationToken::new(),
        max_age: limits.max_connection_age,
        grace: limits.shutdown_timeout,
    };
    // Each connection's task holds a sender: the channel closes with the
    // last of them.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    // Every route's body within the body-read timeout (the receiver's
    // deliveries have the same deadline of their own, for other servers).
    let router = router.layer(RequestBodyDeadlineLayer::new(limits.body_read_timeout));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    pause_after(error).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let admitted = match connections.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                refuse(stream, refusal.why());
                continue;
            }
        };
        if admitted.replaced_another {
            tracing::debug!(
                %peer,
                "at a connection cap: closed a connection idle the longest to make room"
            );
        }
        let place = admitted.place;
        // Answers are small and written at once: do not hold them back.
        let _ = stream.set_nodelay(true);
        // hyper may clone the service: the count is the connection's.
        let answered = Arc::new(AtomicUsize::new(0));
        let max_requests = limits.max_requests_per_connection;
        let activity = place.activity();
        let service = router
            .clone()
            .map_request(move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            })
            // Busy from hyper's first poll of the request's future until the
            // answer is produced: the connection table replaces idle
            // connections first. From the first poll, not the call: a
            // request hyper holds unpolled (its answers before it not yet
            // written) is not being worked on.
            .map_future(move |answer| {
                let activity = activity.clone();
                async move {
                    let in_flight = activity.request();
                    let answer = answer.await;
                    drop(in_flight);
                    answer
                }
            })
            .map_response(move |mut response: axum::response::Response| {
                if answered.fetch_add(1, Ordering::Relaxed) + 1 >= max_requests {
                    response.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
                response
            });
        let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
        let connection = builder.serve_connection(io, TowerToHyperService::new(service));
        let ends = ends.clone();
        let open = open_tx.clone();
        tokio::spawn(async move {
            let evicted = place.evicted();
            match connection_life::run(connection, ends, evicted).await {
                End::Served => {}
                End::Replaced => {
                    tracing::debug!(%peer, "connection closed to make room for another")
                }
                End::GraceExpired => {
                    tracing::debug!(%peer, "connection closed at the end of its grace")
                }
                End::ShutdownDeadline => {
                    tracing::debug!(%peer, "connection closed at the shutdown deadline")
                }
            }
            drop((place, open));
        });
    }
    drop(listener);
    tracing::debug!(
        open = connections.len(),
        "no longer accepting; waiting for open connections"
    );
    ends.drain.cancel();
    drop(open_tx);
    if tokio::time::timeout(limits.shutdown_timeout, open_rx.recv())
        .await
        .is_err()
    {
        tracing::info!(
            deadline = ?limits.shutdown_timeout,
            "connections still open at the shutdown deadline are closed"
        );
        ends.close_all.cancel();
    }
    Ok(())
}

/// Send a connection refused at a cap the canned 503, if its socket takes it
/// without waiting, and close it. Nothing is read from it.
fn refuse(stream: TcpStream, why: &'static str) {
    let _ = stream.try_write(&REFUSED);
    tracing::debug!(why, "connection refused");
    drop(stream);
}

/// After an accept error: per-connection errors (the client went away before
/// the accept) are skipped; others (out of file descriptors) are logged and
/// accepting pauses briefly, so the loop does not spin.
async fn pause_after(error: io::Error) {
    if matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::warn!(%error, "accepting a connection failed; pausing briefly (out of file descriptors? see Limits::max_connections)");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canned_refusal_is_a_complete_response() {
        let text = std::str::from_utf8(&REFUSED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"], "overloaded");
    }

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Longest wait for the server to do what it should within a second:
    /// wide, for a loaded 2-core machine.
    const PATIENCE: Duration = Duration::from_secs(30);

    /// `GET /ping` served on a loopback port within `limits`; `pings`
    /// counts the answers.
    async fn ping_server(
        limits: Limits,
        pings: Arc<AtomicUsize>,
    ) -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route(
            "/ping",
            axum::routing::get(move || {
                pings.fetch_add(1, Ordering::Relaxed);
                async { "pong" }
            }),
        );
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(serve(listener, router, limits, async move {
            stopped.cancelled().await
        }));
        (addr, stop)
    }

    /// Send `GET /ping` and read its answer on a kept-alive connection, again
    /// and again, until the server closes it: how many answers came. (The
    /// server closes it after an answer that says `connection: close`, or,
    /// between two requests, at once.)
    async fn ping_until_closed(stream: &mut TcpStream) -> usize {
        let mut answers = 0;
        loop {
            if stream
                .write_all(b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .is_err()
            {
                return answers;
            }
            let mut answer = Vec::new();
            let mut buffer = [0u8; 1024];
            while !answer.ends_with(b"pong") {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return answers,
                    Ok(n) => answer.extend_from_slice(&buffer[..n]),
                }
            }
            answers += 1;
        }
    }

    /// A connection to `server` from the loopback address `from`, with a
    /// 4 KiB receive buffer.
    async fn connect_from(from: [u8; 4], server: std::net::SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket
            .bind((std::net::Ipv4Addr::from(from), 0).into())
            .unwrap();
        socket.connect(server).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_never_reads_its_answers_is_idle_and_makes_room() {
        // One connection in all; only the connection table can free it.
        let limits = Limits {
            max_connections: 1,
            write_timeout: Duration::from_secs(3600),
            header_read_timeout: Duration::from_secs(3600),
            max_requests_per_connection: usize::MAX,
            ..Limits::default()
        };
        let pings = Arc::new(AtomicUsize::new(0));
        let (addr, stop) = ping_server(limits, Arc::clone(&pings)).await;
        // 60,000 pipelined requests through a 4 KiB receive buffer, never
        // read: their answers back up, and hyper holds the next request
        // unpolled until they are written.
        let mut pipelining = connect_from([127, 0, 0, 2], addr).await;
        let flood = tokio::spawn(async move {
            let burst = b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n".repeat(60_000);
            let _ = pipelining.write_all(&burst).await;
            // Closed by the server (or all written): wait for the close.
            let _ = pipelining
                .write_all(b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n")
                .await;
            while pipelining.write_all(b"G").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        // While hyper works on its requests the connection is busy (idle
        // only between an answer and the next request, for microseconds)
        // and a newcomer is refused; once its answers back up it is idle,
        // and a newcomer from another address takes its place. Newcomers
        // come once the flood is under way, not while the connection is
        // idle before its first request.
        let started = tokio::time::Instant::now();
        while pings.load(Ordering::Relaxed) < 1000 {
            assert!(started.elapsed() < PATIENCE, "the flood is not served");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        loop {
            let mut newcomer = connect_from([127, 0, 0, 3], addr).await;
            let _ = newcomer
                .write_all(b"GET /ping HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
            let mut answer = Vec::new();
            let _ = newcomer.read_to_end(&mut answer).await;
            if answer.starts_with(b"HTTP/1.1 200") {
                break;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "a newcomer still refused after {PATIENCE:?}: {}",
                String::from_utf8_lossy(&answer)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::timeout(PATIENCE, flood)
            .await
            .expect("the pipelining connection is closed to make room")
            .unwrap();
        stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_is_closed_at_its_max_age_busy_or_idle() {
        // No other limit can end these connections within the test: the
        // idle timer is an hour, the requests per connection unbounded.
        let limits = Limits {
            max_connection_age: Duration::from_millis(300),
            header_read_timeout: Duration::from_secs(3600),
            max_requests_per_connection: usize::MAX,
            ..Limits::default()
        };
        let (addr, stop) = ping_server(limits, Arc::default()).await;

        // A client that never stops asking: served, then closed.
        let mut busy = TcpStream::connect(addr).await.unwrap();
        let answers = tokio::time::timeout(PATIENCE, ping_until_closed(&mut busy))
            .await
            .expect("the server closes a connection past its max age");
        assert!(answers >= 1, "closed before its first answer");

        // A client that sends nothing: closed too.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut buffer = [0u8; 64];
        let read = tokio::time::timeout(PATIENCE, silent.read(&mut buffer))
            .await
            .expect("the server closes a silent connection past its max age");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_outlives_its_connections_age_is_cut_after_the_grace() {
        // A handler that never answers, and no deadline of its own: only
        // the end of the grace after max_connection_age closes it.
        let limits = Limits {
            max_connection_age: Duration::from_millis(300),
            shutdown_timeout: Duration::from_millis(300),
            header_read_timeout: Duration::from_secs(3600),
            ..Limits::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route(
            "/hang",
            axum::routing::get(std::future::pending::<&'static str>),
        );
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(serve(listener, router, limits, async move {
            stopped.cancelled().await
        }));
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut received = Vec::new();
        let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
            .await
            .expect("the server closes a connection whose request outlives its age and grace");
        assert!(
            received.is_empty() || read.is_err(),
            "no answer: {}",
            String::from_utf8_lossy(&received)
        );
        stop.cancel();
    }
}
