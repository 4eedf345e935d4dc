//! How fast the receiver acknowledges webhooks, next to what the database
//! itself can commit.
//!
//! ```text
//! cargo run --release -p tickmark-bench --bin receiver_bench -- \
//!     [--database-url URL] [--requests N]
//! ```
//!
//! Serves the receiver on loopback with one Stripe source (no worker: this
//! measures acceptance), and drives signed Stripe deliveries, 20% of them
//! redeliveries, from 1, 16 and 64 concurrent HTTP/1.1 clients. At each
//! level it then measures, on the same database with the same concurrency,
//! `Engine::accept` called directly (the inbox insert without HTTP and
//! verification), and the database's own ceiling: one-row `INSERT` commits
//! into a scratch table with plain sqlx (on SQLite, serialised like the
//! store's writes, since SQLite has one writer). It prints a table, then one
//! JSON array as the last line.
//!
//! Default: a fresh SQLite file in a temp folder. A PostgreSQL URL without a
//! `search_path` gets a fresh schema (`receiver_bench_<pid>`), dropped
//! afterwards.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::Request;
use clap::Parser;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use sqlx::{Connection, PgPool, SqlitePool};
use tickmark::receiver::providers::Stripe;
use tickmark::store::postgres::PostgresStore;
use tickmark::store::sqlite::SqliteStore;
use tickmark::{Engine, Handler, Handlers, NewEvent, Receiver, Store};
use tickmark_examples::stripe_signature::stripe_signature;
use tokio::sync::Mutex;

const SECRET: &str = "whsec_receiver_bench";
const LEVELS: [usize; 3] = [1, 16, 64];
const DUPLICATE_SHARE: f64 = 0.2;
/// The source of the events `Engine::accept` is called with directly (so
/// their ids do not collide with the HTTP deliveries').
const DIRECT_SOURCE: &str = "stripe_direct";

/// Measure webhook acknowledgements against the database's own insert ceiling.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Database (`sqlite://…` or `postgres://…`). Default: a new SQLite file
    /// in a temp folder. A PostgreSQL URL without `search_path` runs in a
    /// fresh schema, dropped afterwards.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Deliveries per concurrency level (and inserts for the ceiling).
    #[arg(long, default_value_t = 3000)]
    requests: usize,
}

/// The database, for the ceiling's plain inserts.
#[derive(Clone)]
enum Scratch {
    Sqlite(SqlitePool, Arc<Mutex<()>>),
    Postgres(PgPool),
}

