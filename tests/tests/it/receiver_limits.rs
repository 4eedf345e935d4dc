//! The receiver's connection and time limits, over real sockets against
//! `Receiver::serve` (and in-process for the accept queue), on SQLite and
//! PostgreSQL:
//!
//! - a connection that sends nothing, or its head a byte at a time, is
//!   closed after the header-read timeout; a body still arriving at the
//!   body-read timeout gets 408 and the connection is closed;
//! - at `max_connections` a newcomer takes the place of the connection idle
//!   the longest, which is closed; with every connection busy (a request in
//!   the service) it is answered 503 and closed at once; a delivery beyond
//!   `max_in_flight` gets 503 `overloaded` with `Retry-After` at once, while
//!   `/healthz` answers;
//! - an unsigned body is refused before it is sent (the answer arrives while
//!   the client still holds the body back); a 2 MiB body gets its 413 every
//!   time, with or without a Content-Length, even from a client that writes
//!   the whole request before reading;
//! - a full accept queue answers 503 `overloaded` with `Retry-After`, and
//!   writes nothing for those deliveries;
//! - one client address cannot hold more than its share of the
//!   connections: beyond it, with its own connections busy, 503 and close,
//!   while another address is served;
//! - the operations port (dashboard, `/metrics`), served with the same
//!   `tickmark::serve` and limits, closes a slowloris and answers a
//!   one-byte-a-second `POST /login` with 408, while the receiver answers;
//! - a forged Twilio form of a mebibyte of `a&a&…` costs the receiver about
//!   the bytes it reads (resident memory measured from `/proc/self/status`),
//!   alone and 256 at once, and is refused before its signature is computed.
//!
//! Deadlines are short (about a second) and only ever waited for: the tests
//! wait for the server to close or answer, with generous limits, and never
//! assert how long it took.

use std::net::SocketAddr;
use std::time::Duration;

use crate::receiver_support::{all_sources, b64, hmac1, now, record_everything, Kind};
use tickmark::dashboard::Dashboard;
use tickmark::{Backend, Receiver};
use tickmark_receiver::Limits;
use tickmark_tests::conformance::engine;
use tickmark_tests::http_client::{oneshot, Outgoing};
use tickmark_tests::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Longest wait for anything the server should do within a second or two:
/// wide, for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// The dashboard's token on the operations port.
const OPS_TOKEN: &str = "an-ops-token-long-enough-for-a-test";

/// A receiver served with `Receiver::serve` on a loopback port.
struct Served {
    db: TestDb,
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(backend: Backend, limits: Limits, body_limit: Option<usize>) -> Option<Served> {
        let db = TestDb::new(backend).await?;
        let mut receiver =
            all_sources(Receiver::new(engine(&db, record_everything()))).limits(limits);
        if let Some(bytes) = body_limit {
            receiver = receiver.body_limit(bytes);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move { receiver.serve(listener, shutdown).await });
        Some(Served {
            db,
            addr,
            stop,
            task,
        })
    }

    /// The operations router (dashboard with a token, `/metrics`) on its
    /// own loopback port, served as the receiver is: `tickmark::serve`, the
    /// same `limits`. Stops with the receiver.
    async fn start_ops(&self, limits: Limits) -> SocketAddr {
        let engine = engine(&self.db, record_everything());
        let dashboard = Dashboard::new(engine.clone()).token(OPS_TOKEN);
        let router = tickmark::ops::router(engine, Some(dashboard));
        let listener = tickmark::serve::bind("127.0.0.1:0".parse().unwrap(), &limits)
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = self.stop.clone().cancelled_owned();
        tokio::spawn(tickmark::serve::serve(listener, router, limits, shutdown));
        addr
    }

    async fn rows(&self) -> i64 {
        self.db
            .probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await
    }

    async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
            .expect("serve");
    }
}

fn limits(configure: impl FnOnce(&mut Limits)) -> Limits {
    let mut limits = Limits::default();
    configure(&mut limits);
    limits
}

/// A request's bytes: `request` as HTTP/1.1 (with a Content-Length, unless
/// `chunked`).
fn request_bytes(request: &Outgoing, chunked: bool) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nhost: 127.0.0.1\r\n",
        request.method, request.path
    )
    .into_bytes();
    for (name, value) in &request.headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
        for chunk in request.body.chunks(64 * 1024) {
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
    } else {
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", request.body.len()).as_bytes());
        out.extend_from_slice(&request.body);
    }
    out
}

