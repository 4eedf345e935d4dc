//! The steps simulated handlers run. Each records, in the journal, when an
//! attempt starts and the effect it sends (by its idempotency key, as an
//! idempotent external API would see it), so a re-run is visible whatever
//! the engine marked. Durations and failures are drawn from the seed; a
//! step's time stretches while its process is paused.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use tickmark::{Handler, Handlers, Step, StepContext, StepError, StepResult};
use tickmark_driver::retry::RetryPolicy;

use crate::db::DbThread;
use crate::deliveries::Workload;
use crate::dice::Dice;
use crate::journal::Journal;
use crate::process::ProcessState;
use crate::variant::Variant;

/// What a simulated step reaches through `ctx.resource`.
#[derive(Debug, Clone)]
pub struct SimContext {
    /// The run's journal.
    pub journal: Journal,
    /// The process (incarnation) running the step.
    pub process: Arc<ProcessState>,
    /// The seeded dice.
    pub dice: Dice,
    /// The database thread.
    pub db: Arc<DbThread>,
    /// The shared file's pool (for a step's own writes).
    pub pool: SqlitePool,
}

/// The table a ledger step writes: one row per event, exactly once.
pub const LEDGER_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS sim_ledger (event_seq INTEGER NOT NULL, written_by TEXT NOT NULL)";

fn started(ctx: &StepContext<'_>, sim: &SimContext, position: i32) {
    let event = ctx.event();
    sim.journal.step_started(
        event.seq,
        position,
        format!(
            "{} step {position} ({}) of e{} starts, attempt {}",
            sim.process.name,
            ctx.step_name(),
            event.seq,
            ctx.attempt()
        ),
    );
}

/// Long enough that some runs outlast a heartbeat; the lease is 10 s.
const LONGEST_CALL_MS: u64 = 6_000;

/// A call to an external API with the step's idempotency key.
#[derive(Debug, Serialize, Deserialize)]
pub struct Call {
    /// Its position in the plan.
    pub position: i32,
}

#[typetag::serde(name = "sim_call")]
#[async_trait::async_trait]
impl Step for Call {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let sim = ctx.resource::<SimContext>()?.clone();
        started(ctx, &sim, self.position);
        if self.position == 0 {
            if let (Some(account), Some(seq)) = (
                ctx.event().payload["account"].as_str(),
                ctx.event().payload["seq"].as_i64(),
            ) {
                sim.journal.ordered_run(account, seq);
            }
        }
        sim.process.sleep(sim.dice.millis(1..LONGEST_CALL_MS)).await;
        let fails = |how: &str| {
            let (name, position, seq) = (&sim.process.name, self.position, ctx.event().seq);
            sim.journal
                .note(format!("{name} step {position} of e{seq} fails ({how})"));
        };
        if sim.dice.chance(0.06) {
            fails("retryable");
            return Err(StepError::retryable("simulated failure"));
        }
        if sim.dice.chance(0.01) {
            fails("terminal");
            return Err(StepError::terminal("simulated terminal failure"));
        }
        let key = ctx.idempotency_key().to_owned();
        sim.journal.effect(ctx.event().seq, self.position, &key);
        sim.journal
            .note(format!("{} effect sent: {key}", sim.process.name));
        Ok(serde_json::json!({ "by": sim.process.name }))
    }
}

const LEDGER_INSERT: &str = "INSERT INTO sim_ledger (event_seq, written_by) VALUES ($1, $2)";

/// A row written in the engine's transaction, committed with the step's mark.
#[derive(Debug, Serialize, Deserialize)]
pub struct Ledger {
    /// Its position in the plan.
    pub position: i32,
}

