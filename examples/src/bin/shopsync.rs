//! `shopsync`: Shopify product updates pushed to the Admin API within its
//! limits, fleet-wide, and orders fulfilled once paid: a webhook receiver and
//! a worker in one process.
//!
//! ```text
//! SHOPIFY_WEBHOOK_SECRET=shpss_test cargo run -p tickmark-examples --bin shopsync -- \
//!     [--database-url URL] [--listen ADDR] [--admin-api-url URL] [--rate PER_SEC] \
//!     [--burst N] [--debounce-ms MS] [--per-shop-concurrency N] [--pay-timeout-secs SECS] \
//!     [--lease-secs SECS]
//! ```
//!
//! `products/update` is debounced per product, then `push_product` POSTs the
//! product's newest version to `<admin-api-url>/shops/<shop>/products/<id>`
//! with an `Idempotency-Key`, taking a token from the shop's bucket first and
//! running at most N of one shop at once. `orders/create` reserves the
//! order's stock, waits (holding nothing) up to `--pay-timeout-secs` for an
//! `orders/paid` whose signed body says the order is paid, then fulfils the
//! order or releases its stock.
//! Every other topic runs `record`.
//! Several processes on one PostgreSQL database share every limit.
//! `--help` says it all; `docs/shopsync.md` walks through it with curl and
//! openssl.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tickmark::privacy::Privacy;
use tickmark::{Engine, Receiver, WorkerConfig};
use tickmark_examples::secrets::secrets;
use tickmark_examples::shopsync::{
    self, AdminApi, AdminApiUrl, FlowSettings, OrderSettings, ShopifyWithShop,
};
use tickmark_examples::shutdown::shutdown_signal;
use tokio_util::sync::CancellationToken;

const ABOUT: &str = "Push Shopify product updates to the Admin API within its limits, fleet-wide, \
and fulfil orders once paid: a receiver and a worker in one process.";

const LONG_ABOUT: &str = "\
Push Shopify product updates to the Admin API within its limits, fleet-wide, and fulfil
orders once paid: a receiver and a worker in one process.

