//! tickmark's quick start: duplicates, a crash in the middle of a step, and a
//! resume — on the embedded SQLite default, with no set-up.
//!
//! ```text
//! cargo run -p tickmark-examples --bin quickstart
//! ```
//!
//! What it does, in order:
//! 1. accepts 8 deliveries of 5 `order.paid` events (3 are duplicates);
//! 2. starts a worker **process** that runs the three-step handler and dies
//!    (a real `exit`, no clean-up) in the middle of `charge_card` for `evt_3`,
//!    after the payment provider has already charged;
//! 3. resumes in this process once the dead worker's lease expires: `evt_3`
//!    starts again at `charge_card`, whose idempotency key makes the provider
//!    absorb the second call;
//! 4. prints the step-status table and checks that each step's effect
//!    happened exactly once.
//!
//! The database is `quickstart.db` in the current folder (recreated on each
//! run); open it with `sqlite3 quickstart.db 'SELECT * FROM tickmark_step_status'`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use tickmark::{
    Accepted, Engine, Handler, Handlers, NewEvent, Step, StepContext, StepResult, WorkerConfig,
};

/// The file the quick start writes.
const DATABASE: &str = "quickstart.db";
/// Short, so the resume after the crash is quick to watch.
const LEASE: Duration = Duration::from_secs(3);
/// The crash happens here.
const CRASH_EVENT: &str = "evt_3";
const CRASH_EXIT_CODE: i32 = 70;

// ---------------------------------------------------------------------------
// The three steps of the `order.paid` handler.
// ---------------------------------------------------------------------------

/// Step 1, transactional: its write commits in the same transaction as its
/// mark, so it happens exactly once.
#[derive(Debug, Serialize, Deserialize)]
struct ReserveStock;

#[typetag::serde(name = "quickstart.reserve_stock")]
#[async_trait::async_trait]
impl Step for ReserveStock {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let order = ctx.event().id.clone();
        let item = ctx.event().payload["item"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        // Written once for both backends: `$1` placeholders, the engine's transaction.
        ctx.transaction()?
            .query("INSERT INTO stock_moves (order_id, item) VALUES ($1, $2)")
            .bind(order)
            .bind(&item)
            .execute()
            .await?;
        Ok(json!({ "reserved": item }))
    }
}

/// Step 2, external: calls a payment provider with the step's idempotency key.
/// If the worker dies after the call, the step runs again with the same key,
/// and the provider answers with the first charge instead of charging twice.
#[derive(Debug, Serialize, Deserialize)]
struct ChargeCard;

/// Tells a worker process to die inside `charge_card` for one event.
struct CrashInside(String);

#[typetag::serde(name = "quickstart.charge_card")]
#[async_trait::async_trait]
impl Step for ChargeCard {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let provider = ctx.resource::<PaymentProvider>()?;
        let amount = ctx.event().payload["amount"].as_i64().unwrap_or(0);
        let charge = provider.charge(ctx.idempotency_key(), amount).await?;
        if let Ok(CrashInside(event)) = ctx.resource::<CrashInside>() {
            if *event == ctx.event().id {
                println!(
                    "    worker {}: charged {} for {}, now dying before marking the step done",
                    std::process::id(),
                    charge,
                    ctx.event().id
                );
                std::process::exit(CRASH_EXIT_CODE);
            }
        }
        Ok(json!({ "charge": charge, "amount": amount }))
    }
}

/// Step 3: sees the outputs of the steps before it, even after a crash.
#[derive(Debug, Serialize, Deserialize)]
struct SendReceipt;

#[typetag::serde(name = "quickstart.send_receipt")]
#[async_trait::async_trait]
impl Step for SendReceipt {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let charge = ctx
            .output("charge_card")
            .and_then(|o| o["charge"].as_str())
            .unwrap_or("?")
            .to_owned();
        let provider = ctx.resource::<PaymentProvider>()?;
        provider
            .send_receipt(ctx.idempotency_key(), &charge)
            .await?;
        Ok(json!({ "receipt_for": charge }))
    }
}

// ---------------------------------------------------------------------------
// A stand-in for the outside world: a payment provider that deduplicates on
// the Idempotency-Key, as Stripe does, and counts every call it receives.
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct PaymentProvider {
    pool: SqlitePool,
}

