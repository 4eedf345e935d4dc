//! The program in the README, exactly (a test keeps the two equal): two steps,
//! one of them transactional, on the embedded SQLite default.
//!
//! ```text
//! cargo run -p tickmark-examples --bin readme   # writes app.db in the current folder
//! ```

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{
    Engine, Handler, Handlers, NewEvent, Output, Step, StepContext, StepResult, WorkerConfig,
};

/// The part of Stripe's `invoice.payment_succeeded` event this handler reads.
#[derive(Debug, Deserialize)]
struct InvoiceEvent {
    data: InvoiceData,
}

#[derive(Debug, Deserialize)]
struct InvoiceData {
    object: Invoice,
}

#[derive(Debug, Deserialize)]
struct Invoice {
    customer: String,
    amount_paid: i64,
}

/// What `credit_account` hands on to the steps after it.
#[derive(Debug, Serialize, Deserialize)]
struct Credit {
    credited: i64,
}

/// The output of the handler's step named `credit_account`, typed.
const CREDIT: Output<Credit> = Output::new("credit_account");

/// Credits the customer. Transactional: its write commits in the same
/// transaction as its mark, so it happens exactly once.
#[derive(Debug, Serialize, Deserialize)]
struct CreditAccount;

#[typetag::serde(name = "credit_account")] // a stable name, stored with each event
#[async_trait::async_trait]
impl Step for CreditAccount {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        // A payload that does not decode parks the event with serde's message.
        let invoice = ctx.payload::<InvoiceEvent>()?.data.object;
        // SQL both backends accept, in the engine's own transaction.
        ctx.transaction()?
            .query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
            .bind(invoice.amount_paid)
            .bind(invoice.customer)
            .execute()
            .await?;
        tickmark::output(&Credit {
            credited: invoice.amount_paid,
        })
    }
}

/// Sends the receipt. Not transactional: it passes its idempotency key on, so
/// the mail service drops a re-send after a crash.
#[derive(Debug, Serialize, Deserialize)]
struct SendReceipt;

#[typetag::serde(name = "send_receipt")]
#[async_trait::async_trait]
impl Step for SendReceipt {
    fn reads(&self) -> Vec<&str> {
        vec![CREDIT.step()] // Engine::new checks that a step before this one has the name
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let credit = ctx.output_of(CREDIT)?;
        let key = ctx.idempotency_key();
        println!(
            "receipt for {} cents, Idempotency-Key: {key}",
            credit.credited
        );
        Ok(json!({ "sent": true }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The embedded default: one SQLite file. `postgres://…` for many machines.
    let store = tickmark::connect("sqlite://app.db").await?;
    let engine = Engine::new(
        store,
        Handlers::new().on(
            "stripe",
            "invoice.payment_succeeded",
            Handler::new().step(CreditAccount).step(SendReceipt),
        ),
    )?;

    // Your own table, in the same database.
    let mut setup = engine.transaction().await?;
    setup
        .query("CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)")
        .execute()
        .await?;
    setup
        .query("INSERT INTO accounts (id, balance) VALUES ($1, 0) ON CONFLICT DO NOTHING")
        .bind("cus_1")
        .execute()
        .await?;
    setup.commit().await?;

    // A provider delivers at least once: the second delivery is a duplicate.
    let payload = json!({ "data": { "object": { "customer": "cus_1", "amount_paid": 1200 } } });
    for _ in 0..2 {
        let delivery = NewEvent::with_id(
            "stripe",
            "evt_1",
            "invoice.payment_succeeded",
            payload.clone(),
        );
        println!("evt_1: {:?}", engine.accept(delivery).await?);
    }

    // A worker runs the steps; a server runs `worker.run(shutdown_token)` instead.
    engine
        .worker(WorkerConfig::default())?
        .run_until_idle()
        .await?;

    // The step-status table.
    let status = engine
        .event_status("stripe", "evt_1")
        .await?
        .expect("accepted");
    for step in &status.steps {
        println!(
            "{:<15} {:<5} attempts {}  key {}",
            step.step, step.state, step.attempts, step.idempotency_key
        );
    }
    let (balance,): (i64,) = engine
        .transaction()
        .await?
        .query("SELECT balance FROM accounts WHERE id = $1")
        .bind("cus_1")
        .fetch_one()
        .await?;
    println!("cus_1 balance: {balance}"); // 1200, however often you run this program
    Ok(())
}
