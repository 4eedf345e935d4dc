//! A real HTTP/1.1 client for tests that talk to a receiver over a socket
//! (hyper-util's connection-pooling client), and in-process delivery of the
//! same requests through `tower::ServiceExt::oneshot`.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// A request to send: method, path (with query), headers, body.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The method.
    pub method: Method,
    /// Path and query, e.g. `/hooks/stripe`.
    pub path: String,
    /// Headers; a name may repeat.
    pub headers: Vec<(String, String)>,
    /// The body, sent with a Content-Length unless `chunks` is set.
    pub body: Vec<u8>,
    /// Send the body as these chunks with `Transfer-Encoding: chunked`
    /// (no Content-Length) instead of `body`.
    pub chunks: Option<Vec<Vec<u8>>>,
}

impl Outgoing {
    /// A POST of `body` to `path`.
    pub fn post(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self {
            method: Method::POST,
            path: path.into(),
            headers: Vec::new(),
            body: body.into(),
            chunks: None,
        }
    }

    /// A GET of `path`.
    pub fn get(path: impl Into<String>) -> Self {
        Self {
            method: Method::GET,
            ..Self::post(path, Vec::new())
        }
    }

    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Send the body in chunks, without a Content-Length.
    pub fn chunked(mut self, chunks: Vec<Vec<u8>>) -> Self {
        self.chunks = Some(chunks);
        self
    }

    /// The body: whole (it has an exact size, so a Content-Length), or a
    /// stream of chunks (no size: chunked).
    fn body(&self) -> Body {
        match &self.chunks {
            Some(chunks) => {
                let chunks = chunks
                    .iter()
                    .map(|chunk| Ok::<_, Infallible>(Bytes::from(chunk.clone())))
                    .collect::<Vec<_>>();
                Body::from_stream(futures_util::stream::iter(chunks))
            }
            None => Body::from(self.body.clone()),
        }
    }

    fn header_map(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                HeaderValue::from_bytes(value.as_bytes()).expect("header value"),
            );
        }
        headers
    }
}

/// What came back.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body bytes.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// An HTTP/1.1 client over real TCP connections.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Client<HttpConnector, Body>,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    /// A client with a connection pool.
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Send `request` to the server at `addr`.
    pub async fn send(
        &self,
        addr: SocketAddr,
        request: &Outgoing,
    ) -> Result<Reply, hyper_util::client::legacy::Error> {
        let mut outgoing = Request::builder()
            .method(request.method.clone())
            .uri(format!("http://{addr}{}", request.path))
            .body(request.body())
            .expect("request");
        *outgoing.headers_mut() = request.header_map();
        let response = self.client.request(outgoing).await?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }
}

/// Deliver `request` to `router` in-process, through `tower::ServiceExt::oneshot`.
pub async fn oneshot(router: &Router, request: &Outgoing) -> Reply {
    let mut incoming = Request::builder()
        .method(request.method.clone())
        .uri(&request.path)
        .body(request.body())
        .expect("request");
    *incoming.headers_mut() = request.header_map();
    if request.chunks.is_none() && !incoming.headers().contains_key("content-length") {
        // What a real client sends with a whole body.
        incoming.headers_mut().insert(
            "content-length",
            HeaderValue::from(request.body.len() as u64),
        );
    }
    let response = router
        .clone()
        .oneshot(incoming)
        .await
        .expect("routers are infallible");
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .unwrap_or_default();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

/// A router served on a loopback port until dropped.
#[derive(Debug)]
pub struct LoopbackServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl LoopbackServer {
    /// Serve `router` on `127.0.0.1:0`.
    pub async fn start(router: Router) -> LoopbackServer {
        Self::serve(router, false).await
    }

    /// Serve `router` on `127.0.0.1:0`, every request carrying
    /// `axum::extract::ConnectInfo<SocketAddr>` (the client's address), as
    /// tickmark's own server does.
    pub async fn start_with_connect_info(router: Router) -> LoopbackServer {
        Self::serve(router, true).await
    }

    /// Serve `router` on `listener`, bound already (a fake that must know
    /// its own address before its router is built, for the links it
    /// answers with).
    pub fn start_on(listener: tokio::net::TcpListener, router: Router) -> LoopbackServer {
        Self::serve_on(listener, router, false)
    }

    async fn serve(router: Router, connect_info: bool) -> LoopbackServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        Self::serve_on(listener, router, connect_info)
    }

    fn serve_on(
        listener: tokio::net::TcpListener,
        router: Router,
        connect_info: bool,
    ) -> LoopbackServer {
        let addr = listener.local_addr().expect("local addr");
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if connect_info {
                axum::serve(
                    listener,
                    router.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .with_graceful_shutdown(shutdown)
                .await
                .expect("serve");
            } else {
                axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown)
                    .await
                    .expect("serve");
            }
        });
        LoopbackServer {
            addr,
            stop,
            task: Some(task),
        }
    }

    /// Stop accepting and wait for open requests to finish.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
