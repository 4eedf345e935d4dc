//! The accept loop: a router served on a listener within the connection
//! limits: a cap on open connections, in all and per client address,
//! hyper's header-read timeout (which is also the idle keep-alive timeout),
//! a write deadline ([`WriteDeadline`]), a cap on the requests one
//! connection is answered, and a deadline on the graceful shutdown.
//!
//! Why not `axum::serve`: it exposes neither hyper's `header_read_timeout`
//! nor a connection cap, and a listener on the internet needs both (a client
//! that connects and sends nothing would otherwise hold its connection, and a
//! file descriptor, for ever). So this is axum's accept loop with those
//! added, and everything else left to the libraries: hyper's HTTP/1
//! connection builder with tokio's timer, hyper-util's graceful shutdown, and
//! the axum router as the hyper service. The hand-written parts are the caps
//! (a semaphore: a permit per connection, tried without waiting; and the
//! per-address shares), the canned 503 written to a connection refused
//! beyond them, before closing it, the write deadline, the count of answers
//! per connection (the last says `Connection: close`, which hyper honours),
//! closing what the graceful shutdown left open at its deadline, and the
//! peer address put in each request's extensions as axum's [`ConnectInfo`],
//! as `into_make_service_with_connect_info` would.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tower_http::timeout::RequestBodyDeadlineLayer;

use super::address_share::AddressShares;
use super::limits::{Limits, OVERLOAD_RETRY_AFTER};
use super::write_deadline::WriteDeadline;

/// hyper's buffer per connection: what it holds of a request head, and of
/// pipelined requests not yet answered (hyper's default is about 400 KiB).
/// 64 KiB takes any head a provider or a browser sends (nginx takes 32 KiB
/// by default) and keeps 512 pipelining clients to 32 MiB.
const CONNECTION_BUFFER_BYTES: usize = 64 * 1024;

/// What a connection beyond the cap is sent before it is closed: the same
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
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let limits = limits.sanitised();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let shares = AddressShares::new(limits.max_connections_per_address);
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(CONNECTION_BUFFER_BYTES);
    // Cancelled when the graceful shutdown's deadline passes: every
    // connection still open is then closed.
    let close_all = CancellationToken::new();
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
        let Some(share) = shares.try_take(peer.ip()) else {
            refuse(stream, "this address holds its share of connections");
            continue;
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            refuse(stream, "too many open");
            continue;
        };
        // Answers are small and written at once: do not hold them back.
        let _ = stream.set_nodelay(true);
        // hyper may clone the service: the count is the connection's.
        let answered = Arc::new(AtomicUsize::new(0));
        let max_requests = limits.max_requests_per_connection;
        let service = router
            .clone()
            .map_request(move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
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
        let connection = graceful.watch(connection);
        let close = close_all.clone();
        tokio::spawn(async move {
            tokio::select! {
                served = connection => if let Err(error) = served {
                    // Timeouts, resets and malformed requests end up here:
                    // the client's doing, not an error of this process.
                    tracing::debug!(%error, "connection closed");
                },
                () = close.cancelled() => {
                    tracing::debug!("connection closed at the shutdown deadline");
                }
            }
            drop((permit, share));
        });
    }
    drop(listener);
    tracing::debug!(
        open = graceful.count(),
        "no longer accepting; waiting for open connections"
    );
    if tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            deadline = ?limits.shutdown_timeout,
            "connections still open at the shutdown deadline are closed"
        );
        close_all.cancel();
    }
    Ok(())
}

/// Send a connection beyond a cap the canned 503, if its socket takes it
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
}
