//! The fake Shopify (`tickmark_tests::shopify_api`): the GraphQL Admin API's
//! `webhookSubscriptions` query paged with `first`/`after`, a subscription
//! removed as Shopify removes one after failed retries, the access token,
//! 429 with `Retry-After`, `THROTTLED`, and unknown queries.

use std::time::Duration;

use serde_json::{json, Value};
use tickmark_tests::http_client::{HttpClient, Outgoing, Reply};
use tickmark_tests::shopify_api::FakeShopify;

const VERSION: &str = "2025-10";

const QUERY: &str = "query Subscriptions($first: Int!, $after: String) {
  webhookSubscriptions(first: $first, after: $after) {
    edges {
      cursor
      node {
        id
        topic
        format
        createdAt
        updatedAt
        uri
        endpoint { __typename ... on WebhookHttpEndpoint { callbackUrl } }
      }
    }
    pageInfo { hasNextPage endCursor }
  }
}";

async fn graphql(shopify: &FakeShopify, version: &str, token: Option<&str>, body: Value) -> Reply {
    let mut request = Outgoing::post(
        format!("/admin/api/{version}/graphql.json"),
        serde_json::to_vec(&body).unwrap(),
    )
    .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("x-shopify-access-token", token);
    }
    HttpClient::new()
        .send(shopify.addr(), &request)
        .await
        .expect("POST the fake")
}

async fn page(shopify: &FakeShopify, first: u64, after: Option<&str>) -> Value {
    let token = shopify.token();
    let reply = graphql(
        shopify,
        VERSION,
        Some(&token),
        json!({"query": QUERY, "variables": {"first": first, "after": after}}),
    )
    .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()["data"]["webhookSubscriptions"].clone()
}

