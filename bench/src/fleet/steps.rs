//! The three steps of a fleet event, each doing a little real work, and the
//! application table they write.
//!
//! - `reserve` (transactional): inserts the row keyed by its idempotency key
//!   into `fleet_effects`, in the transaction of its own mark: exactly once.
//!   A plain `INSERT`, so a second run would fail on the primary key.
//! - `call`: a simulated HTTP call (a sleep of `call_ms`), then the far side's
//!   record of it: an upsert keyed by the idempotency key that counts the
//!   calls (`runs`), committed on its own, as a remote service would. A re-run
//!   after a crash shows as `runs` > 1.
//! - `settle` (transactional): like `reserve`.
//!
//! After a drain, `fleet_effects` must hold exactly events × 3 rows, and
//! `sum(runs) - count(*)` is the number of steps that ran twice.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tickmark::{Handler, Step, StepContext, StepError, StepResult};

/// The application table, created by the coordinator in each run's schema.
pub const CREATE_EFFECTS: &str = "CREATE TABLE fleet_effects (
    idempotency_key TEXT PRIMARY KEY,
    event_seq BIGINT NOT NULL,
    step TEXT NOT NULL,
    worker TEXT NOT NULL,
    runs INT NOT NULL DEFAULT 1,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)";

const INSERT_ONCE: &str =
    "INSERT INTO fleet_effects (idempotency_key, event_seq, step, worker) VALUES ($1, $2, $3, $4)";
const UPSERT_CALL: &str =
    "INSERT INTO fleet_effects (idempotency_key, event_seq, step, worker) VALUES ($1, $2, $3, $4)
     ON CONFLICT (idempotency_key) DO UPDATE SET runs = fleet_effects.runs + 1";

/// This worker process's name, written into each effect row (a resource).
#[derive(Debug, Clone)]
pub struct WorkerName(pub String);

/// The application's pool (the store's own), for the `call` step (a resource).
#[derive(Debug, Clone)]
pub struct AppPool(pub PgPool);

/// The handler every fleet event runs: `reserve`, `call`, `settle`.
pub fn handler(call_ms: u64) -> Handler {
    Handler::new()
        .named_step("reserve", Reserve)
        .named_step("call", Call { call_ms })
        .named_step("settle", Settle)
}

/// Insert this step's effect row in the mark's transaction.
async fn insert_in_mark(ctx: &mut StepContext<'_>, step: &str) -> StepResult {
    let key = ctx.idempotency_key().to_owned();
    let seq = ctx.event().seq;
    let worker = ctx.resource::<WorkerName>()?.0.clone();
    let tx = ctx.transaction()?;
    let Some(conn) = tx.postgres() else {
        return Err(StepError::terminal("fleet_bench runs on PostgreSQL only"));
    };
    sqlx::query(INSERT_ONCE)
        .bind(&key)
        .bind(seq)
        .bind(step)
        .bind(&worker)
        .execute(conn)
        .await?;
    Ok(serde_json::Value::Null)
}

/// First step: an effect row committed with the mark.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reserve;

#[typetag::serde(name = "fleet.reserve")]
#[async_trait::async_trait]
impl Step for Reserve {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        insert_in_mark(ctx, "reserve").await
    }
}

/// Second step: a simulated remote call that records each call it receives.
#[derive(Debug, Serialize, Deserialize)]
pub struct Call {
    /// How long the simulated call takes.
    pub call_ms: u64,
}

#[typetag::serde(name = "fleet.call")]
#[async_trait::async_trait]
impl Step for Call {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        tokio::time::sleep(Duration::from_millis(self.call_ms)).await;
        let pool = ctx.resource::<AppPool>()?.0.clone();
        let worker = ctx.resource::<WorkerName>()?.0.clone();
        sqlx::query(UPSERT_CALL)
            .bind(ctx.idempotency_key())
            .bind(ctx.event().seq)
            .bind("call")
            .bind(&worker)
            .execute(&pool)
            .await?;
        Ok(serde_json::Value::Null)
    }
}

/// Third step: an effect row committed with the (final) mark.
#[derive(Debug, Serialize, Deserialize)]
pub struct Settle;

#[typetag::serde(name = "fleet.settle")]
#[async_trait::async_trait]
impl Step for Settle {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        insert_in_mark(ctx, "settle").await
    }
}
