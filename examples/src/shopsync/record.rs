//! `record`: note (shop, event id, topic) of every other verified Shopify
//! event in the app's `shopsync_received` table, in the engine's transaction
//! (exactly once).

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Step, StepContext, StepResult};

/// The insert into [`RECEIVED_TABLE`](super::RECEIVED_TABLE), in SQL both
/// backends accept.
const INSERT: &str = "INSERT INTO shopsync_received (source, event_id, kind, shop)
    VALUES ($1, $2, $3, $4) ON CONFLICT (source, event_id) DO NOTHING";

/// Inserts the event into `shopsync_received`. Output: `{"inserted": bool}`
/// (false only if an operator re-ran the step).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Record;

#[typetag::serde(name = "shopsync.record")]
#[async_trait::async_trait]
impl Step for Record {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let event = ctx.event();
        let (source, id, kind) = (event.source.clone(), event.id.clone(), event.kind.clone());
        let shop = event.payload["shop"].as_str().map(str::to_owned);
        let inserted = ctx
            .transaction()?
            .query(INSERT)
            .bind(source)
            .bind(id)
            .bind(kind)
            .bind(shop)
            .execute()
            .await?;
        Ok(json!({ "inserted": inserted == 1 }))
    }
}
