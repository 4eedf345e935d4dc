//! The dashboard's token cannot be guessed without limit, over real sockets
//! with the client's address in every request (as tickmark's own server
//! serves it):
//!
//! - wrong tokens at `POST /login` lock the address out: 429 with
//!   `Retry-After`, and then the right token is 429 too (no oracle), while
//!   a browser signed in before keeps reading;
//! - a wrong bearer token on a page or on `/metrics`, and a wrong `token` in
//!   the retry form, count the same; requests without a token count nothing;
//! - the global budget holds every address, and is all there is without
//!   the client's address;
//! - signing out revokes the session server-side: the cookie replayed
//!   afterwards (and every other session issued before) gets 401;
//! - a form cut off by a body deadline is 408, not a failed login, and
//!   counts nothing;
//! - a token shorter than 128 bits is a start-up warning.
//!
//! The budgets are the defaults unless a test sets its own; nothing waits
//! for a budget to refill (the throttle's own tests move an injected clock).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tickmark::dashboard::{Dashboard, FailureLimits, StartupWarning};
use tickmark::{Backend, Engine, Handlers};
use tickmark_dashboard::DEFAULT_PER_CLIENT;
use tickmark_tests::conformance::{engine, order_paid};
use tickmark_tests::http_client::{oneshot, HttpClient, LoopbackServer, Outgoing, Reply};
use tickmark_tests::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "dashboard-auth-test-token-0123456789";

/// Longest wait for an answer the server gives within a second: wide, for
/// a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

async fn sqlite_engine() -> (TestDb, Engine) {
    let db = TestDb::new(Backend::Sqlite)
        .await
        .expect("SQLite is always there");
    let engine = engine(&db, Handlers::new());
    (db, engine)
}

/// `/metrics` and the dashboard, served on loopback with connect info.
async fn serve(dashboard: Dashboard, engine: &Engine) -> LoopbackServer {
    LoopbackServer::start_with_connect_info(tickmark::ops::router(engine.clone(), Some(dashboard)))
        .await
}

fn form(fields: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish()
}

fn post(path: &str, fields: &[(&str, &str)]) -> Outgoing {
    Outgoing::post(path, form(fields)).header("content-type", "application/x-www-form-urlencoded")
}

fn bearer(path: &str, token: &str) -> Outgoing {
    Outgoing::get(path).header("authorization", format!("Bearer {token}"))
}

async fn send(client: &HttpClient, server: &LoopbackServer, request: &Outgoing) -> Reply {
    client
        .send(server.addr, request)
        .await
        .expect("the server answers")
}

async fn sign_in(client: &HttpClient, server: &LoopbackServer, token: &str) -> Reply {
    send(
        client,
        server,
        &post("/login", &[("token", token), ("next", "/events")]),
    )
    .await
}

fn text(reply: &Reply) -> String {
    String::from_utf8_lossy(&reply.body).into_owned()
}

/// A 429 whose token was not checked, with a `Retry-After` in seconds
/// within the window.
fn assert_locked(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 429, "{what}: {}", text(reply));
    let retry_after: u64 = reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("{what}: no Retry-After"))
        .parse()
        .unwrap_or_else(|_| panic!("{what}: Retry-After is not seconds"));
    assert!(
        (1..=60).contains(&retry_after),
        "{what}: Retry-After {retry_after}"
    );
    assert!(
        reply.header("set-cookie").is_none(),
        "{what}: signed in while locked"
    );
    assert!(
        text(reply).contains("not checked"),
        "{what}: {}",
        text(reply)
    );
}

/// The session cookie a sign-in set, as a `Cookie` header sends it back.
fn session_cookie(reply: &Reply) -> String {
    assert_eq!(reply.status, 303, "{}", text(reply));
    let set = reply.header("set-cookie").expect("a Set-Cookie header");
    set.split(';').next().expect("name=value").trim().to_owned()
}