/// Read until the server closes the connection (EOF or reset); everything
/// it sent. Panics if it stays open past [`PATIENCE`].
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection");
    received
}

/// An HTTP answer read off a socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    json: serde_json::Value,
}

fn parse_answer(received: &[u8]) -> Answer {
    let end = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer in {:?}", String::from_utf8_lossy(received)));
    let head = String::from_utf8_lossy(&received[..end]).to_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let json = serde_json::from_slice(&received[end + 4..]).unwrap_or(serde_json::Value::Null);
    Answer { status, head, json }
}

/// A Stripe delivery whose signature header has the right shape but does
/// not verify (the body is never meant to be accepted).
fn well_shaped_delivery(body: Vec<u8>) -> Outgoing {
    Outgoing::post("/hooks/stripe", body)
        .header("content-type", "application/json")
        .header(
            "stripe-signature",
            format!("t={},v1={}", now(), "0".repeat(64)),
        )
}

/// `GET /healthz` on a fresh connection.
async fn healthz(addr: SocketAddr) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    parse_answer(&read_until_closed(&mut stream).await)
}

/// A valid delivery, on a fresh connection.
async fn deliver(addr: SocketAddr, id: &str) -> Answer {
    let request = Kind::Stripe
        .delivery(Kind::Stripe.secret(), id, now())
        .header("connection", "close");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(&request_bytes(&request, false))
        .await
        .unwrap();
    parse_answer(&read_until_closed(&mut stream).await)
}

/// Silent and slow-header connections are closed at the header-read
/// timeout; meanwhile deliveries and `/healthz` are answered.
async fn silent_and_slow_header_connections_are_closed(backend: Backend) {
    let Some(served) = Served::start(
        backend,
        limits(|l| l.header_read_timeout = Duration::from_secs(1)),
        None,
    )
    .await
    else {
        return;
    };
    let addr = served.addr;
    let silent = (0..10).map(|_| {
        tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            read_until_closed(&mut stream).await
        })
    });
    let slow = (0..10).map(|_| {
        tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let (mut reader, mut writer) = stream.split();
            let head = b"POST /hooks/stripe HTTP/1.1\r\nhost: x\r\nx-padding: ";
            let mut sent = 0_usize;
            // A byte every 200 ms: the head is never finished.
            let dribble = async {
                loop {
                    let byte = head.get(sent).copied().unwrap_or(b'a');
                    if writer.write_all(&[byte]).await.is_err() {
                        break;
                    }
                    sent += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // The server closed: wait for the reader to see it.
                std::future::pending::<()>().await
            };
            let closed = async {
                let mut buffer = [0u8; 1024];
                loop {
                    match reader.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            };
            tokio::time::timeout(PATIENCE, async {
                tokio::select! {
                    () = dribble => {}
                    () = closed => {}
                }
            })
            .await
            .expect("the server closes a slow head");
            sent
        })
    });
    let silent: Vec<_> = silent.collect();
    let slow: Vec<_> = slow.collect();
    // Meanwhile: answered.
    assert_eq!(healthz(addr).await.status, 200);
    let answer = deliver(addr, "evt_during_slow_heads").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json["status"], "new");
    for connection in silent {
        let received = connection.await.unwrap();
        // Closed with nothing sent, or with hyper's bare 408: never a hang.
        assert!(
            received.is_empty() || received.starts_with(b"HTTP/1.1 408"),
            "{:?}",
            String::from_utf8_lossy(&received)
        );
    }
    for connection in slow {
        let sent = connection.await.unwrap();
        assert!(sent > 0);
    }
    assert_eq!(served.rows().await, 1);
    served.shutdown().await;
}

