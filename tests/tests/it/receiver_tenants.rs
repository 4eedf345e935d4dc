//! Tenants named by a header or by the payload, through the real receiver
//! over a loopback socket, on SQLite and PostgreSQL (docs/flow_control.md,
//! "Fair share across tenants"):
//!
//! - a handler with `tenant_header("X-Shopify-Shop-Domain")` records each
//!   delivery's shop as its tenant; a delivery without the header, or with
//!   it twice, is still recorded (a refusal would only bring it back),
//!   outside any tenant's share;
//! - a tenant longer than `MAX_TENANT_BYTES`, from a header or a payload
//!   that lies, is stored as its SHA-256: one bounded name, the same for
//!   every delivery, where PostgreSQL would refuse the index entry of a
//!   10 kB one and the provider would be answered 503 for ever.

use sha2::Digest;

use crate::receiver_support::{all_sources, assert_answer, b64, hmac256, Harness, Kind, Transport};
use tickmark::flow::MAX_TENANT_BYTES;
use tickmark::{Backend, Handler, Handlers};
use tickmark_tests::http_client::Outgoing;
use tickmark_tests::test_steps::Record;

/// `shopify/orders/create`, its tenant the shop header; `stripe/invoice.paid`,
/// its tenant the payload's `/account`.
fn handlers() -> Handlers {
    Handlers::new()
        .on(
            Kind::Shopify.source(),
            "orders/create",
            Handler::new()
                .named_step("first", Record::default())
                .tenant_header("X-Shopify-Shop-Domain"),
        )
        .on(
            Kind::Stripe.source(),
            Kind::Stripe.event_kind(),
            Handler::new()
                .named_step("first", Record::default())
                .tenant_key("/account"),
        )
}

/// A signed `orders/create` delivery of order `id`, with these shop headers.
fn order(id: u64, shops: &[&str]) -> Outgoing {
    let body = serde_json::json!({"id": id, "total_price": "11.00"}).to_string();
    let signature = b64(&hmac256(Kind::Shopify.secret().as_bytes(), body.as_bytes()));
    let mut request = Outgoing::post("/hooks/shopify", body)
        .header("content-type", "application/json")
        .header("x-shopify-hmac-sha256", signature)
        .header("x-shopify-webhook-id", format!("wh-{id}"))
        .header("x-shopify-topic", "orders/create");
    for shop in shops {
        request = request.header("x-shopify-shop-domain", *shop);
    }
    request
}

/// The tenant recorded for the event with this dedup key.
async fn tenant_of(h: &Harness, dedup_key: &str) -> Option<String> {
    h.db.probe
        .text(&format!(
            "SELECT tenant_key FROM tickmark_events WHERE dedup_key = '{dedup_key}'"
        ))
        .await
}

async fn a_tenant_header_names_each_deliverys_tenant(backend: Backend) {
    let Some(h) = Harness::new(backend, Transport::Socket, handlers(), all_sources).await else {
        return;
    };
    let cases: [(u64, &[&str], Option<&str>); 3] = [
        (
            1,
            &["cool-shop.myshopify.com"],
            Some("cool-shop.myshopify.com"),
        ),
        (2, &[], None),
        (3, &["a.myshopify.com", "b.myshopify.com"], None),
    ];
    for (id, shops, _) in cases {
        assert_answer(&h.send(&order(id, shops)).await, 200, "new", None);
    }
    for (id, _, tenant) in cases {
        assert_eq!(
            tenant_of(&h, &format!("wh-{id}")).await.as_deref(),
            tenant,
            "order {id}"
        );
    }
    // Every one runs, with or without a tenant.
    assert_eq!(h.run_worker().await.events_done, 3);
}

async fn a_tenant_too_long_is_stored_as_its_digest(backend: Backend) {
    let Some(h) = Harness::new(backend, Transport::Socket, handlers(), all_sources).await else {
        return;
    };
    let huge_shop = format!("{}.myshopify.com", "s".repeat(8_000));
    assert_answer(&h.send(&order(7, &[&huge_shop])).await, 200, "new", None);
    let from_header = tenant_of(&h, "wh-7").await.expect("a tenant");

    // A payload that lies about its account, twice: 9,600 bytes that do
    // not compress (PostgreSQL compresses an index entry before it checks
    // its size), the same both times.
    let account: String = (0..150u32)
        .map(|n| hex::encode(sha2::Sha256::digest(n.to_be_bytes())))
        .collect();
    for (n, id) in ["evt_long_1", "evt_long_2"].into_iter().enumerate() {
        let payload = serde_json::json!({"id": id, "account": account, "n": n});
        h.engine
            .accept(tickmark::NewEvent::with_id(
                Kind::Stripe.source(),
                id,
                Kind::Stripe.event_kind(),
                payload,
            ))
            .await
            .expect("accepted, not refused by the index");
    }
    let first = tenant_of(&h, "evt_long_1").await.expect("a tenant");
    assert_eq!(
        tenant_of(&h, "evt_long_2").await.as_deref(),
        Some(first.as_str())
    );
    for name in [&from_header, &first] {
        assert!(
            name.starts_with("sha256:") && name.len() <= MAX_TENANT_BYTES,
            "{name}"
        );
    }
    assert_ne!(from_header, first, "two different names, two tenants");
    assert_eq!(h.run_worker().await.events_done, 3);
}

tickmark_tests::per_backend!(backend => [
    a_tenant_header_names_each_deliverys_tenant,
    a_tenant_too_long_is_stored_as_its_digest,
]);
