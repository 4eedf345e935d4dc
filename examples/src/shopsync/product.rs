//! The fields of a `products/update` event that `push_product` reads, as
//! [`ShopifyWithShop`](super::ShopifyWithShop) laid the payload out:
//! `{"shop", "product_key", "product": <Shopify's body>}`.

use serde_json::{json, Value};
use tickmark::StepError;

use super::path_id::{path_id, PATH_ID_RULE};
use super::provider::payload_shop;

/// One product update, ready to push.
#[derive(Debug, Clone, PartialEq)]
pub struct ProductUpdate {
    /// The shop's domain, e.g. `cool-shop.myshopify.com`.
    pub shop: String,
    /// The product id as it appears in the URL.
    pub id: String,
    /// What is pushed: `{"id", "title", "updated_at"}` from Shopify's body
    /// (`null` for a field the body lacks).
    pub body: Value,
}

impl ProductUpdate {
    /// Read the update from a payload. What is missing or unusable here will
    /// be the same on every retry, so it is a terminal failure that says
    /// what was wrong.
    pub fn from_payload(payload: &Value) -> Result<Self, StepError> {
        let shop = payload_shop(payload)?;
        let product = &payload["product"];
        let id = path_id(&product["id"]).ok_or_else(|| {
            StepError::terminal(format!(
                "the product has no usable `id`: expected {PATH_ID_RULE} at product.id"
            ))
        })?;
        Ok(Self {
            shop: shop.to_owned(),
            id,
            body: json!({
                "id": product["id"],
                "title": product["title"],
                "updated_at": product["updated_at"],
            }),
        })
    }

    /// The `updated_at` pushed, as given (an RFC 3339 time from Shopify).
    pub fn updated_at(&self) -> &Value {
        &self.body["updated_at"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pushed_fields_come_from_the_product() {
        let payload = json!({
            "shop": "a.myshopify.com",
            "product_key": "a.myshopify.com/7",
            "product": {"id": 7, "title": "Hat", "updated_at": "2024-01-01T00:00:00Z", "vendor": "x"}
        });
        let update = ProductUpdate::from_payload(&payload).unwrap();
        assert_eq!(update.shop, "a.myshopify.com");
        assert_eq!(update.id, "7");
        assert_eq!(
            update.body,
            json!({"id": 7, "title": "Hat", "updated_at": "2024-01-01T00:00:00Z"})
        );
        assert_eq!(update.updated_at(), "2024-01-01T00:00:00Z");
    }

    #[test]
    fn unusable_shops_and_ids_are_terminal() {
        for payload in [
            json!({"product": {"id": 7}}),
            json!({"shop": "a/../b", "product": {"id": 7}}),
            json!({"shop": "...myshopify.com", "product": {"id": 7}}),
            json!({"shop": "a.myshopify.com", "product": {}}),
            json!({"shop": "a.myshopify.com", "product": {"id": -7}}),
            json!({"shop": "a.myshopify.com", "product": {"id": "7/../../x"}}),
            json!({"shop": "a.myshopify.com", "product": {"id": ""}}),
        ] {
            let error = ProductUpdate::from_payload(&payload).unwrap_err();
            assert!(error.is_terminal(), "{payload}: {error}");
        }
    }
}
