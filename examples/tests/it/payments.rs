//! The `payments` binary, end to end over a real socket: a signed Stripe
//! `invoice.payment_succeeded` delivered three times credits the balance
//! once, POSTs the receipt (retried after a 503, with the same
//! `Idempotency-Key`) to a local stand-in, and writes the invoice file; a
//! source without a secret answers 404; SIGTERM stops it cleanly; the
//! dashboard's port closes a slowloris as the receiver's does.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use tickmark::Backend;
use tickmark_examples::payments;
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Outgoing};
use tickmark_tests::TestDb;
use tokio::process::{Child, Command};

const SECRET: &str = "whsec_e2e_test_secret";

/// A receipt the stand-in service received.
#[derive(Debug, Clone)]
struct Receipt {
    idempotency_key: Option<String>,
    body: serde_json::Value,
}

/// The stand-in receipt service: answers 503 to its first call, 200 after.
async fn receipt_service() -> (LoopbackServer, Arc<Mutex<Vec<Receipt>>>) {
    let received = Arc::new(Mutex::new(Vec::<Receipt>::new()));
    let log = received.clone();
    let router = axum::Router::new().route(
        "/receipts",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let log = log.clone();
            async move {
                let mut log = log.lock().unwrap();
                log.push(Receipt {
                    idempotency_key: headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                    body: serde_json::from_slice(&body).unwrap_or_default(),
                });
                if log.len() == 1 {
                    (StatusCode::SERVICE_UNAVAILABLE, "busy, try again")
                } else {
                    (StatusCode::OK, "stored")
                }
            }
        }),
    );
    (LoopbackServer::start(router).await, received)
}

/// A running `payments` process; killed if the test ends early.
struct App {
    child: Child,
    addr: std::net::SocketAddr,
    /// The dashboard's address, when started with `--dashboard-listen`.
    ops: Option<std::net::SocketAddr>,
    log: PathBuf,
}