/// The value of the hidden `csrf` field of a page's form.
fn csrf_of(html: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = html
        .find(marker)
        .unwrap_or_else(|| panic!("no csrf in\n{html}"))
        + marker.len();
    let end = html[start..].find('"').expect("closing quote") + start;
    html[start..end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_at_login_lock_the_address_out_even_for_the_right_token() {
    let (_db, engine) = sqlite_engine().await;
    let server = serve(Dashboard::new(engine.clone()).token(TOKEN), &engine).await;
    let client = HttpClient::new();
    // A browser signed in before the attack.
    let cookie = session_cookie(&sign_in(&client, &server, TOKEN).await);

    for i in 0..DEFAULT_PER_CLIENT {
        let reply = sign_in(&client, &server, &format!("guess-{i}")).await;
        assert_eq!(reply.status, 401, "guess {i}: {}", text(&reply));
    }
    assert_locked(
        &sign_in(&client, &server, "guess-more").await,
        "one guess too many",
    );
    // No oracle: the right token is not checked either, in any form.
    assert_locked(
        &sign_in(&client, &server, TOKEN).await,
        "the right token at /login",
    );
    assert_locked(
        &send(&client, &server, &bearer("/events", TOKEN)).await,
        "the right bearer",
    );
    assert_locked(
        &send(&client, &server, &bearer("/metrics", TOKEN)).await,
        "/metrics",
    );
    assert_locked(
        &send(
            &client,
            &server,
            &post("/events/1/retry", &[("token", TOKEN)]),
        )
        .await,
        "the retry form",
    );
    // The browser signed in before is not locked out: its cookie cannot be
    // guessed, so checking it reveals nothing.
    let reply = send(
        &client,
        &server,
        &Outgoing::get("/events").header("cookie", &cookie),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bearer_and_retry_tokens_count_and_missing_ones_do_not() {
    let (db, engine) = sqlite_engine().await;
    order_paid(&engine, "evt_auth").await;
    let seq = db
        .store
        .event_find("shop", "evt_auth")
        .await
        .unwrap()
        .unwrap()
        .event
        .seq;
    let server = serve(Dashboard::new(engine.clone()).token(TOKEN), &engine).await;
    let client = HttpClient::new();

    // Asking without a token is not guessing: any number of those.
    for path in ["/", "/events", "/metrics"] {
        for _ in 0..DEFAULT_PER_CLIENT {
            assert_eq!(
                send(&client, &server, &Outgoing::get(path)).await.status,
                401
            );
        }
    }
    assert_eq!(
        sign_in(&client, &server, TOKEN).await.status,
        303,
        "nothing was counted"
    );

    // Wrong bearer tokens on pages and /metrics, wrong retry tokens: one budget.
    let retry = format!("/events/{seq}/retry");
    let mut wrong = 0;
    for path in ["/", "/events", "/metrics"] {
        for _ in 0..3 {
            let reply = send(&client, &server, &bearer(path, "wrong-token")).await;
            assert_eq!(reply.status, 401, "{path}: {}", text(&reply));
            wrong += 1;
        }
    }
    while wrong < DEFAULT_PER_CLIENT {
        let reply = send(&client, &server, &post(&retry, &[("token", "wrong-token")])).await;
        assert_eq!(reply.status, 401, "{}", text(&reply));
        wrong += 1;
    }
    assert_locked(
        &send(&client, &server, &bearer("/", "wrong-token")).await,
        "a page",
    );
    assert_locked(
        &sign_in(&client, &server, TOKEN).await,
        "the right token at /login",
    );
    assert_locked(
        &send(&client, &server, &post(&retry, &[("token", TOKEN)])).await,
        "the right token in the retry form",
    );
}

/// A retry request carrying a bearer token and a form token is one guess,
/// the bearer: a right form token beside a wrong bearer is refused, so a
/// guesser cannot try two tokens for each failure counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_request_is_one_guess_however_many_tokens_it_carries() {
    let (db, engine) = sqlite_engine().await;
    order_paid(&engine, "evt_two_tokens").await;
    let seq = db.record_of("shop", "evt_two_tokens").await.event.seq;
    let server = serve(Dashboard::new(engine.clone()).token(TOKEN), &engine).await;
    let client = HttpClient::new();
    let retry = format!("/events/{seq}/retry");

    let two_tokens =
        post(&retry, &[("token", TOKEN)]).header("authorization", "Bearer wrong-token");
    let reply = send(&client, &server, &two_tokens).await;
    assert_eq!(
        reply.status,
        401,
        "the right form token was a second, uncounted guess beside a wrong bearer: {}",
        text(&reply)
    );
    // Each such request counts once, and the budget runs out as for one token.
    for _ in 1..DEFAULT_PER_CLIENT {
        let reply = send(&client, &server, &two_tokens).await;
        assert_eq!(reply.status, 401, "{}", text(&reply));
    }
    assert_locked(
        &send(&client, &server, &post(&retry, &[("token", TOKEN)])).await,
        "the right token once the budget is spent",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_budget_holds_everyone_and_is_all_there_is_without_an_address() {
    let (_db, engine) = sqlite_engine().await;
    let limits = FailureLimits {
        per_client: 1000,
        global: 5,
        ..FailureLimits::default()
    };
    let server = serve(
        Dashboard::new(engine.clone())
            .token(TOKEN)
            .failure_limits(limits),
        &engine,
    )
    .await;
    let client = HttpClient::new();
    for _ in 0..5 {
        assert_eq!(sign_in(&client, &server, "wrong").await.status, 401);
    }
    let reply = sign_in(&client, &server, TOKEN).await;
    assert_locked(&reply, "the global budget");
    assert!(
        text(&reply).contains("all clients together"),
        "{}",
        text(&reply)
    );

    // In-process, without connect info: the global budget alone.
    let router: Router = Dashboard::new(engine.clone())
        .token(TOKEN)
        .failure_limits(FailureLimits {
            global: 3,
            ..FailureLimits::default()
        })
        .router();
    for _ in 0..3 {
        assert_eq!(
            oneshot(&router, &post("/login", &[("token", "wrong")]))
                .await
                .status,
            401
        );
    }
    assert_locked(
        &oneshot(&router, &post("/login", &[("token", TOKEN)])).await,
        "no address",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_out_revokes_the_session_so_a_replayed_cookie_reads_nothing() {
    let (_db, engine) = sqlite_engine().await;
    let dashboard = Dashboard::new(engine.clone()).token(TOKEN);
    let server = serve(dashboard.clone(), &engine).await;
    let client = HttpClient::new();
    let stolen = session_cookie(&sign_in(&client, &server, TOKEN).await);
    let other_browser = session_cookie(&sign_in(&client, &server, TOKEN).await);
    let read = |cookie: String| {
        let client = client.clone();
        let addr = server.addr;
        async move {
            client
                .send(addr, &Outgoing::get("/events").header("cookie", cookie))
                .await
                .expect("answered")
        }
    };
    let page = read(stolen.clone()).await;
    assert_eq!(page.status, 200, "{}", text(&page));
    let csrf = csrf_of(&text(&page));

    let out = send(
        &client,
        &server,
        &post("/logout", &[("csrf", &csrf)]).header("cookie", &stolen),
    )
    .await;
    assert_eq!(out.status, 303, "{}", text(&out));
    // The browser dropped its cookie; a copy of it is refused by the server.
    for (what, cookie) in [("replayed", &stolen), ("another browser's", &other_browser)] {
        let reply = read(cookie.clone()).await;
        assert_eq!(
            reply.status,
            401,
            "{what} cookie after sign-out: {}",
            text(&reply)
        );
    }
    // Signing in again works, and the owner can revoke that too.
    let fresh = session_cookie(&sign_in(&client, &server, TOKEN).await);
    assert_eq!(read(fresh.clone()).await.status, 200);
    dashboard.revoke_sessions();
    assert_eq!(read(fresh).await.status, 401, "Dashboard::revoke_sessions");
}

/// Send the head of a form post of `path` promising 64 bytes of body, and
/// only part of them; return the status line the server answers with.
async fn post_cut_off(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/x-www-form-urlencoded\r\n\
         content-length: 64\r\n\r\ntoken=wro"
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let mut buffer = [0; 4096];
    let read = async {
        loop {
            let n = stream.read(&mut buffer).await.unwrap_or(0);
            answer.extend_from_slice(&buffer[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the server answers a cut-off form");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_cut_off_by_the_body_deadline_is_408_and_counts_nothing() {
    let (_db, engine) = sqlite_engine().await;
    let router = tickmark::ops::router(
        engine.clone(),
        Some(Dashboard::new(engine.clone()).token(TOKEN)),
    )
    .layer(tower_http::timeout::RequestBodyDeadlineLayer::new(
        Duration::from_millis(300),
    ));
    let server = LoopbackServer::start_with_connect_info(router).await;
    for path in ["/login", "/events/1/retry"] {
        for i in 0..=DEFAULT_PER_CLIENT {
            let status = post_cut_off(server.addr, path).await;
            assert!(status.starts_with("HTTP/1.1 408"), "{path} #{i}: {status}");
        }
    }
    let client = HttpClient::new();
    assert_eq!(
        sign_in(&client, &server, TOKEN).await.status,
        303,
        "22 cut-off forms are not 22 wrong tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_under_128_bits_is_a_startup_warning() {
    let (_db, engine) = sqlite_engine().await;
    let short = Dashboard::new(engine.clone()).token("0123456789abcde");
    assert_eq!(
        short.startup_warnings(),
        [StartupWarning::ShortToken { bytes: 15 }]
    );
    assert!(!short.startup_warnings()[0]
        .to_string()
        .contains("0123456789abcde"));
    assert!(Dashboard::new(engine.clone())
        .token("0123456789abcdef")
        .startup_warnings()
        .is_empty());
    assert!(
        Dashboard::new(engine).startup_warnings().is_empty(),
        "no token, nothing to guess"
    );
}