/// Every subscription's (id, callbackUrl), following `endCursor`.
async fn all(shopify: &FakeShopify, first: u64) -> (Vec<(String, String)>, usize) {
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let connection = page(shopify, first, after.as_deref()).await;
        pages += 1;
        for edge in connection["edges"].as_array().unwrap() {
            let node = &edge["node"];
            assert_eq!(node["endpoint"]["__typename"], "WebhookHttpEndpoint");
            assert_eq!(node["uri"], node["endpoint"]["callbackUrl"]);
            seen.push((
                node["id"].as_str().unwrap().to_owned(),
                node["endpoint"]["callbackUrl"].as_str().unwrap().to_owned(),
            ));
        }
        if connection["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = Some(
            connection["pageInfo"]["endCursor"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    (seen, pages)
}

#[tokio::test]
async fn subscriptions_page_with_first_and_after_and_a_removed_one_is_gone() {
    let shopify = FakeShopify::start().await;
    let ids: Vec<u64> = (0..5)
        .map(|n| {
            shopify.add_subscription("ORDERS_CREATE", &format!("https://app.example/hooks/{n}"))
        })
        .collect();

    let first = page(&shopify, 2, None).await;
    let node = &first["edges"][0]["node"];
    assert_eq!(
        node["id"],
        format!("gid://shopify/WebhookSubscription/{}", ids[0])
    );
    assert_eq!(node["topic"], "ORDERS_CREATE");
    assert_eq!(node["format"], "JSON");
    assert!(node["createdAt"].as_str().unwrap().ends_with('Z'));
    assert!(
        node.get("legacyResourceId").is_none(),
        "only the fields asked for"
    );
    assert_eq!(first["pageInfo"]["hasNextPage"], true);
    assert_eq!(first["pageInfo"]["endCursor"], first["edges"][1]["cursor"]);

    let (seen, pages) = all(&shopify, 2).await;
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 5);
    assert_eq!(seen[4].1, "https://app.example/hooks/4");

    // What Shopify does to a subscription whose deliveries kept failing.
    assert!(shopify.remove_subscription(ids[2]));
    assert!(!shopify.remove_subscription(ids[2]));
    let (seen, _) = all(&shopify, 2).await;
    assert_eq!(seen.len(), 4);
    assert!(!seen
        .iter()
        .any(|(id, _)| id.ends_with(&format!("/{}", ids[2]))));
    assert_eq!(shopify.subscriptions().len(), 4);

    // Literal arguments work too, and a later version has no `endpoint`.
    let token = shopify.token();
    let literal = graphql(
        &shopify,
        "2026-07",
        Some(&token),
        json!({"query": "{ webhookSubscriptions(first: 1) { nodes { id uri endpoint { __typename } } pageInfo { hasNextPage } } }"}),
    )
    .await
    .json();
    let nodes = &literal["data"]["webhookSubscriptions"]["nodes"];
    assert_eq!(nodes.as_array().unwrap().len(), 1);
    assert_eq!(nodes[0]["uri"], "https://app.example/hooks/0");
    assert!(nodes[0].get("endpoint").is_none());
}

#[tokio::test]
async fn the_access_token_version_and_body_are_checked() {
    let shopify = FakeShopify::start().await;
    let body = json!({"query": QUERY, "variables": {"first": 10}});
    let missing = graphql(&shopify, VERSION, None, body.clone()).await;
    assert_eq!(missing.status, 401);
    assert!(missing.json()["errors"]
        .as_str()
        .unwrap()
        .contains("Invalid API key or access token"));
    assert_eq!(
        graphql(&shopify, VERSION, Some("shpat_wrong"), body.clone())
            .await
            .status,
        401
    );

    let token = shopify.token();
    assert_eq!(
        graphql(&shopify, "2025-13", Some(&token), body.clone())
            .await
            .status,
        404
    );
    assert_eq!(
        graphql(&shopify, VERSION, Some(&token), json!({"nope": 1}))
            .await
            .status,
        400
    );

    let unknown = graphql(
        &shopify,
        VERSION,
        Some(&token),
        json!({"query": "{ shop { name } }"}),
    )
    .await;
    assert_eq!(unknown.status, 200);
    assert!(unknown.json()["errors"][0]["message"].is_string());
    assert!(unknown.json().get("data").is_none());
    for bad in [
        json!({"first": 0}),
        json!({"first": 251}),
        json!({"first": 1, "after": "garbage"}),
    ] {
        let reply = graphql(
            &shopify,
            VERSION,
            Some(&token),
            json!({"query": QUERY, "variables": bad}),
        )
        .await;
        assert!(reply.json()["errors"][0]["message"].is_string(), "{bad}");
    }
    let statuses: Vec<u16> = shopify.requests().iter().map(|r| r.status).collect();
    assert_eq!(&statuses[..4], [401, 401, 404, 400]);
}

#[tokio::test]
async fn rate_limits_and_failures_answer_once_each() {
    let shopify = FakeShopify::start().await;
    shopify.add_subscription("APP_UNINSTALLED", "https://app.example/hooks/app");
    shopify.rate_limit_next(1, Duration::from_secs(2));
    shopify.throttle_next(1);
    shopify.fail_next(1, 503);
    let token = shopify.token();
    let body = json!({"query": QUERY, "variables": {"first": 10}});

    let limited = graphql(&shopify, VERSION, Some(&token), body.clone()).await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("2"));
    let throttled = graphql(&shopify, VERSION, Some(&token), body.clone()).await;
    assert_eq!(throttled.status, 200);
    assert_eq!(
        throttled.json()["errors"][0]["extensions"]["code"],
        "THROTTLED"
    );
    assert_eq!(
        graphql(&shopify, VERSION, Some(&token), body.clone())
            .await
            .status,
        503
    );
    let fine = graphql(&shopify, VERSION, Some(&token), body).await;
    assert_eq!(fine.status, 200);
    assert_eq!(
        fine.json()["data"]["webhookSubscriptions"]["edges"][0]["node"]["topic"],
        "APP_UNINSTALLED"
    );
    let statuses: Vec<u16> = shopify.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 200, 503, 200]);
}
