//! The soak's handler: three steps that do a little real work, one of them
//! writing an application row whose counter shows a second run.
//!
//! `soak.digest` hashes the payload (CPU work, no write); `soak.apply` upserts
//! a row of `soak_effects` keyed by the step's idempotency key in the engine's
//! transaction, adding 1 to `runs` on a conflict, so an effect applied twice
//! (a redelivery accepted as new after its event was pruned) is a row with
//! `runs = 2`; `soak.finish` counts the event as finished in this process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tickmark::{Handler, Handlers, Step, StepContext, StepError, StepResult};

/// The source the soak's deliveries come from (a Stripe endpoint).
pub const SOURCE: &str = "stripe";
/// The event type every delivery carries.
pub const KIND: &str = "invoice.payment_succeeded";

/// The application table: one row per applied effect.
pub const CREATE_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS soak_effects (
    idempotency_key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    runs INTEGER NOT NULL
)";

const APPLY: &str = "INSERT INTO soak_effects (idempotency_key, digest, runs) VALUES ($1, $2, 1)
    ON CONFLICT (idempotency_key) DO UPDATE SET runs = soak_effects.runs + 1
    RETURNING runs";

/// How many events ran their last step in this process (an engine resource).
#[derive(Debug, Clone, Default)]
pub struct Finished(Arc<AtomicU64>);

impl Finished {
    /// The count so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The handler for (`stripe`, `invoice.payment_succeeded`).
pub fn handlers() -> Handlers {
    Handlers::new().on(
        SOURCE,
        KIND,
        Handler::new()
            .named_step("digest", DigestPayload)
            .named_step("apply", ApplyEffect)
            .named_step("finish", CountFinished),
    )
}

/// Hashes the payload a few hundred times. Output: `{"digest": hex}`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DigestPayload;

#[typetag::serde(name = "soak.digest")]
#[async_trait::async_trait]
impl Step for DigestPayload {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let mut digest = Sha256::digest(ctx.event().payload.to_string().as_bytes());
        for _ in 0..300 {
            digest = Sha256::digest(digest);
        }
        Ok(json!({ "digest": hex::encode(digest) }))
    }
}

/// Upserts the effect row in the engine's transaction. Output: `{"runs": n}`
/// (1 unless the effect was applied before).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ApplyEffect;

#[typetag::serde(name = "soak.apply")]
#[async_trait::async_trait]
impl Step for ApplyEffect {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let digest: String = ctx
            .output("digest")
            .and_then(|output| output["digest"].as_str())
            .ok_or_else(|| StepError::terminal("the digest step left no digest"))?
            .to_owned();
        let key = ctx.idempotency_key().to_owned();
        let tx = ctx.transaction()?;
        let Some(conn) = tx.postgres() else {
            return Err(StepError::terminal("the soak runs on PostgreSQL only"));
        };
        let runs: i32 = sqlx::query_scalar(APPLY)
            .bind(&key)
            .bind(&digest)
            .fetch_one(conn)
            .await?;
        Ok(json!({ "runs": runs }))
    }
}

/// Counts the event as finished (the [`Finished`] resource). Output: `{}`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CountFinished;

#[typetag::serde(name = "soak.finish")]
#[async_trait::async_trait]
impl Step for CountFinished {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        ctx.resource::<Finished>()?
            .0
            .fetch_add(1, Ordering::Relaxed);
        Ok(json!({}))
    }
}