/// A body still arriving at the body-read timeout gets 408 `body_timeout`,
/// and the connection is closed.
async fn a_slow_body_gets_408_and_is_closed(backend: Backend) {
    let Some(served) = Served::start(
        backend,
        limits(|l| l.body_read_timeout = Duration::from_secs(1)),
        None,
    )
    .await
    else {
        return;
    };
    let request = well_shaped_delivery(vec![b' '; 10_000]);
    let bytes = request_bytes(&request, false);
    // Everything but most of the body, then a trickle.
    let (head_and_some, _rest) = bytes.split_at(bytes.len() - 9_000);
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    stream.write_all(head_and_some).await.unwrap();
    let (mut reader, mut writer) = stream.split();
    let trickle = async {
        loop {
            if writer.write_all(b" ").await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let mut received = Vec::new();
    let read = async {
        let mut buffer = [0u8; 4096];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, async {
        tokio::select! {
            () = trickle => {}
            () = read => {}
        }
    })
    .await
    .expect("the server answers and closes a slow body");
    let answer = parse_answer(&received);
    assert_eq!(answer.status, 408, "{answer:?}");
    assert_eq!(answer.json["error"], "body_timeout");
    assert!(answer.head.contains("connection: close"), "{}", answer.head);
    assert_eq!(served.rows().await, 0);
    served.shutdown().await;
}

/// At `max_connections` with every connection busy (a delivery's body being
/// read), a connection is answered 503 and closed at once; when one closes,
/// a new one is served again.
async fn connections_beyond_the_cap_are_refused_at_once(backend: Backend) {
    let Some(served) = Served::start(
        backend,
        limits(|l| {
            l.max_connections = 4;
            l.body_read_timeout = HELD_BODY_FOR;
        }),
        None,
    )
    .await
    else {
        return;
    };
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(busy_connection([127, 0, 0, 1], served.addr).await);
    }
    // These four hold the cap, each with a request in the service: none
    // can make room.
    let mut extra = TcpStream::connect(served.addr).await.unwrap();
    let answer = parse_answer(&read_until_closed(&mut extra).await);
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.json["error"], "overloaded");
    assert!(answer.head.contains("retry-after: 1"), "{}", answer.head);
    // One goes away: the server is reachable again.
    drop(held.pop());
    tickmark_tests::wait::until("a free connection slot", PATIENCE, || async {
        healthz(served.addr).await.status == 200
    })
    .await;
    drop(held);
    served.shutdown().await;
}

/// At `max_connections` with every connection idle, a newcomer is served:
/// the connection idle the longest (the first one, which never sent
/// anything) is closed to make room, the others are still served.
async fn at_the_cap_the_connection_idle_longest_makes_room(backend: Backend) {
    let Some(served) = Served::start(backend, limits(|l| l.max_connections = 4), None).await else {
        return;
    };
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from([127, 0, 0, 2], served.addr).await);
    }
    // The accept loop takes connections in order: the first is idle the
    // longest.
    let mut newcomer = connect_from([127, 0, 0, 3], served.addr).await;
    newcomer
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        parse_answer(&read_until_closed(&mut newcomer).await).status,
        200
    );
    assert!(
        read_until_closed(&mut held[0]).await.is_empty(),
        "the replaced connection is closed without an answer"
    );
    for stream in &mut held[1..] {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(parse_answer(&read_until_closed(stream).await).status, 200);
    }
    served.shutdown().await;
}

/// How long a held delivery's body may take: longer than any test here.
const HELD_BODY_FOR: Duration = Duration::from_secs(300);

/// A connection from `from` whose delivery is inside the service: its head
/// sent with `expect: 100-continue`, its body held back. Returns once the
/// server asked for the body (`100 Continue`, sent when the handler starts
/// reading it), so the connection is busy, not idle.
async fn busy_connection(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let mut stream = connect_from(from, to).await;
    let head = format!(
        "POST /hooks/stripe HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         stripe-signature: t={},v1={}\r\nexpect: 100-continue\r\ncontent-length: 100\r\n\r\n",
        now(),
        "0".repeat(64)
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 256];
    tokio::time::timeout(PATIENCE, async {
        while !String::from_utf8_lossy(&received).contains("100 Continue") {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "closed before 100 Continue: {received:?}");
            received.extend_from_slice(&buffer[..n]);
        }
    })
    .await
    .expect("the server asks for the body");
    stream
}