impl PaymentProvider {
    async fn open(url: &str) -> Result<Self, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(30));
        let pool = SqlitePool::connect_with(options).await?;
        for table in [
            "CREATE TABLE IF NOT EXISTS stock_moves (order_id TEXT NOT NULL, item TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS provider_calls (idempotency_key TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS provider_charges (idempotency_key TEXT PRIMARY KEY, charge TEXT NOT NULL, amount INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS provider_receipts (idempotency_key TEXT PRIMARY KEY, charge TEXT NOT NULL)",
        ] {
            sqlx::query(table).execute(&pool).await?;
        }
        Ok(Self { pool })
    }

    async fn charge(&self, key: &str, amount: i64) -> Result<String, sqlx::Error> {
        sqlx::query("INSERT INTO provider_calls (idempotency_key) VALUES (?1)")
            .bind(key)
            .execute(&self.pool)
            .await?;
        let charge = format!("ch_{:08x}", rand_id(key));
        sqlx::query("INSERT INTO provider_charges (idempotency_key, charge, amount) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING")
            .bind(key)
            .bind(&charge)
            .bind(amount)
            .execute(&self.pool)
            .await?;
        sqlx::query_scalar("SELECT charge FROM provider_charges WHERE idempotency_key = ?1")
            .bind(key)
            .fetch_one(&self.pool)
            .await
    }

    async fn send_receipt(&self, key: &str, charge: &str) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO provider_calls (idempotency_key) VALUES (?1)")
            .bind(key)
            .execute(&self.pool)
            .await?;
        sqlx::query("INSERT INTO provider_receipts (idempotency_key, charge) VALUES (?1, ?2) ON CONFLICT DO NOTHING")
            .bind(key)
            .bind(charge)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn count(&self, sql: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await
    }

    /// How many calls the provider received under each idempotency key.
    async fn calls_per_key(&self) -> Result<HashMap<String, i64>, sqlx::Error> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT idempotency_key, count(*) FROM provider_calls GROUP BY idempotency_key",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().collect())
    }
}

/// A stable pseudo-random charge id per key (FNV-1a).
fn rand_id(key: &str) -> u32 {
    key.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

// ---------------------------------------------------------------------------
// The story.
// ---------------------------------------------------------------------------

fn handlers() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("reserve_stock", ReserveStock)
            .named_step("charge_card", ChargeCard)
            .named_step("send_receipt", SendReceipt),
    )
}

fn worker_config(name: &str) -> WorkerConfig {
    WorkerConfig::default()
        .with_name(name)
        .with_lease(LEASE)
        .with_concurrency(1)
        // Nothing claimed ahead, so the crash strands only the event it was
        // running. (By default a worker of quick events claims ahead; a
        // crash would leave those waiting out their lease too, uncharged.)
        .with_prefetch(0)
        .with_poll_every(Duration::from_millis(250))
}

async fn engine(url: &str) -> Result<Engine, Box<dyn std::error::Error>> {
    let store = tickmark::connect(url).await?;
    let provider = PaymentProvider::open(url).await?;
    Ok(Engine::new(store, handlers())?.with_resource(provider))
}

/// The child process: a worker that dies inside `charge_card` of `evt_3`.
async fn crashing_worker(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let engine = engine(url)
        .await?
        .with_resource(CrashInside(CRASH_EVENT.to_owned()));
    engine
        .worker(worker_config("doomed-worker"))?
        .run_until_idle()
        .await?;
    Ok(())
}

