//! A collector that takes every export and throws it away, for measuring
//! what exporting traces costs the engine (`bench --otel`). It answers
//! `POST /v1/traces` with an empty success without decoding the body: the
//! decoding is a collector's work, on another machine in production. It
//! runs on a thread of its own, as a collector runs beside the process.

use std::net::SocketAddr;

use axum::routing::post;
use axum::Router;

/// Start the sink on a free loopback port; answers its OTLP/HTTP base URL.
/// It serves until the process exits.
pub fn start() -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr: SocketAddr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let app = Router::new().route(
                "/v1/traces",
                post(|_body: axum::body::Bytes| async {
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }),
            );
            let _ = axum::serve(listener, app).await;
        });
    });
    Ok(format!("http://{addr}"))
}
