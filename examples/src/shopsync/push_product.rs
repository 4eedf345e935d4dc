//! `push_product`: POST a product's newest version to the Admin API, with
//! the step's idempotency key in an `Idempotency-Key` header, so a re-run
//! (after a crash, a timeout, a snooze) is absorbed by the far side.
//!
//! The handler runs it after the product's burst of updates has been
//! debounced, takes a token from the shop's bucket before each run, and runs
//! at most N of one shop at once (`handlers.rs`). How each answer becomes an
//! outcome (a 429 snoozes for its `Retry-After` without spending an attempt)
//! is [`AdminApi`]'s, shared with the order calls (`admin_api.rs`).

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Step, StepContext, StepResult};

use super::admin_api::{AdminApi, ApiCall};
use super::product::ProductUpdate;

/// Posts `{"id", "title", "updated_at"}` of the product in the event to
/// `<admin-api-url>/shops/<shop>/products/<id>`. Output:
/// `{"pushed": true, "status": …, "updated_at": …}`.
///
/// | answer | outcome |
/// |---|---|
/// | 2xx | done |
/// | 429 | snoozed for its `Retry-After` (seconds or an HTTP date; 2 s when absent), no attempt spent |
/// | 408, 5xx, other non-2xx, a timeout, no connection | retried on the handler's schedule (after `Retry-After`, when given) |
/// | any other 4xx | terminal: the event is dead-lettered with the answer |
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PushProduct;

#[typetag::serde(name = "shopsync.push_product")]
#[async_trait::async_trait]
impl Step for PushProduct {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let api = ctx.resource::<AdminApi>()?;
        let base = api.base()?;
        let update = ProductUpdate::from_payload(&ctx.event().payload)?;
        let url = base.product_url(&update.shop, &update.id);
        let call = ApiCall {
            url: &url,
            idempotency_key: ctx.idempotency_key(),
            body: &update.body,
            shop: &update.shop,
            doing: "pushing the product",
        };
        let status = api.post(&call, ctx.cancellation()).await?;
        Ok(json!({
            "pushed": true,
            "status": status.as_u16(),
            "updated_at": update.updated_at(),
        }))
    }
}