async fn story(url: &str) -> Result<bool, Box<dyn std::error::Error>> {
    let engine = engine(url).await?;

    println!("1. Eight deliveries of five events arrive (providers deliver at least once):");
    let deliveries = [1, 2, 1, 3, 2, 4, 5, 3];
    for n in deliveries {
        let id = format!("evt_{n}");
        let payload = json!({ "item": format!("book-{n}"), "amount": 1000 * n });
        let answer = engine
            .accept(NewEvent::with_id("shop", &id, "order.paid", payload))
            .await?;
        let said = match answer {
            Accepted::New { .. } => "new: recorded, its steps will run",
            Accepted::Duplicate => "duplicate: already recorded, nothing will run again",
            Accepted::Ignored { .. } => "ignored: no handler",
        };
        println!("    {id}  ->  200 {said}");
    }

    println!(
        "\n2. A worker process starts, and dies in the middle of `charge_card` for {CRASH_EVENT}:"
    );
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--crashing-worker", url])
        .status()?;
    println!("    worker process exited with {status} (no clean-up, its lease left behind)");
    print_table(&engine, &[CRASH_EVENT]).await?;
    if let Some(status) = engine.event_status("shop", CRASH_EVENT).await? {
        let left = (status.record.due_at - chrono::Utc::now())
            .to_std()
            .unwrap_or_default();
        tokio::time::sleep(left + Duration::from_millis(100)).await;
    }
    println!("    ...{}s later its lease has expired: the step's outcome is unknown, it is `interrupted`", LEASE.as_secs());
    print_table(&engine, &[CRASH_EVENT]).await?;

    println!(
        "\n3. A new worker starts. It takes {CRASH_EVENT} over and resumes at the first unfinished step,\n   with the same idempotency keys:"
    );
    let stats = engine
        .worker(worker_config("rescuer"))?
        .run_until_idle()
        .await?;
    println!(
        "    done: {} events finished, {} steps marked, {} lease taken over",
        stats.events_done, stats.steps_done, stats.takeovers
    );

    println!("\n4. The step-status table (SELECT * FROM tickmark_step_status):");
    let ids: Vec<String> = (1..=5).map(|n| format!("evt_{n}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    print_table(&engine, &ids).await?;

    println!("\n5. Each step's effect happened exactly once:");
    let provider = PaymentProvider::open(url).await?;
    let orders = 1..=5_i64;
    let mut all_once = true;
    let mut check = |ok: bool, what: String| {
        all_once &= ok;
        println!("    {} {what}", if ok { "ok  " } else { "FAIL" });
    };

    // The transactional step's rows have no unique key: a second run would
    // leave a second row.
    let moves = provider.count("SELECT count(*) FROM stock_moves").await?;
    let moved_orders = provider
        .count("SELECT count(DISTINCT order_id) FROM stock_moves")
        .await?;
    check(
        moves == 5 && moved_orders == 5,
        format!("stock reserved once per order (transactional step): {moves} rows for 5 orders"),
    );

    // The provider logs every call it receives, as a real provider's request
    // log would: a done step that ran again would show as a second call.
    // Only the step in flight at the crash may have been called twice.
    let calls = provider.calls_per_key().await?;
    let expected = |step: &str, n: i64| {
        let in_flight = step == "charge_card" && format!("evt_{n}") == CRASH_EVENT;
        (
            format!("shop:evt_{n}:{step}"),
            if in_flight { 2 } else { 1 },
        )
    };
    let mut known_keys = Vec::new();
    for step in ["charge_card", "send_receipt"] {
        let wanted: Vec<(String, i64)> = orders.clone().map(|n| expected(step, n)).collect();
        known_keys.extend(wanted.iter().map(|(key, _)| key.clone()));
        let got: Vec<(String, i64)> = wanted
            .iter()
            .map(|(key, _)| (key.clone(), calls.get(key).copied().unwrap_or(0)))
            .collect();
        let total: i64 = got.iter().map(|(_, n)| n).sum();
        check(
            got == wanted,
            format!(
                "`{step}` called {total} times for 5 orders{}",
                if step == "charge_card" {
                    format!(": twice for {CRASH_EVENT}, whose call was in flight at the crash")
                } else {
                    String::new()
                }
            ),
        );
    }
    let unexpected = calls.keys().filter(|key| !known_keys.contains(key)).count();
    check(
        unexpected == 0,
        format!("no call under any other key: {unexpected}"),
    );

    // The money: the provider absorbed the repeated call by its key.
    let charged = provider
        .count("SELECT CAST(coalesce(sum(amount), 0) AS BIGINT) FROM provider_charges")
        .await?;
    let ordered: i64 = orders.map(|n| 1000 * n).sum();
    check(
        charged == ordered,
        format!("charged {charged} in all for orders worth {ordered}: the repeat was absorbed by its idempotency key"),
    );
    Ok(all_once)
}

async fn print_table(
    engine: &Engine,
    event_ids: &[&str],
) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "    {:<7} {:<14} {:<12} {:>8}  idempotency key",
        "event", "step", "state", "attempts"
    );
    for id in event_ids {
        let Some(status) = engine.event_status("shop", id).await? else {
            continue;
        };
        for step in status.steps {
            println!(
                "    {:<7} {:<14} {:<12} {:>8}  {}",
                id, step.step, step.state, step.attempts, step.idempotency_key
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, url] = args.as_slice() {
        if flag == "--crashing-worker" {
            return match crashing_worker(url).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("worker failed: {error}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    if args.len() > 1 {
        eprintln!("usage: quickstart   (no arguments; writes {DATABASE} in the current folder)");
        return ExitCode::from(2);
    }
    tracing_subscriber::fmt()
        // Colour only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{DATABASE}{suffix}"));
    }
    let url = format!("sqlite://{DATABASE}");
    match story(&url).await {
        Ok(true) => {
            println!("\nAll checks passed. Inspect it yourself: sqlite3 {DATABASE} 'SELECT * FROM tickmark_step_status'");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("\nA check failed: an effect did not happen exactly once.");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("\nThe quick start failed: {error}");
            ExitCode::FAILURE
        }
    }
}