#[derive(Debug, serde::Serialize)]
struct Level {
    backend: &'static str,
    concurrency: usize,
    requests: usize,
    new: usize,
    duplicate: usize,
    failed: usize,
    requests_per_s: f64,
    ack_p50_ms: f64,
    ack_p99_ms: f64,
    accept_calls_per_s: f64,
    db_insert_commits_per_s: f64,
    ratio: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let temp = tempfile::tempdir()?;
    let (url, drop_schema) = match &args.database_url {
        None => (
            format!("sqlite://{}", temp.path().join("bench.db").display()),
            None,
        ),
        Some(url) if url.starts_with("postgres") && !url.contains("search_path") => {
            let schema = format!("receiver_bench_{}", std::process::id());
            let mut admin = sqlx::PgConnection::connect(url).await?;
            sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&mut admin)
                .await?;
            admin.close().await?;
            let separator = if url.contains('?') { '&' } else { '?' };
            (
                format!("{url}{separator}options[search_path]={schema}"),
                Some((url.clone(), schema)),
            )
        }
        Some(url) => (url.clone(), None),
    };

    let (store, scratch, backend): (Arc<dyn Store>, Scratch, &'static str) =
        if url.starts_with("sqlite:") {
            let store = SqliteStore::connect(&url).await?;
            let pool = store.pool().clone();
            (
                Arc::new(store),
                Scratch::Sqlite(pool, Arc::new(Mutex::new(()))),
                "sqlite",
            )
        } else {
            let store = PostgresStore::connect(&url).await?;
            let pool = store.pool().clone();
            (Arc::new(store), Scratch::Postgres(pool), "postgres")
        };
    scratch
        .execute(
            "CREATE TABLE IF NOT EXISTS bench_ceiling (id TEXT PRIMARY KEY, payload TEXT NOT NULL)",
        )
        .await?;

    // A handler, so accepted events are `new` (pending), as in production;
    // no worker runs them.
    let plan =
        || Handler::new().named_step("credit_account", tickmark_examples::payments::CreditAccount);
    let handlers = Handlers::new()
        .on("stripe", "invoice.payment_succeeded", plan())
        .on(DIRECT_SOURCE, "invoice.payment_succeeded", plan());
    let engine = Engine::new(store, handlers)?;
    let router = Receiver::new(engine.clone())
        .source("stripe", Stripe::new([SECRET])?)?
        .standalone_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    eprintln!(
        "receiver_bench: {backend}, {} requests per level ({}% redeliveries), receiver on http://{addr}",
        args.requests,
        DUPLICATE_SHARE * 100.0
    );
    let mut levels = Vec::new();
    for (round, concurrency) in LEVELS.into_iter().enumerate() {
        let deliveries = Arc::new(deliveries(round, args.requests));
        let acks = drive(addr, concurrency, deliveries.clone()).await;
        let accepts = accept_directly(&engine, concurrency, deliveries).await?;
        let ceiling = ceiling(&scratch, round, concurrency, args.requests).await?;
        levels.push(summarise(backend, concurrency, acks, accepts, ceiling));
    }
    server.abort();

    println!();
    println!(
        "{:<9} {:>5} {:>8} {:>12} {:>9} {:>9} {:>10} {:>14} {:>7}",
        "backend",
        "conc",
        "requests",
        "requests/s",
        "p50 ms",
        "p99 ms",
        "accept/s",
        "db commits/s",
        "ratio"
    );
    for level in &levels {
        println!(
            "{:<9} {:>5} {:>8} {:>12.0} {:>9.2} {:>9.2} {:>10.0} {:>14.0} {:>7.2}",
            level.backend,
            level.concurrency,
            level.requests,
            level.requests_per_s,
            level.ack_p50_ms,
            level.ack_p99_ms,
            level.accept_calls_per_s,
            level.db_insert_commits_per_s,
            level.ratio
        );
    }
    for level in &levels {
        if level.failed > 0 {
            eprintln!(
                "warning: {} requests failed at concurrency {}",
                level.failed, level.concurrency
            );
        }
    }
    println!("{}", serde_json::to_string(&levels)?);

    if let Some((admin_url, schema)) = drop_schema {
        let mut admin = sqlx::PgConnection::connect(&admin_url).await?;
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
    }
    Ok(())
}

/// `count` signed deliveries for one level: 80% new events, 20% redeliveries
/// of an earlier one.
fn deliveries(round: usize, count: usize) -> Vec<(String, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(round as u64);
    let t = chrono::Utc::now().timestamp();
    let mut bodies: Vec<String> = Vec::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let body = if !bodies.is_empty() && rng.gen_bool(DUPLICATE_SHARE) {
            bodies[rng.gen_range(0..bodies.len())].clone()
        } else {
            let body = serde_json::json!({
                "id": format!("evt_bench_{round}_{i}"),
                "object": "event",
                "type": "invoice.payment_succeeded",
                "data": {"object": {
                    "id": format!("in_{round}_{i}"),
                    "customer": format!("cus_{}", i % 97),
                    "amount_paid": 1200,
                    "currency": "usd"
                }}
            })
            .to_string();
            bodies.push(body.clone());
            body
        };
        let signature = stripe_signature(SECRET, t, &body);
        out.push((body, signature));
    }
    out
}

/// What one request got back, and how long it took.
struct Ack {
    status: Option<&'static str>,
    took: Duration,
}

struct Acks {
    acks: Vec<Ack>,
    wall: Duration,
}

