//! What the fake Shopify keeps: the app's shop-scoped webhook subscriptions,
//! and the `WebhookSubscription` JSON the GraphQL Admin API renders.
//! <https://shopify.dev/docs/api/admin-graphql/latest/objects/WebhookSubscription>

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};

/// One webhook subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The numeric id (`legacyResourceId`); the GraphQL id is
    /// `gid://shopify/WebhookSubscription/<id>`.
    pub id: u64,
    /// The GraphQL topic enum, e.g. `ORDERS_CREATE`.
    pub topic: String,
    /// The HTTPS callback URL.
    pub callback_url: String,
    /// When it was created, unix seconds.
    pub created_at: i64,
    /// When it was last updated, unix seconds.
    pub updated_at: i64,
}

fn timestamp(unix: i64) -> String {
    DateTime::<Utc>::from_timestamp(unix, 0)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl Subscription {
    /// Its global id.
    pub fn gid(&self) -> String {
        format!("gid://shopify/WebhookSubscription/{}", self.id)
    }

    /// The node, with the fields `wanted` says the query selected. `uri`
    /// exists from API version 2025-10 on, and `endpoint` / `callbackUrl`
    /// (deprecated then) until 2026-04: 2026-07 lists neither
    /// (<https://shopify.dev/changelog/consolidate-webhook-graphql-surfaces>,
    /// <https://shopify.dev/docs/api/admin-graphql/2026-07/objects/WebhookSubscription>).
    pub(crate) fn node(&self, version: &str, wanted: impl Fn(&str) -> bool) -> Value {
        let has_uri = version == "unstable" || version >= "2025-10";
        let has_endpoint = version != "unstable" && version < "2026-07";
        let mut node = Map::new();
        let mut put = |name: &str, value: Value| {
            if wanted(name) {
                node.insert(name.to_owned(), value);
            }
        };
        put("id", json!(self.gid()));
        put("legacyResourceId", json!(self.id.to_string()));
        put("topic", json!(self.topic));
        put("format", json!("JSON"));
        put("createdAt", json!(timestamp(self.created_at)));
        put("updatedAt", json!(timestamp(self.updated_at)));
        put("includeFields", json!([]));
        put("metafieldNamespaces", json!([]));
        put("filter", Value::Null);
        if has_uri {
            put("uri", json!(self.callback_url));
        }
        if has_endpoint {
            put("callbackUrl", json!(self.callback_url));
            put(
                "endpoint",
                json!({ "__typename": "WebhookHttpEndpoint", "callbackUrl": self.callback_url }),
            );
        }
        Value::Object(node)
    }
}