impl App {
    async fn start(dir: &Path, database_url: &str, extra: &[&str]) -> App {
        let log = dir.join(format!("payments-{}.log", rand_suffix()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_payments"))
            .current_dir(dir)
            .args(["--database-url", database_url, "--listen", "127.0.0.1:0"])
            .args(extra)
            .env(
                "STRIPE_WEBHOOK_SECRET",
                format!("whsec_new_rotated,{SECRET}"),
            )
            .env_remove("GITHUB_WEBHOOK_SECRET")
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("start the payments binary");
        let mut lines = tickmark_tests::announced::stdout_lines(&mut child);
        let mut announced = async |prefix: &str| {
            let line = tickmark_tests::announced::line_starting_with(&mut lines, prefix)
                .await
                .unwrap_or_else(|why| {
                    panic!(
                        "payments did not announce `{prefix}` ({why:?}):\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                });
            let address = &line[prefix.len()..];
            let end = address.find('/').unwrap_or(address.len());
            address[..end].parse::<std::net::SocketAddr>().unwrap()
        };
        let addr = announced("payments: listening on http://").await;
        let ops = match extra.contains(&"--dashboard-listen") {
            true => Some(announced("payments: dashboard on http://").await),
            false => None,
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        App {
            child,
            addr,
            ops,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status.
    async fn terminate(mut self) -> std::process::ExitStatus {
        tickmark_tests::terminate::terminate(&mut self.child, "payments").await
    }
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A Stripe delivery of `body`, signed now.
fn stripe(body: &str) -> Outgoing {
    let t = chrono::Utc::now().timestamp();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    Outgoing::post("/hooks/stripe", body.to_owned())
        .header("content-type", "application/json")
        .header("stripe-signature", format!("t={t},v1={signature}"))
}

fn invoice_paid(event_id: &str, customer: &str, amount: i64) -> String {
    serde_json::json!({
        "id": event_id,
        "object": "event",
        "type": "invoice.payment_succeeded",
        "data": {"object": {
            "id": format!("in_{event_id}"),
            "object": "invoice",
            "customer": customer,
            "amount_paid": amount,
            "currency": "usd"
        }}
    })
    .to_string()
}

async fn wait_for(what: &str, app: &App, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}; app log:\n{}", app.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_paid_invoice_is_credited_once_receipted_and_rendered(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (receipts_server, receipts) = receipt_service().await;
    let receipt_url = format!("http://{}/receipts", receipts_server.addr);
    let app = App::start(
        dir.path(),
        &db.url,
        &[
            "--receipt-url",
            &receipt_url,
            "--render-secs",
            "1",
            "--out-dir",
            "out",
        ],
    )
    .await;
    let client = HttpClient::new();

    // Delivered three times (a provider's retries): one new, two duplicates.
    let delivery = stripe(&invoice_paid("evt_e2e_1", "cus_ada", 1200));
    let mut words = Vec::new();
    for _ in 0..3 {
        let reply = client.send(app.addr, &delivery).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.json());
        words.push(reply.json()["status"].as_str().unwrap().to_owned());
    }
    assert_eq!(words, ["new", "duplicate", "duplicate"]);

    // Another kind from the same source runs `record`.
    let other = serde_json::json!({"id": "evt_e2e_2", "type": "customer.created", "data": {}});
    let reply = client
        .send(app.addr, &stripe(&other.to_string()))
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "new");

    // A source without its secret is off.
    let github = Outgoing::post("/hooks/github", "{}").header("x-github-event", "push");
    let reply = client.send(app.addr, &github).await.unwrap();
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["error"], "unknown_source");

    let health = client
        .send(app.addr, &Outgoing::get("/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status, 200);

    let state = |id: &'static str| {
        let probe = db.probe.clone();
        async move {
            probe
                .text(&format!(
                    "SELECT state FROM tickmark_events WHERE dedup_key = '{id}'"
                ))
                .await
        }
    };
    wait_for("both events to be done", &app, async || {
        state("evt_e2e_1").await.as_deref() == Some("done")
            && state("evt_e2e_2").await.as_deref() == Some("done")
    })
    .await;

    let (_store, app_db) = payments::open(&db.url).await.unwrap();
    assert_eq!(
        app_db.balance("cus_ada").await.unwrap(),
        Some(1200),
        "credited exactly once"
    );
    assert_eq!(app_db.received_count().await.unwrap(), 1);

    let receipts = receipts.lock().unwrap().clone();
    assert_eq!(receipts.len(), 2, "a 503, then the retry: {receipts:?}");
    for receipt in &receipts {
        assert_eq!(
            receipt.idempotency_key.as_deref(),
            Some("stripe:evt_e2e_1:send_receipt"),
            "the same key on every attempt"
        );
        assert_eq!(receipt.body["customer"], "cus_ada");
        assert_eq!(receipt.body["amount_paid"], 1200);
        assert_eq!(receipt.body["balance"], 1200);
    }

    let invoice = std::fs::read_to_string(dir.path().join("out").join("evt_e2e_1.txt"))
        .expect("the invoice file");
    assert!(invoice.contains("in_evt_e2e_1"), "{invoice}");
    assert!(invoice.contains("cus_ada"), "{invoice}");
    assert!(invoice.contains("1200 usd"), "{invoice}");
    assert!(invoice.contains("receipt:      sent"), "{invoice}");

    // Redelivered after everything ran: still a duplicate, nothing runs again.
    let reply = client.send(app.addr, &delivery).await.unwrap();
    assert_eq!(reply.json()["status"], "duplicate");

    let log = app.log();
    assert!(
        log.contains("source off"),
        "start-up names the sources that are off:\n{log}"
    );
    assert!(!log.contains(SECRET), "secrets are never logged");
    let status = app.terminate().await;
    assert!(status.success(), "graceful exit on SIGTERM: {status}");
    receipts_server.shutdown().await;
}

/// Several `payments` processes on one PostgreSQL database share the work
/// (and the schema set-up): every event is done once, whichever process
/// received it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_on_one_postgres_share_the_work() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = tokio::join!(
        App::start(dir.path(), &db.url, &["--out-dir", "out"]),
        App::start(dir.path(), &db.url, &["--out-dir", "out"]),
    );
    let client = HttpClient::new();
    for n in 0..10 {
        let app = if n % 2 == 0 { &a } else { &b };
        let body = invoice_paid(&format!("evt_shared_{n}"), "cus_shared", 100);
        let reply = client.send(app.addr, &stripe(&body)).await.unwrap();
        assert_eq!(reply.json()["status"], "new");
        // The other process sees the same inbox: a redelivery there is a duplicate.
        let other = if n % 2 == 0 { &b } else { &a };
        let reply = client.send(other.addr, &stripe(&body)).await.unwrap();
        assert_eq!(reply.json()["status"], "duplicate");
    }
    wait_for("all ten events to be done", &a, async || {
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'done'")
            .await
            == 10
    })
    .await;
    let (_store, app_db) = payments::open(&db.url).await.unwrap();
    assert_eq!(app_db.balance("cus_shared").await.unwrap(), Some(1000));
    for n in 0..10 {
        assert!(dir
            .path()
            .join("out")
            .join(format!("evt_shared_{n}.txt"))
            .exists());
    }
    assert!(a.terminate().await.success());
    assert!(b.terminate().await.success());
}

/// The dashboard's port is served with the receiver's limits: a client that
/// sends its request head a line every quarter second (slowloris) is cut
/// off at `--header-read-timeout`, while deliveries are answered. (With
/// plain `axum::serve` it was held open for as long as it kept sending.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_port_closes_a_slowloris() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDb::new(Backend::Sqlite).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = App::start(
        dir.path(),
        &db.url,
        &[
            "--dashboard-listen",
            "127.0.0.1:0",
            "--dashboard-token",
            "a-dashboard-token-for-the-slowloris-test",
            "--header-read-timeout",
            "1",
        ],
    )
    .await;
    let ops = app.ops.expect("the dashboard's address");
    let (mut reader, mut writer) = tokio::net::TcpStream::connect(ops)
        .await
        .unwrap()
        .into_split();
    let trickle = tokio::spawn(async move {
        writer.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await?;
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            writer.write_all(b"x-slow: 1\r\n").await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let reply = HttpClient::new()
        .send(
            app.addr,
            &stripe(&invoice_paid("evt_slowloris", "cus_s", 1)),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "new");
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), reader.read_to_end(&mut sink))
        .await
        .unwrap_or_else(|_| panic!("the dashboard port still holds a slowloris after 30 s"))
        .ok();
    assert!(
        !String::from_utf8_lossy(&sink).starts_with("HTTP/1.1 200"),
        "{sink:?}"
    );
    trickle.abort();
    assert!(app.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_paid_invoice_is_credited_once_receipted_and_rendered() {
    a_paid_invoice_is_credited_once_receipted_and_rendered(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_paid_invoice_is_credited_once_receipted_and_rendered() {
    a_paid_invoice_is_credited_once_receipted_and_rendered(Backend::Postgres).await;
}

/// `--help` explains every flag, the secrets' variables, and how to try it.
#[test]
fn help_names_the_flags_the_variables_and_an_example() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payments"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "--database-url",
        "--listen",
        "--receipt-url",
        "--render-secs",
        "--out-dir",
        "--public-url",
        "sqlite://payments.db",
        "127.0.0.1:8080",
        "STRIPE_WEBHOOK_SECRET",
        "GITHUB_WEBHOOK_SECRET",
        "SHOPIFY_WEBHOOK_SECRET",
        "STANDARD_WEBHOOK_SECRET",
        "SLACK_SIGNING_SECRET",
        "TWILIO_AUTH_TOKEN",
        "DATABASE_URL",
        "curl",
        "openssl",
    ] {
        assert!(help.contains(needle), "--help mentions {needle}:\n{help}");
    }
}

/// A database URL's password never reaches the terminal: a start-up error
/// names the URL with its password masked.
#[test]
fn a_start_up_error_shows_the_database_url_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "mysql://app:s3cret-pw@db.internal/prod",
        "postgres://app:s3cret-pw@127.0.0.1:1/prod",
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_payments"))
            .current_dir(dir.path())
            .args(["--database-url", url, "--listen", "127.0.0.1:0"])
            .env("STRIPE_WEBHOOK_SECRET", "whsec_test_secret_long_enough")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!output.status.success(), "{url}: {said}");
        assert!(
            !said.contains("s3cret-pw"),
            "{url} leaked its password: {said}"
        );
        assert!(
            said.contains("app:***@"),
            "{url}: the masked URL is named: {said}"
        );
    }
}