/// Send every delivery from `concurrency` clients; each sends its next one
/// when the previous is answered.
async fn drive(
    addr: std::net::SocketAddr,
    concurrency: usize,
    deliveries: Arc<Vec<(String, String)>>,
) -> Acks {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, next, deliveries) = (client.clone(), next.clone(), deliveries.clone());
        tasks.push(tokio::spawn(async move {
            let mut acks = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((body, signature)) = deliveries.get(i) else {
                    break;
                };
                let request = Request::post(format!("http://{addr}/hooks/stripe"))
                    .header("content-type", "application/json")
                    .header("stripe-signature", signature)
                    .body(Body::from(body.clone()))
                    .expect("request");
                let sent = Instant::now();
                let status = match client.request(request).await {
                    Ok(response) => {
                        let ok = response.status().is_success();
                        let body = response
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_else(|_| Bytes::new());
                        let json: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or_default();
                        match (ok, json["status"].as_str()) {
                            (true, Some("new")) => Some("new"),
                            (true, Some("duplicate")) => Some("duplicate"),
                            _ => None,
                        }
                    }
                    Err(_) => None,
                };
                acks.push(Ack {
                    status,
                    took: sent.elapsed(),
                });
            }
            acks
        }));
    }
    let mut acks = Vec::new();
    for task in tasks {
        acks.extend(task.await.expect("client task"));
    }
    Acks {
        acks,
        wall: started.elapsed(),
    }
}

/// The same events through `Engine::accept` from `concurrency` tasks: the
/// inbox without HTTP and verification.
async fn accept_directly(
    engine: &Engine,
    concurrency: usize,
    deliveries: Arc<Vec<(String, String)>>,
) -> Result<f64, tickmark::StoreError> {
    let events: Arc<Vec<NewEvent>> = Arc::new(
        deliveries
            .iter()
            .map(|(body, _)| {
                let payload: serde_json::Value = serde_json::from_str(body).expect("JSON");
                let id = payload["id"].as_str().unwrap_or_default().to_owned();
                NewEvent::with_id(DIRECT_SOURCE, id, "invoice.payment_succeeded", payload)
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (engine, next, events) = (engine.clone(), next.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(event) = events.get(next.fetch_add(1, Ordering::Relaxed)) {
                engine.accept(event.clone()).await?;
            }
            Ok::<_, tickmark::StoreError>(())
        }));
    }
    for task in tasks {
        task.await.expect("accept task")?;
    }
    Ok(events.len() as f64 / started.elapsed().as_secs_f64())
}

impl Scratch {
    async fn execute(&self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Scratch::Sqlite(pool, _) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Scratch::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        }
    }

    async fn insert(&self, id: &str, payload: &str) -> Result<(), sqlx::Error> {
        match self {
            Scratch::Sqlite(pool, writer) => {
                let _turn = writer.lock().await;
                sqlx::query("INSERT INTO bench_ceiling (id, payload) VALUES (?1, ?2)")
                    .bind(id)
                    .bind(payload)
                    .execute(pool)
                    .await
                    .map(|_| ())
            }
            Scratch::Postgres(pool) => {
                sqlx::query("INSERT INTO bench_ceiling (id, payload) VALUES ($1, $2)")
                    .bind(id)
                    .bind(payload)
                    .execute(pool)
                    .await
                    .map(|_| ())
            }
        }
    }
}

/// One-row insert commits per second with `concurrency` writers.
async fn ceiling(
    scratch: &Scratch,
    round: usize,
    concurrency: usize,
    count: usize,
) -> Result<f64, sqlx::Error> {
    let payload = Arc::new("x".repeat(300));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (scratch, next, payload) = (scratch.clone(), next.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, sqlx::Error>(());
                }
                scratch
                    .insert(&format!("row_{round}_{i}"), &payload)
                    .await?;
            }
        }));
    }
    for task in tasks {
        task.await.expect("insert task")?;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

fn summarise(
    backend: &'static str,
    concurrency: usize,
    acks: Acks,
    accepts: f64,
    ceiling: f64,
) -> Level {
    let mut latencies: Vec<Duration> = acks.acks.iter().map(|a| a.took).collect();
    latencies.sort();
    let percentile = |p: f64| {
        let index = ((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1);
        latencies
            .get(index)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    };
    let count = |word: &str| acks.acks.iter().filter(|a| a.status == Some(word)).count();
    let requests_per_s = acks.acks.len() as f64 / acks.wall.as_secs_f64();
    Level {
        backend,
        concurrency,
        requests: acks.acks.len(),
        new: count("new"),
        duplicate: count("duplicate"),
        failed: acks.acks.iter().filter(|a| a.status.is_none()).count(),
        requests_per_s: round2(requests_per_s),
        ack_p50_ms: round2(percentile(0.50)),
        ack_p99_ms: round2(percentile(0.99)),
        accept_calls_per_s: round2(accepts),
        db_insert_commits_per_s: round2(ceiling),
        ratio: round2(requests_per_s / ceiling),
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