/// Beyond `max_in_flight`, a delivery gets 503 `overloaded` with
/// `Retry-After` at once; `/healthz` is not counted.
async fn deliveries_beyond_the_in_flight_cap_get_503(backend: Backend) {
    let Some(served) = Served::start(backend, limits(|l| l.max_in_flight = 2), None).await else {
        return;
    };
    // Two deliveries whose bodies are held back hold the cap.
    let request = well_shaped_delivery(vec![b' '; 10_000]).header("connection", "close");
    let bytes = request_bytes(&request, false);
    let hold = || async {
        let mut stream = TcpStream::connect(served.addr).await.unwrap();
        stream
            .write_all(&bytes[..bytes.len() - 5_000])
            .await
            .unwrap();
        stream
    };
    let mut holders = vec![hold().await, hold().await];
    // The holders' heads may still be on their way to the server: try until
    // a third delivery (one that would be refused anyway) is shed. A probe
    // can take a slot for a moment and get a holder shed in its place: a
    // holder that was answered is replaced, so the test never depends on
    // which request the server reads first.
    let probe = request_bytes(
        &well_shaped_delivery(b"{}".to_vec()).header("connection", "close"),
        false,
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let answer = loop {
        for holder in &mut holders {
            let mut byte = [0u8; 1];
            match holder.try_read(&mut byte) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                _ => *holder = hold().await, // answered (shed) or closed
            }
        }
        let mut stream = TcpStream::connect(served.addr).await.unwrap();
        stream.write_all(&probe).await.unwrap();
        let answer = parse_answer(&read_until_closed(&mut stream).await);
        if answer.status == 503 {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no delivery was shed: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer.json["error"], "overloaded", "{answer:?}");
    assert!(answer.head.contains("retry-after: 1"), "{}", answer.head);
    assert_eq!(healthz(served.addr).await.status, 200);
    assert_eq!(served.rows().await, 0);
    // The holders finish (their signatures do not verify): room again.
    for stream in &mut holders {
        stream
            .write_all(&bytes[bytes.len() - 5_000..])
            .await
            .unwrap();
    }
    for mut stream in holders {
        let answer = parse_answer(&read_until_closed(&mut stream).await);
        assert_eq!(answer.status, 401, "{answer:?}");
    }
    let answer = deliver(served.addr, "evt_after_the_cap").await;
    assert_eq!(answer.json["status"], "new", "{answer:?}");
    served.shutdown().await;
}

/// An unsigned 1 MiB body is refused before it is read: the answer comes
/// while the client still holds the body back. A client that then sends it
/// anyway is drained, and reads its 401 to the end.
async fn an_unsigned_body_is_refused_before_it_is_read(backend: Backend) {
    let Some(served) = Served::start(backend, Limits::default(), None).await else {
        return;
    };
    let body = vec![b'x'; 1024 * 1024];
    let request =
        Outgoing::post("/hooks/github", body.clone()).header("content-type", "application/json");
    let bytes = request_bytes(&request, false);
    let head_len = bytes.len() - body.len();
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    stream.write_all(&bytes[..head_len]).await.unwrap();
    // No body sent yet: the answer must come anyway.
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(PATIENCE, async {
        while !received.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buffer).await.expect("read");
            assert!(n > 0, "closed without an answer");
            received.extend_from_slice(&buffer[..n]);
        }
    })
    .await
    .expect("answered before the body was sent");
    assert!(
        received.starts_with(b"HTTP/1.1 401"),
        "{:?}",
        String::from_utf8_lossy(&received)
    );
    // Sending the body now is fine: the server reads it and closes cleanly.
    stream
        .write_all(&bytes[head_len..])
        .await
        .expect("the body is drained");
    received.extend(read_until_closed(&mut stream).await);
    let answer = parse_answer(&received);
    assert_eq!(answer.json["error"], "missing_signature", "{answer:?}");
    assert!(answer.head.contains("connection: close"), "{}", answer.head);
    assert_eq!(served.rows().await, 0);
    served.shutdown().await;
}