#[typetag::serde(name = "sim_ledger")]
#[async_trait::async_trait]
impl Step for Ledger {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let sim = ctx.resource::<SimContext>()?.clone();
        started(ctx, &sim, self.position);
        let seq = ctx.event().seq;
        // No await between here and the mark but this blocking write: the
        // transaction holds the file's write lock (see `SimStore::step_mark_done`).
        let transaction = ctx.transaction()?;
        let written = sim.db.block(
            transaction
                .query(LEDGER_INSERT)
                .bind(seq)
                .bind(sim.process.name.clone())
                .execute(),
        );
        written.map_err(|error| StepError::retryable(error.to_string()))?;
        Ok(serde_json::json!({ "written_by": sim.process.name }))
    }

    fn transactional(&self) -> bool {
        true
    }
}

/// Broken on purpose (`Variant::EffectCommitsApart`): the ledger row
/// commits on its own, then the step goes on before its mark.
#[derive(Debug, Serialize, Deserialize)]
pub struct LedgerApart {
    /// Its position in the plan.
    pub position: i32,
}

#[typetag::serde(name = "sim_ledger_apart")]
#[async_trait::async_trait]
impl Step for LedgerApart {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let sim = ctx.resource::<SimContext>()?.clone();
        started(ctx, &sim, self.position);
        let written = sim.db.block(
            sqlx::query(LEDGER_INSERT)
                .bind(ctx.event().seq)
                .bind(sim.process.name.clone())
                .execute(&sim.pool),
        );
        written.map_err(|error| StepError::retryable(error.to_string()))?;
        sim.process.sleep(sim.dice.millis(1..LONGEST_CALL_MS)).await;
        Ok(serde_json::json!({ "written_by": sim.process.name }))
    }
}

/// The kind of a three-step payment: charge, ledger, receipt.
pub const PAYMENT: &str = "payment";
/// The kind of a one-step event ordered per account by `/seq`.
pub const ORDERED: &str = "ordered";
/// The kind of a one-step event of a shop, claimed in fair shares per shop
/// (its tenant, at [`TENANT_KEY`]).
pub const SYNC: &str = "sync";
/// Where a `sync` event's tenant is in its payload.
pub const TENANT_KEY: &str = "/shop";
/// The source of every simulated event.
pub const SOURCE: &str = "sim";
/// The ledger step's position in a payment.
pub const LEDGER_POSITION: i32 = 1;

/// The tenant an event's handler names, if any.
pub fn tenant_of(payload: &serde_json::Value) -> Option<&str> {
    payload
        .pointer(TENANT_KEY)
        .and_then(serde_json::Value::as_str)
}

/// The handlers every simulated process registers.
pub fn handlers(variant: Variant, workload: Workload) -> Handlers {
    let retry = RetryPolicy {
        jitter: 0.2,
        ..RetryPolicy::attempts(4).delays(
            std::time::Duration::from_millis(500),
            std::time::Duration::from_secs(20),
        )
    };
    let payment = Handler::new().named_step("charge", Call { position: 0 });
    let payment = match variant {
        Variant::EffectCommitsApart => payment.named_step(
            "ledger",
            LedgerApart {
                position: LEDGER_POSITION,
            },
        ),
        _ => payment.named_step(
            "ledger",
            Ledger {
                position: LEDGER_POSITION,
            },
        ),
    };
    let payment = payment
        .named_step("receipt", Call { position: 2 })
        .retry(retry);
    let ordered = Handler::new()
        .named_step("apply", Call { position: 0 })
        .skip_stale("/account", "/seq")
        .retry(retry);
    let sync = Handler::new()
        .named_step("sync", Call { position: 0 })
        .tenant_key(TENANT_KEY)
        .retry(retry);
    let handlers = Handlers::new()
        .on(SOURCE, PAYMENT, payment)
        .on(SOURCE, ORDERED, ordered);
    match workload {
        Workload::Everything => handlers.on(SOURCE, SYNC, sync),
        // No tenant key anywhere: the workers claim as they did before
        // fair share (no fair claim, their usual prefetch).
        Workload::WithoutShops => handlers,
    }
}