Routes: POST /hooks/shopify (Shopify webhooks) and GET /healthz. Every delivery is verified
on its raw bytes (X-Shopify-Hmac-Sha256), recorded once (a redelivery answers 200
{\"status\":\"duplicate\"}) and answered at once; a worker in the same process runs the steps.
A delivery must name its shop in X-Shopify-Shop-Domain (<handle>.myshopify.com), or it is
refused with 400.

products/update (the product is the body's `id`):
  debounced       a burst of updates to one product runs once, for the newest `updated_at`,
                  after --debounce-ms of quiet (at most 10 windows after the burst began)
  push_product    POSTs {\"id\",\"title\",\"updated_at\"} to
                  <admin-api-url>/shops/<shop>/products/<id> with an Idempotency-Key header;
                  one token from the shop's bucket (--rate per second, --burst when full)
                  before each call; at most --per-shop-concurrency of one shop at once.
                  A 429 waits its Retry-After without spending an attempt; 408, 5xx and
                  other answers are retried; any other 4xx dead-letters the event.
                  An update older than the one last pushed is skipped as stale.

orders/create (the order is the body's `id`):
  reserve_stock   POSTs {\"order_id\"} to <admin-api-url>/shops/<shop>/orders/<id>/reserve
  paid            waits, holding no worker slot, for an orders/paid of the same shop and
                  order id whose signed body says \"financial_status\":\"paid\" (the topic
                  is not signed), up to --pay-timeout-secs; one that arrived before the
                  orders/create counts too
  fulfill         if paid: POSTs {\"order_id\",\"paid_event_id\"} to .../orders/<id>/fulfill
  release_stock   if not paid in time: POSTs {\"order_id\",\"pay_deadline\"} to
                  .../orders/<id>/release
  Each call carries its step's Idempotency-Key and takes a token from the shop's bucket;
  answers are handled as for push_product. Exactly one of fulfill and release_stock runs.
  An order is created once: a later orders/create of the same order id is recorded as
  stale and runs nothing.

Every other topic (orders/paid included) runs one step, `record`, which adds (source,
event id, topic, shop) to the `shopsync_received` table.

Several `shopsync` processes on one PostgreSQL database share the work and every limit:
the buckets, the per-shop slots, the debounce and the waiting orders live in the database.
Give them all the same --rate, --burst, --debounce-ms, --per-shop-concurrency and
--pay-timeout-secs.";

const AFTER_HELP: &str = "\
Environment:
  SHOPIFY_WEBHOOK_SECRET   the app's client secret (required); several, comma-separated,
                           while one is rotated
  DATABASE_URL             same as --database-url
  RUST_LOG                 log filter (default: info)

Example: sign and send a product update with curl and openssl
  export SHOPIFY_WEBHOOK_SECRET=shpss_test
  shopsync --admin-api-url http://127.0.0.1:9000 &
  body='{\"id\":632910392,\"title\":\"IPod Nano\",\"updated_at\":\"2024-05-01T10:00:00-04:00\"}'
  sig=$(printf '%s' \"$body\" | openssl dgst -sha256 -hmac \"$SHOPIFY_WEBHOOK_SECRET\" -binary | base64)
  curl -s http://127.0.0.1:8081/hooks/shopify -H \"X-Shopify-Hmac-Sha256: $sig\" \\
       -H 'X-Shopify-Webhook-Id: 0b1c2d3e-0001' -H 'X-Shopify-Topic: products/update' \\
       -H 'X-Shopify-Shop-Domain: cool-shop.myshopify.com' \\
       -H 'Content-Type: application/json' -d \"$body\"
  # => {\"event_id\":\"0b1c2d3e-0001\",\"kind\":\"products/update\",\"status\":\"new\"}
  # 2 s later: POST http://127.0.0.1:9000/shops/cool-shop.myshopify.com/products/632910392";

/// Command-line settings.
#[derive(Debug, Parser)]
#[command(name = "shopsync", version, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP)]
struct Args {
    /// The database: `sqlite://FILE` (created if missing) or
    /// `postgres://USER@HOST/DB` (for several processes). tickmark's tables
    /// and the app's (`shopsync_received`) live there.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://shopsync.db")]
    database_url: String,

    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,

    /// The Admin API's base URL (http:// only): `push_product` POSTs to
    /// `<URL>/shops/<shop>/products/<id>`, the order calls to
    /// `<URL>/shops/<shop>/orders/<id>/{reserve,fulfill,release}`. Without
    /// it, calls fail and are retried (a process that has it can run them).
    #[arg(long, value_name = "URL")]
    admin_api_url: Option<AdminApiUrl>,

    /// Admin API calls per second per shop (the bucket's refill rate),
    /// shared by every process on the database.
    #[arg(long, value_name = "PER_SEC", default_value_t = FlowSettings::default().rate_per_sec,
          value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,

    /// Admin API calls one shop may make at once after a quiet spell (the
    /// bucket's size).
    #[arg(long, value_name = "N", default_value_t = FlowSettings::default().burst,
          value_parser = clap::value_parser!(u32).range(1..))]
    burst: u32,

    /// A product's updates are coalesced until it has been quiet this many
    /// milliseconds; then its newest is pushed (at most 10 windows after the
    /// burst began).
    #[arg(long, value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    debounce_ms: u64,

    /// At most N products/update events of one shop run at once, across
    /// every process on the database.
    #[arg(long, value_name = "N", default_value_t = FlowSettings::default().per_shop_concurrency,
          value_parser = clap::value_parser!(u32).range(1..))]
    per_shop_concurrency: u32,

    /// How long an order may stay unpaid, in seconds, counted from when its
    /// stock was reserved: an orders/paid of the same shop and order accepted
    /// by then fulfils it (one accepted before the orders/create counts
    /// too); otherwise its stock is released. Waiting orders hold no worker
    /// slot. Kept with each order when its orders/create is accepted, so a
    /// change applies to new orders only. The default is 3 days.
    #[arg(long, value_name = "SECS",
          default_value_t = OrderSettings::DEFAULT_PAY_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pay_timeout_secs: u64,

    /// The lease on a running step, in seconds (renewed every third of it
    /// while the process lives). A process that dies mid-step leaves its
    /// steps to the others after at most this long; they re-run with the
    /// same Idempotency-Key. Shorter takes over sooner, but a process stalled
    /// longer than this (overload, a long pause) loses its steps while still
    /// running them.
    #[arg(long, value_name = "SECS", default_value_t = WorkerConfig::default().lease.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_secs: u64,
}

impl Args {
    fn flow(&self) -> FlowSettings {
        FlowSettings {
            rate_per_sec: self.rate,
            burst: self.burst,
            debounce: Duration::from_millis(self.debounce_ms),
            per_shop_concurrency: self.per_shop_concurrency,
        }
    }

    fn orders(&self) -> OrderSettings {
        OrderSettings {
            pay_timeout: Duration::from_secs(self.pay_timeout_secs),
        }
    }

    fn worker(&self) -> WorkerConfig {
        WorkerConfig::default().with_lease(Duration::from_secs(self.lease_secs))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let _logging = tickmark_examples::logging::log_to_stderr("shopsync", "info,sqlx=warn");
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("shopsync: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let secrets = secrets(std::env::var(shopsync::SECRET_VARIABLE).ok()).ok_or_else(|| {
        format!(
            "{} is not set: set it to the Shopify app's client secret (several, \
             comma-separated, while one is rotated)",
            shopsync::SECRET_VARIABLE
        )
    })?;
    let provider = ShopifyWithShop::new(&secrets)
        .map_err(|e| format!("{}: {e}", shopsync::SECRET_VARIABLE))?;

    let flow = args.flow();
    let store = shopsync::open(&args.database_url).await.map_err(|e| {
        format!(
            "cannot open the database {}: {e}",
            tickmark::redact_url(&args.database_url)
        )
    })?;
    // Payloads sealed with TICKMARK_KEYS, subjects recorded under
    // TICKMARK_SUBJECT_KEY, when set (docs/privacy.md): then Shopify's
    // compliance topics erase what a customer or a shop asks.
    let privacy = Privacy::from_env().map_err(|e| e.to_string())?;
    let handlers = if privacy.subject_key().is_some() {
        shopsync::handlers_recording_subjects(&flow, &args.orders())
    } else {
        shopsync::handlers(&flow, &args.orders())
    };
    let engine = Engine::new(store, handlers)
        .map_err(|e| format!("invalid handlers: {e}"))?
        .with_privacy(privacy)
        .with_resource(AdminApi::new(args.admin_api_url.clone()));
    engine.check_keys().await.map_err(|e| e.to_string())?;
    shopsync::create_tables(&engine).await.map_err(|e| {
        format!(
            "cannot create the app's table in {}: {e}",
            tickmark::redact_url(&args.database_url)
        )
    })?;
    if args.admin_api_url.is_none() {
        tracing::warn!(
            "no --admin-api-url: this process cannot push products; its pushes fail and are retried"
        );
    }

    let receiver = Receiver::new(engine.clone())
        .source(shopsync::SOURCE, provider)
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(
        database = %tickmark::redact_url(&args.database_url),
        admin_api = args.admin_api_url.as_ref().map(ToString::to_string).unwrap_or_else(|| "none".into()),
        rate_per_sec = flow.rate_per_sec,
        burst = flow.burst,
        debounce_ms = args.debounce_ms,
        per_shop_concurrency = flow.per_shop_concurrency,
        pay_timeout_secs = args.pay_timeout_secs,
        lease_secs = args.lease_secs,
        "shopsync ready: POST /hooks/shopify"
    );
    // One plain line on stdout, for scripts and tests that start the app.
    println!("shopsync: listening on http://{addr}");

    let stop_http = CancellationToken::new();
    let stop_worker = CancellationToken::new();
    let worker = engine
        .worker(args.worker())
        .map_err(|e| format!("invalid worker settings: {e}"))?;
    let worker = tokio::spawn(worker.run(stop_worker.clone()));
    // On the signal, the HTTP server and the worker stop together: the
    // worker's grace period for running steps runs while the connections
    // finish, not after them (a client holding a connection must not hold
    // the worker's stop back).
    tokio::spawn({
        let (stop_http, stop_worker) = (stop_http.clone(), stop_worker.clone());
        async move {
            shutdown_signal().await;
            tracing::info!(
                "shutting down: no new deliveries; running steps get their grace period"
            );
            stop_http.cancel();
            stop_worker.cancel();
        }
    });

    // The server stops accepting on the signal (requests in flight finish,
    // within the shutdown deadline); the worker's graceful shutdown runs at
    // the same time: running steps finish or are released.
    let served = receiver
        .serve(listener, stop_http.clone().cancelled_owned())
        .await;
    stop_http.cancel();
    stop_worker.cancel();
    let worked = worker.await;
    served.map_err(|e| format!("the HTTP server failed: {e}"))?;
    match worked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("the worker failed: {e}")),
        Err(e) => return Err(format!("the worker stopped unexpectedly: {e}")),
    }
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_contracts() {
        let args = Args::parse_from(["shopsync"]);
        assert_eq!(args.listen.to_string(), "127.0.0.1:8081");
        assert_eq!(args.admin_api_url, None);
        assert_eq!(args.flow(), FlowSettings::default());
        assert_eq!(args.debounce_ms, 2000);
        assert_eq!(args.orders(), OrderSettings::default());
        assert_eq!(args.pay_timeout_secs, 259_200);
        assert_eq!(args.worker().lease, WorkerConfig::default().lease);
    }

    #[test]
    fn limits_are_at_least_one() {
        for flag in [
            "--rate",
            "--burst",
            "--debounce-ms",
            "--per-shop-concurrency",
            "--pay-timeout-secs",
            "--lease-secs",
        ] {
            assert!(
                Args::try_parse_from(["shopsync", flag, "0"]).is_err(),
                "{flag}"
            );
            assert!(
                Args::try_parse_from(["shopsync", flag, "3"]).is_ok(),
                "{flag}"
            );
        }
    }
}