/// A 2 MiB body, written whole before the answer is read, gets its 413
/// every time, with or without a Content-Length: the server answers, reads
/// the rest of the body, and only then closes.
async fn a_two_mebibyte_body_gets_its_413_every_time(backend: Backend) {
    let Some(served) = Served::start(backend, Limits::default(), None).await else {
        return;
    };
    let request = well_shaped_delivery(vec![b' '; 2 * 1024 * 1024]);
    for round in 0..5 {
        for chunked in [false, true] {
            // A small send buffer, so the write only completes as the
            // server reads: a server that closed early would fail it.
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_send_buffer_size(32 * 1024).unwrap();
            let mut stream = socket.connect(served.addr).await.unwrap();
            // Write everything first, as simple clients do.
            stream
                .write_all(&request_bytes(&request, chunked))
                .await
                .unwrap_or_else(|e| panic!("round {round}, chunked {chunked}: write: {e}"));
            let answer = parse_answer(&read_until_closed(&mut stream).await);
            assert_eq!(
                answer.status, 413,
                "round {round}, chunked {chunked}: {answer:?}"
            );
            assert_eq!(answer.json["error"], "payload_too_large");
        }
    }
    assert_eq!(served.rows().await, 0);
    served.shutdown().await;
}

/// With the database's write lock held elsewhere, accepts pile up in the
/// group-commit queue; once it is full, deliveries get 503 `overloaded`
/// with `Retry-After` (nothing written for them) instead of queueing
/// without bound. When the lock is released, the queued ones are recorded.
async fn a_full_accept_queue_answers_503(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let router = all_sources(Receiver::new(engine(&db, record_everything())))
        .limits(limits(|l| l.max_in_flight = 10_000))
        .router();
    let lock = WriteLock::take(&db).await;
    let (done, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let count = 1_600;
    for i in 0..count {
        let (router, done) = (router.clone(), done.clone());
        tokio::spawn(async move {
            let request =
                Kind::Stripe.delivery(Kind::Stripe.secret(), &format!("evt_q_{i}"), now());
            let _ = done.send(oneshot(&router, &request).await);
        });
    }
    // Wait for the first refusal, with the lock still held.
    let mut replies = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(reply) = answers.recv().await {
            let refused = reply.status == 503;
            replies.push(reply);
            if refused {
                return;
            }
        }
    })
    .await
    .expect("a delivery is refused while the queue is full");
    lock.release().await;
    while replies.len() < count {
        let reply = tokio::time::timeout(PATIENCE, answers.recv())
            .await
            .expect("every delivery is answered")
            .expect("answer");
        replies.push(reply);
    }
    let mut new = 0;
    let mut overloaded = 0;
    for reply in &replies {
        let json = reply.json();
        match reply.status {
            200 => {
                assert_eq!(json["status"], "new", "{json}");
                new += 1;
            }
            503 => {
                assert_eq!(json["error"], "overloaded", "{json}");
                assert_eq!(reply.header("retry-after"), Some("1"));
                overloaded += 1;
            }
            other => panic!("unexpected {other}: {json}"),
        }
    }
    assert!(
        overloaded > 0 && new > 0,
        "new {new}, overloaded {overloaded}"
    );
    let rows = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events")
        .await;
    assert_eq!(rows, new, "rows only for the deliveries answered new");
}

/// The database's write lock, held by another connection.
enum WriteLock {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl WriteLock {
    async fn take(db: &TestDb) -> WriteLock {
        use sqlx::Connection as _;
        match db.backend() {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                WriteLock::Sqlite(conn)
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
                sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
                sqlx::query("LOCK TABLE tickmark_events IN EXCLUSIVE MODE")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                WriteLock::Postgres(conn)
            }
        }
    }

    async fn release(self) {
        match self {
            WriteLock::Sqlite(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
            }
            WriteLock::Postgres(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
            }
        }
    }
}

/// Writes `bytes` one at a time, `every` apart, until the server closes the
/// connection (a write fails) or they run out.
fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>, every: Duration) {
    tokio::spawn(async move {
        for byte in bytes {
            tokio::time::sleep(every).await;
            if writer.write_all(&[byte]).await.is_err() {
                return;
            }
        }
    });
}

/// Read until the server closes the read half (or PATIENCE runs out).
async fn read_half_until_closed(reader: &mut tokio::net::tcp::OwnedReadHalf) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    tokio::time::timeout(PATIENCE, async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection");
    received
}

