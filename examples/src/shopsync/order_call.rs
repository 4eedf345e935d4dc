//! The three Admin API calls of the order flow, one step type with a field
//! naming the action: `reserve_stock` (when `orders/create` arrives),
//! then, once the wait for `orders/paid` settles, `fulfill` (paid) or
//! `release_stock` (not paid in time). One type because the three differ
//! only in the last segment of the URL and in what the body says about the
//! payment; each is its own step in the plan, with its own idempotency key.
//!
//! Each POSTs to `<admin-api-url>/shops/<shop>/orders/<id>/<action>` with
//! the step's `Idempotency-Key`, and each answer becomes an outcome as for
//! every Admin API call (`admin_api.rs`: a 429 snoozes, 5xx and timeouts
//! retry, other 4xx dead-letter).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tickmark::{Step, StepContext, StepResult};

use super::admin_api::{AdminApi, ApiCall};
use super::order::OrderRef;
use super::PAID_WAIT;

/// What an [`OrderCall`] asks the Admin API to do with the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderAction {
    /// Hold the order's stock while it is unpaid.
    Reserve,
    /// Ship it: it was paid.
    Fulfill,
    /// Give the held stock back: it was not paid in time.
    Release,
}

impl OrderAction {
    /// The URL's last segment: `reserve`, `fulfill`, `release`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderAction::Reserve => "reserve",
            OrderAction::Fulfill => "fulfill",
            OrderAction::Release => "release",
        }
    }

    fn doing(self) -> &'static str {
        match self {
            OrderAction::Reserve => "reserving the order's stock",
            OrderAction::Fulfill => "fulfilling the order",
            OrderAction::Release => "releasing the order's stock",
        }
    }
}

/// POSTs `{"order_id"}` to `<admin-api-url>/shops/<shop>/orders/<id>/<action>`;
/// `fulfill` adds `"paid_event_id"` (the `orders/paid` webhook the wait
/// [`PAID_WAIT`] matched, or an operator fed it), `release` adds
/// `"pay_deadline"` (when the wait gave up; `null` when an operator timed it
/// out by hand). Output: `{"called": <action>, "status": <answer's status>}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCall {
    /// Which call.
    pub action: OrderAction,
}

impl OrderCall {
    /// `POST …/orders/<id>/reserve`.
    pub fn reserve() -> Self {
        Self {
            action: OrderAction::Reserve,
        }
    }

    /// `POST …/orders/<id>/fulfill`.
    pub fn fulfill() -> Self {
        Self {
            action: OrderAction::Fulfill,
        }
    }

    /// `POST …/orders/<id>/release`.
    pub fn release() -> Self {
        Self {
            action: OrderAction::Release,
        }
    }

    /// The body sent for `order`, given the wait's output (if it settled).
    fn body(&self, order: &OrderRef, paid: Option<&Value>) -> Value {
        let mut body = json!({ "order_id": order.id });
        let paid = paid.unwrap_or(&Value::Null);
        match self.action {
            OrderAction::Reserve => {}
            OrderAction::Fulfill => body["paid_event_id"] = paid["matched"]["event_id"].clone(),
            OrderAction::Release => body["pay_deadline"] = paid["deadline"].clone(),
        }
        body
    }
}

#[typetag::serde(name = "shopsync.order_call")]
#[async_trait::async_trait]
impl Step for OrderCall {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let api = ctx.resource::<AdminApi>()?;
        let base = api.base()?;
        let order = OrderRef::from_payload(&ctx.event().payload)?;
        let url = base.order_url(&order.shop, &order.id, self.action.as_str());
        let body = self.body(&order, ctx.output(PAID_WAIT));
        let call = ApiCall {
            url: &url,
            idempotency_key: ctx.idempotency_key(),
            body: &body,
            shop: &order.shop,
            doing: self.action.doing(),
        };
        let status = api.post(&call, ctx.cancellation()).await?;
        Ok(json!({ "called": self.action.as_str(), "status": status.as_u16() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order() -> OrderRef {
        OrderRef {
            shop: "a.myshopify.com".into(),
            id: "450789469".into(),
        }
    }

    #[test]
    fn each_call_says_what_it_knows_of_the_payment() {
        let matched = json!({"matched": {"event_seq": 9, "event_id": "wh-paid-1"}});
        let timed_out = json!({"timed_out": true, "deadline": "2026-01-04T10:00:00+00:00"});
        assert_eq!(
            OrderCall::reserve().body(&order(), None),
            json!({"order_id": "450789469"})
        );
        assert_eq!(
            OrderCall::fulfill().body(&order(), Some(&matched)),
            json!({"order_id": "450789469", "paid_event_id": "wh-paid-1"})
        );
        assert_eq!(
            OrderCall::release().body(&order(), Some(&timed_out)),
            json!({"order_id": "450789469", "pay_deadline": "2026-01-04T10:00:00+00:00"})
        );
    }

    #[test]
    fn the_action_is_stored_in_the_plan_by_name() {
        let stored = serde_json::to_value(OrderCall::release()).unwrap();
        assert_eq!(stored, json!({"action": "release"}));
        let read: OrderCall = serde_json::from_value(json!({"action": "fulfill"})).unwrap();
        assert_eq!(read, OrderCall::fulfill());
        assert_eq!(
            [
                OrderAction::Reserve,
                OrderAction::Fulfill,
                OrderAction::Release
            ]
            .map(OrderAction::as_str),
            ["reserve", "fulfill", "release"]
        );
    }
}
