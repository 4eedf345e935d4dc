//! `existing_app`: a shop service with its own axum router, sqlx pool,
//! migrations and tables, that adds tickmark's inbox, workers and webhook
//! receiver without giving any of them up (docs/existing_service.md).
//!
//! ```sh
//! STRIPE_WEBHOOK_SECRET=whsec_… SHOPIFY_WEBHOOK_SECRET=… \
//!   cargo run -p tickmark-examples --bin existing_app -- --database-url postgres://…
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use sqlx::postgres::PgPoolOptions;
use tickmark::operator::{Actor, ReplanIgnored};
use tickmark::store::postgres::PostgresStore;
use tickmark::{Engine, WorkerConfig};
use tickmark_examples::existing_app::{self, handlers, AppState, Secrets, APP_MIGRATOR};
use tickmark_examples::shutdown::shutdown_signal;
use tokio_util::sync::CancellationToken;

/// A shop service that added tickmark: `POST /orders`, `GET /orders/{id}`,
/// and Stripe's and Shopify's webhooks at `POST /webhooks/{source}`, with a
/// worker in the same process.
///
/// Environment: STRIPE_WEBHOOK_SECRET (Stripe's endpoint secret) and
/// SHOPIFY_WEBHOOK_SECRET (the Shopify app's client secret), both required.
#[derive(Debug, Parser)]
#[command(name = "existing_app", version)]
struct Args {
    /// The service's PostgreSQL database; tickmark's tables go beside its own.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8082")]
    listen: SocketAddr,
    /// Instead of serving: give the events of SOURCE that were recorded
    /// `ignored` (no handler took their kind then) the plans this build's
    /// handlers have for them, print how many, and exit. Run it after a
    /// deploy that adds a handler.
    #[arg(long, value_name = "SOURCE")]
    replan_ignored: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let _logging = tickmark_examples::logging::log_to_stderr("existing_app", "info,sqlx=warn");
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("existing_app: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let database = tickmark::redact_url(&args.database_url).into_owned();
    // The service's pool, as it had it; tickmark's store shares it.
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .connect(&args.database_url)
        .await
        .map_err(|e| format!("cannot connect to {database}: {e}"))?;
    // Two migrators, two histories: the service's own in `_sqlx_migrations`,
    // tickmark's in its own table. Either may run first.
    APP_MIGRATOR
        .run(&pool)
        .await
        .map_err(|e| format!("the service's migrations failed on {database}: {e}"))?;
    tickmark::migrate(&pool)
        .await
        .map_err(|e| format!("tickmark's migrations failed on {database}: {e}"))?;
    let store = PostgresStore::from_pool(pool.clone())
        .await
        .map_err(|e| format!("cannot use {database}: {e}"))?;
    let engine = Engine::new(Arc::new(store), handlers::handlers())
        .map_err(|e| format!("invalid handlers: {e}"))?;

    if let Some(source) = &args.replan_ignored {
        let report = engine
            .replan_ignored(&ReplanIgnored {
                source,
                kind: None,
                since: None,
                actor: Actor {
                    who: "existing_app --replan-ignored",
                    reason: Some("a deploy added handlers"),
                },
            })
            .await
            .map_err(|e| format!("re-planning failed: {e}"))?;
        println!(
            "existing_app: re-planned {} ignored events of {source} (kinds: {}); {} left ignored \
             (their handler debounces)",
            report.replanned,
            report.kinds.join(", "),
            report.debounced
        );
        return Ok(());
    }

    let secrets = Secrets {
        stripe: required("STRIPE_WEBHOOK_SECRET")?,
        shopify: required("SHOPIFY_WEBHOOK_SECRET")?,
    };
    let app = AppState {
        pool,
        engine: engine.clone(),
        crash_after_commit: std::env::var("EXISTING_APP_CRASH_AFTER_COMMIT").ok(),
    };
    let router = existing_app::router(app, &secrets).map_err(|e| e.to_string())?;

    let limits = tickmark::serve::Limits::default();
    let listener = tickmark::serve::bind(args.listen, &limits)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(database, "existing_app ready");
    println!("existing_app: listening on http://{addr}");

    let stop = CancellationToken::new();
    let worker = engine
        .worker(WorkerConfig::default())
        .map_err(|e| format!("invalid worker settings: {e}"))?;
    let worker = tokio::spawn(worker.run(stop.clone()));
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    // The service's router, served with the connection and time limits
    // every internet-facing listener needs.
    let served =
        tickmark::serve::serve(listener, router, limits, stop.clone().cancelled_owned()).await;
    stop.cancel();
    let worked = worker.await;
    served.map_err(|e| format!("the HTTP server failed: {e}"))?;
    match worked {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the worker failed: {e}")),
        Err(e) => Err(format!("the worker stopped unexpectedly: {e}")),
    }
}

fn required(variable: &str) -> Result<String, String> {
    std::env::var(variable)
        .ok()
        .filter(|value| !value.is_empty())
        .ok_or_else(|| format!("{variable} is not set: set it to the provider's signing secret"))
}