/// The operations port has the receiver's limits: a slowloris (a header
/// line every quarter second) is closed at the header-read timeout, and a
/// `POST /login` whose body comes a byte a second gets 408 at the body
/// deadline (not a 401 for an empty token). Meanwhile the receiver answers.
async fn the_ops_port_closes_a_slowloris_and_a_slow_login(backend: Backend) {
    let limits = limits(|l| {
        l.header_read_timeout = Duration::from_secs(1);
        l.body_read_timeout = Duration::from_secs(1);
    });
    let Some(served) = Served::start(backend, limits, None).await else {
        return;
    };
    let ops = served.start_ops(limits).await;

    let (mut slowloris, writer) = TcpStream::connect(ops).await.unwrap().into_split();
    let header_lines = b"GET /login HTTP/1.1\r\nhost: x\r\n"
        .iter()
        .chain(b"x-slow: 1\r\n".repeat(400).iter())
        .copied()
        .collect();
    trickle(writer, header_lines, Duration::from_millis(250));
    assert_eq!(
        deliver(served.addr, "evt_during_slowloris").await.status,
        200
    );
    let received = read_half_until_closed(&mut slowloris).await;
    assert!(
        !String::from_utf8_lossy(&received).starts_with("HTTP/1.1 200"),
        "a head that never ended was answered: {:?}",
        String::from_utf8_lossy(&received)
    );

    let (mut login, mut writer) = TcpStream::connect(ops).await.unwrap().into_split();
    writer
        .write_all(
            b"POST /login HTTP/1.1\r\nhost: x\r\n\
              content-type: application/x-www-form-urlencoded\r\ncontent-length: 64\r\n\r\n",
        )
        .await
        .unwrap();
    trickle(writer, b"token=".repeat(11), Duration::from_secs(1));
    assert_eq!(
        deliver(served.addr, "evt_during_slow_login").await.status,
        200
    );
    let answer = parse_answer(&read_half_until_closed(&mut login).await);
    assert_eq!(answer.status, 408, "{answer:?}");

    assert_eq!(
        served.rows().await,
        2,
        "the receiver recorded both deliveries"
    );
    served.shutdown().await;
}

/// A connection from `local` (a loopback address of the 127/8 range) to `to`.
async fn connect_from(local: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((local, 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// One client address holds at most `max_connections_per_address`: with
/// those busy, the next connection from it is answered 503 and closed at
/// once, while one from another address is served; a freed place is taken
/// again.
async fn one_address_cannot_hold_every_connection(backend: Backend) {
    let Some(served) = Served::start(
        backend,
        limits(|l| {
            l.max_connections = 16;
            l.max_connections_per_address = 2;
            l.body_read_timeout = HELD_BODY_FOR;
        }),
        None,
    )
    .await
    else {
        return;
    };
    let mut held = vec![
        busy_connection([127, 0, 0, 1], served.addr).await,
        busy_connection([127, 0, 0, 1], served.addr).await,
    ];
    // These two hold the share, each with a request in the service.
    let mut extra = connect_from([127, 0, 0, 1], served.addr).await;
    let answer = parse_answer(&read_until_closed(&mut extra).await);
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.json["error"], "overloaded");

    let mut other = connect_from([127, 0, 0, 2], served.addr).await;
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        parse_answer(&read_until_closed(&mut other).await).status,
        200
    );

    drop(held.pop());
    tickmark_tests::wait::until("the freed place", PATIENCE, || async {
        let mut again = connect_from([127, 0, 0, 1], served.addr).await;
        let sent = again
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await;
        sent.is_ok() && parse_answer(&read_until_closed(&mut again).await).status == 200
    })
    .await;
    drop(held);
    served.shutdown().await;
}

/// This process's resident memory in KiB: `VmRSS`, or `VmHWM` (its peak
/// since the last reset), from `/proc/self/status`.
fn memory_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux)");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Reset the peak (`VmHWM`) to the current resident size (Linux 4.0+), so
/// that the next reading is the peak of what follows.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5")
        .expect("reset VmHWM through /proc/self/clear_refs");
}

/// A forged Twilio form post: `body` under a well-formed signature that is
/// not the body's, on its own connection; the answer.
async fn forged_twilio(addr: SocketAddr, body: std::sync::Arc<Vec<u8>>) -> Answer {
    let head = format!(
        "POST /hooks/twilio HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         content-type: application/x-www-form-urlencoded\r\n\
         x-twilio-signature: {}\r\ncontent-length: {}\r\n\r\n",
        b64(&hmac1(b"not the auth token", b"anything")),
        body.len()
    );
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    parse_answer(&read_until_closed(&mut stream).await)
}

