//! Shopify: the webhook subscriptions the handlers need, as the shop has
//! them now.
//!
//! Shopify retries a failed delivery 8 times over 4 hours, then deletes a
//! subscription made through the Admin API (it warns the app's emergency
//! contact first); later events of that topic are never sent and no API
//! lists them. So what a run can do is find out quickly: it lists the shop's
//! subscriptions (the GraphQL Admin API's `webhookSubscriptions`) and
//! reports each topic a handler takes with no subscription to the
//! receiver's URL, in the summary (the CLI and the dashboard show it) and
//! as the `tickmark_webhook_subscriptions_missing` gauge.
//! <https://shopify.dev/docs/apps/build/webhooks/troubleshooting-webhooks>,
//! <https://shopify.dev/docs/api/admin-graphql/latest/queries/webhookSubscriptions>
//!
//! Only shop-scoped subscriptions (made through the API) are listed: the
//! ones of an app's `shopify.app.toml` are not, and Shopify keeps those
//! itself.

use http::HeaderName;
use serde::Deserialize;
use serde_json::json;
use url::Url;

use super::api_client::ApiRequest;
use super::base_url::{parse_base, trailing_slash};
use super::error::ReconcileError;
use super::kind_filter::KindFilter;
use super::run_context::RunContext;
use tickmark_driver::store::MissingSubscription;

/// The Admin API version asked for: the first with `WebhookSubscription.uri`.
pub const API_VERSION: &str = "2025-10";

/// The GraphQL query: one page of subscriptions.
const QUERY: &str = "query tickmarkSubscriptions($first: Int!, $after: String) { \
    webhookSubscriptions(first: $first, after: $after) { \
    edges { node { id topic uri } } pageInfo { hasNextPage endCursor } } }";

/// How to reach a shop's Admin API, and where its deliveries should go.
#[derive(Clone)]
pub struct ShopifyApi {
    shop_url: Url,
    access_token: String,
    callback_url: String,
    api_version: String,
}

impl std::fmt::Debug for ShopifyApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShopifyApi")
            .field("shop_url", &self.shop_url.as_str())
            .field("callback_url", &self.callback_url)
            .field("api_version", &self.api_version)
            .finish_non_exhaustive()
    }
}

impl ShopifyApi {
    /// The shop at `shop_url` (`https://{shop}.myshopify.com`; `http://`
    /// only on a loopback host), its Admin API access token, and the
    /// receiver's public URL for this source, which every subscription
    /// should deliver to.
    pub fn new(
        shop_url: &str,
        access_token: impl Into<String>,
        callback_url: impl Into<String>,
    ) -> Result<Self, ReconcileError> {
        Ok(Self {
            shop_url: parse_base(shop_url)?,
            access_token: access_token.into(),
            callback_url: callback_url.into(),
            api_version: API_VERSION.to_owned(),
        })
    }

    /// Ask another Admin API version (one that has `WebhookSubscription.uri`).
    pub fn with_api_version(mut self, version: impl Into<String>) -> Self {
        self.api_version = version.into();
        self
    }
}

/// A topic as the Admin API spells it: `orders/create` is `ORDERS_CREATE`.
pub fn graphql_topic(topic: &str) -> String {
    topic.replace(['/', '-', '.'], "_").to_ascii_uppercase()
}

#[derive(Debug, Deserialize)]
struct Answer {
    data: Option<Data>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    webhook_subscriptions: Connection,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Connection {
    edges: Vec<Edge>,
    page_info: PageInfo,
}

#[derive(Debug, Deserialize)]
struct Edge {
    node: Subscription,
}

#[derive(Debug, Deserialize)]
struct Subscription {
    topic: String,
    uri: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageInfo {
    has_next_page: bool,
    end_cursor: Option<String>,
}

/// List the shop's subscriptions and report each handled topic that has
/// none to the callback URL.
pub(crate) async fn check(
    api: &ShopifyApi,
    run: &mut RunContext<'_>,
) -> Result<(), ReconcileError> {
    let filter = KindFilter::of(run);
    let Some(topics) = filter.server_side(usize::MAX).map(<[String]>::to_vec) else {
        run.note(
            "the handlers take every kind of this source (or none): no topic to check".to_owned(),
        );
        run.summary.complete = true;
        return Ok(());
    };
    let mut url = api.shop_url.clone();
    url.set_path(&format!(
        "{}admin/api/{}/graphql.json",
        trailing_slash(url.path()),
        api.api_version
    ));
    let mut have: Vec<Subscription> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let body = json!({ "query": QUERY, "variables": { "first": 100, "after": after } });
        let request = ApiRequest::post(url.clone(), Some(body.to_string().into_bytes())).header(
            HeaderName::from_static("x-shopify-access-token"),
            api.access_token.clone(),
        );
        let response = run.send(&request).await?;
        let what = request.what();
        if !response.status.is_success() {
            return Err(response.refused(
                &what,
                "check the shop URL and the access token (it needs read access to webhooks)",
            ));
        }
        let answer: Answer = response.json(&what)?;
        let Some(data) = answer.data else {
            return Err(ReconcileError::Malformed {
                what,
                reason: format!("no data; errors: {}", json!(answer.errors)),
            });
        };
        let page = data.webhook_subscriptions;
        have.extend(page.edges.into_iter().map(|edge| edge.node));
        run.page_done();
        match page.page_info.end_cursor {
            Some(cursor) if page.page_info.has_next_page => after = Some(cursor),
            _ => break,
        }
    }
    for topic in topics {
        run.summary.seen += 1;
        let wanted = graphql_topic(&topic);
        let present = have
            .iter()
            .any(|sub| sub.topic == wanted && same_address(&sub.uri, &api.callback_url));
        if present {
            run.summary.already_had += 1;
        } else {
            run.note(format!(
                "Shopify has no subscription for {topic} to {}: it was removed after failed \
                 deliveries, or never made; create it again (webhookSubscriptionCreate) and \
                 replay what the shop sent meanwhile from its own records",
                api.callback_url
            ));
            run.summary.missing_subscriptions.push(MissingSubscription {
                topic,
                callback_url: api.callback_url.clone(),
            });
        }
    }
    run.summary.complete = true;
    Ok(())
}

/// Two URLs name one address (a trailing slash aside).
fn same_address(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_spelled_as_the_admin_api_spells_them() {
        assert_eq!(graphql_topic("orders/create"), "ORDERS_CREATE");
        assert_eq!(graphql_topic("app/uninstalled"), "APP_UNINSTALLED");
        assert_eq!(
            graphql_topic("inventory_levels/update"),
            "INVENTORY_LEVELS_UPDATE"
        );
    }
}
