//! The order an `orders/*` event is about, as
//! [`ShopifyWithShop`](super::ShopifyWithShop) laid the payload out:
//! `{"shop", "body": <Shopify's order>}`. The order calls read it; the wait
//! for `orders/paid` matches `/shop` and `/body/id` here with `/shop` and
//! `/paid_order_id` in the payment (set only when its signed body says the
//! order is paid).

use serde_json::Value;
use tickmark::StepError;

use super::path_id::{path_id, PATH_ID_RULE};
use super::provider::payload_shop;

/// Where an `orders/*` payload keeps the order's id: the wait for
/// `orders/paid` matches `/shop` and this in the waiting order with the
/// payment's `/shop` and [`PAID_ORDER_ID_POINTER`](super::PAID_ORDER_ID_POINTER).
pub const ORDER_ID_POINTER: &str = "/body/id";

/// One order: its shop and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRef {
    /// The shop's domain, e.g. `cool-shop.myshopify.com`.
    pub shop: String,
    /// The order id as it appears in the URL.
    pub id: String,
}

impl OrderRef {
    /// Read the order from a payload. What is missing or unusable here will
    /// be the same on every retry, so it is a terminal failure that says
    /// what was wrong.
    pub fn from_payload(payload: &Value) -> Result<Self, StepError> {
        let shop = payload_shop(payload)?;
        let id = payload
            .pointer(ORDER_ID_POINTER)
            .and_then(path_id)
            .ok_or_else(|| {
                StepError::terminal(format!(
                    "the order has no usable `id`: expected {PATH_ID_RULE} at body.id"
                ))
            })?;
        Ok(Self {
            shop: shop.to_owned(),
            id,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_order_is_the_shop_and_the_bodys_id() {
        let payload =
            json!({"shop": "a.myshopify.com", "body": {"id": 450789469, "total_price": "11.00"}});
        assert_eq!(
            OrderRef::from_payload(&payload).unwrap(),
            OrderRef {
                shop: "a.myshopify.com".into(),
                id: "450789469".into()
            }
        );
    }

    #[test]
    fn unusable_shops_and_ids_are_terminal() {
        for payload in [
            json!({"body": {"id": 7}}),
            json!({"shop": "a/../b", "body": {"id": 7}}),
            json!({"shop": "a.myshopify.com", "body": {}}),
            json!({"shop": "a.myshopify.com", "body": {"id": -7}}),
            json!({"shop": "a.myshopify.com", "body": {"id": "7/../../x"}}),
            // The layout of products/* topics: not an order.
            json!({"shop": "a.myshopify.com", "product": {"id": 7}}),
        ] {
            let error = OrderRef::from_payload(&payload).unwrap_err();
            assert!(error.is_terminal(), "{payload}: {error}");
        }
    }
}