/// Twilio signs its form's decoded fields, so a body must be decoded before
/// its signature can be checked. A mebibyte of `a&a&…` (half a million
/// fields) under a wrong signature once cost tens of megabytes and a sort on
/// a runtime thread; now it is counted, refused with 413, and costs about
/// the bytes read. And a form just under the field cap, every byte an
/// escape, is decoded (a few hundred kilobytes) and refused with 401. One
/// alone, then 256 at once (the in-flight cap): the peak resident memory
/// grows by a few MiB per request at most (the figures are printed), the
/// receiver still answers, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_twilio_flood_costs_about_its_bytes() {
    const MIB: u64 = 1024;
    let Some(served) = Served::start(
        Backend::Sqlite,
        limits(|l| {
            l.max_connections = 1024;
            l.max_connections_per_address = 1024;
        }),
        None,
    )
    .await
    else {
        return;
    };
    let limit = tickmark_receiver::DEFAULT_BODY_LIMIT;
    let flood = std::sync::Arc::new(b"a&".repeat(limit / 2));
    let fields = tickmark_receiver::providers::MAX_FORM_FIELDS;
    let escapes = std::sync::Arc::new(
        format!("a={}&", "%41".repeat((limit / fields - 4) / 3))
            .repeat(fields)
            .into_bytes(),
    );
    assert!(flood.len() <= limit && escapes.len() <= limit);
    assert_eq!(deliver(served.addr, "evt_warm_up").await.status, 200);
    let warm = Kind::Twilio.delivery(Kind::Twilio.secret(), "tw_warm_up", now());
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    stream
        .write_all(&request_bytes(&warm.header("connection", "close"), false))
        .await
        .unwrap();
    assert_eq!(
        parse_answer(&read_until_closed(&mut stream).await).status,
        200
    );

    reset_peak();
    let before = memory_kib("VmRSS");
    let alone = forged_twilio(served.addr, flood.clone()).await;
    let alone_growth = memory_kib("VmHWM").saturating_sub(before);

    reset_peak();
    let before = memory_kib("VmRSS");
    let sends: Vec<_> = (0..256)
        .map(|i| {
            let body = if i % 2 == 0 {
                flood.clone()
            } else {
                escapes.clone()
            };
            tokio::spawn(forged_twilio(served.addr, body))
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::<(u16, String), usize>::new();
    for send in sends {
        let answer = send.await.unwrap();
        let code = answer.json["error"].as_str().unwrap_or_default().to_owned();
        *statuses.entry((answer.status, code)).or_default() += 1;
    }
    let burst_growth = memory_kib("VmHWM").saturating_sub(before);
    println!(
        "forged Twilio forms of {} bytes: one alone raised the peak RSS by {:.1} MiB; \
         256 at once by {:.1} MiB ({:.2} MiB each); answers {statuses:?}",
        flood.len(),
        alone_growth as f64 / MIB as f64,
        burst_growth as f64 / MIB as f64,
        burst_growth as f64 / MIB as f64 / 256.0,
    );

    assert_eq!(
        (alone.status, alone.json["error"].as_str()),
        (413, Some("too_many_form_fields"))
    );
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        [
            ((401, "bad_signature".to_owned()), 128),
            ((413, "too_many_form_fields".to_owned()), 128)
        ]
    );
    assert!(
        alone_growth < 8 * MIB,
        "one forged form raised the peak RSS by {alone_growth} KiB"
    );
    assert!(
        burst_growth < 256 * 3 * MIB,
        "256 forged forms raised the peak RSS by {burst_growth} KiB"
    );
    assert_eq!(deliver(served.addr, "evt_after").await.status, 200);
    assert_eq!(
        served.rows().await,
        3,
        "the warm-ups and the last delivery, nothing else"
    );
    served.shutdown().await;
}

// Every case, once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(backend => [
    silent_and_slow_header_connections_are_closed,
    a_slow_body_gets_408_and_is_closed,
    connections_beyond_the_cap_are_refused_at_once,
    at_the_cap_the_connection_idle_longest_makes_room,
    deliveries_beyond_the_in_flight_cap_get_503,
    an_unsigned_body_is_refused_before_it_is_read,
    a_two_mebibyte_body_gets_its_413_every_time,
    a_full_accept_queue_answers_503,
    one_address_cannot_hold_every_connection,
    the_ops_port_closes_a_slowloris_and_a_slow_login,
]);
