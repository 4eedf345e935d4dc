//! What a child process does: a worker (an engine worker at
//! `WorkerConfig`'s defaults) or a receiver (the tickmark receiver over HTTP
//! on loopback, with a Stripe source and no worker).

use std::sync::Arc;
use std::time::Duration;

use tickmark::receiver::providers::Stripe;
use tickmark::store::postgres::PostgresStore;
use tickmark::{Engine, Handlers, Receiver, WorkerConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::children::{Counters, Message};
use super::steps::{self, AppPool, WorkerName};
use super::{KIND, SECRET, SOURCE};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn engine(store: Arc<PostgresStore>, call_ms: u64) -> Result<Engine, BoxError> {
    let handlers = Handlers::new().on(SOURCE, KIND, steps::handler(call_ms));
    Ok(Engine::new(store, handlers)?)
}

/// A worker process: connect (the store's default pool), say `ready`, wait
/// for `go` on stdin, run one engine worker at `WorkerConfig::default()`
/// (named `name`; with `concurrency`, `with_concurrency(concurrency)`),
/// report its counters every 100 ms, and stop gracefully on SIGTERM or when
/// stdin closes.
pub async fn worker(
    url: &str,
    name: &str,
    call_ms: u64,
    concurrency: Option<usize>,
) -> Result<(), BoxError> {
    let store = Arc::new(PostgresStore::connect(url).await?);
    let pool = store.pool().clone();
    let engine = engine(store, call_ms)?
        .with_resource(WorkerName(name.to_owned()))
        .with_resource(AppPool(pool));
    let mut config = WorkerConfig::default().with_name(name);
    if let Some(concurrency) = concurrency {
        config = config.with_concurrency(concurrency);
    }
    let worker = engine.worker(config)?;
    let mut stats = worker.stats();
    Message::Ready.say();

    let mut stdin = stdin_lines();
    match stdin.recv().await {
        Some(line) if line.trim() == "go" => {}
        _ => return Ok(()),
    }
    tracing::info!(%name, "worker starts");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let stop = tickmark_examples::shutdown::shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                Message::Stats(Counters::from(&*stats.borrow_and_update())).say();
            }
            line = stdin.recv() => {
                if line.is_none() {
                    break;
                }
            }
            _ = &mut stop => break,
        }
    }
    shutdown.cancel();
    running.await??;
    Message::Stats(Counters::from(&*stats.borrow())).say();
    Ok(())
}

/// Lines of stdin, read on a thread of their own (the channel closes at
/// end of input: the coordinator is gone).
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (sender, lines) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// A receiver process: serve the Stripe source on `127.0.0.1:0`, say the
/// address, stop gracefully on SIGTERM or when stdin closes.
pub async fn receiver(url: &str, call_ms: u64) -> Result<(), BoxError> {
    let store = Arc::new(PostgresStore::connect(url).await?);
    let engine = engine(store, call_ms)?;
    let router = Receiver::new(engine)
        .source(SOURCE, Stripe::new([SECRET])?)?
        .standalone_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Message::Listening(listener.local_addr()?.to_string()).say();
    // Stop on SIGTERM, or when stdin closes: the coordinator is gone.
    let mut stdin = stdin_lines();
    let stop = async move {
        tokio::select! {
            _ = tickmark_examples::shutdown::shutdown_signal() => {}
            _ = async { while stdin.recv().await.is_some() {} } => {}
        }
    };
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await?;
    Ok(())
}
