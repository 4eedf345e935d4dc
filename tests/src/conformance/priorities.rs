//! Priorities as a head start (docs/flow_control.md, "Priorities: a head
//! start"): a handler's events are claimed as if they had become due its
//! head start earlier, so they pass events that became due up to that much
//! before them, and never one that has been due longer. Fair share between
//! tenants is unchanged: a head start orders a tenant's own events.
//! PostgreSQL (migration 0019, the queue's rank) and SQLite (migration
//! 0013, the events' rank).

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tickmark::{Engine, Handler, Handlers, NewEvent};
use tickmark_driver::store::ClaimParams;

use super::engine;
use crate::test_steps::Record;
use crate::TestDb;

/// The head start of an order in these tests.
const ORDER_HEAD_START: Duration = Duration::from_secs(10 * 60);

/// `shop/products.update` with no head start and `shop/orders.paid` with a
/// head start of ten minutes, both one recording step; with `tenants`,
/// both claimed in fair shares per `/shop`.
fn handlers(tenants: bool) -> Handlers {
    let handler = |head_start: Duration| {
        let handler = Handler::new()
            .named_step("first", Record::default())
            .head_start(head_start);
        if tenants {
            handler.tenant_key("/shop")
        } else {
            handler
        }
    };
    Handlers::new()
        .on("shop", "products.update", handler(Duration::ZERO))
        .on("shop", "orders.paid", handler(ORDER_HEAD_START))
}

/// Accept event `id` of `kind` for `shop`, due `due_in` from now (negative:
/// already due that long).
async fn accept(engine: &Engine, kind: &str, id: &str, shop: &str, due_in: chrono::Duration) {
    let payload = json!({"id": id, "shop": shop});
    engine
        .accept(NewEvent::with_id("shop", id, kind, payload).not_before(Utc::now() + due_in))
        .await
        .unwrap();
}

/// Claim a batch of `limit`: the claimed events' ids, in the order given.
async fn claim(db: &TestDb, limit: u32) -> Vec<String> {
    let params = ClaimParams::new("priority-worker", limit, Duration::from_secs(30));
    let mut claimed = db.store.event_claim_many(&params).await.unwrap();
    claimed.sort_by_key(|event| event.event.seq);
    claimed.into_iter().map(|event| event.event.id).collect()
}

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

/// An order due now passes product syncs that became due up to ten minutes
/// before it, and not the one due for twenty: its head start has aged out.
pub async fn a_head_start_passes_younger_events_and_never_older_ones(db: TestDb) {
    let engine = engine(&db, handlers(false));
    accept(&engine, "products.update", "sync_old", "a", minutes(-20)).await;
    accept(&engine, "products.update", "sync_recent", "a", minutes(-5)).await;
    accept(&engine, "products.update", "sync_now", "a", minutes(0)).await;
    accept(&engine, "orders.paid", "order", "a", minutes(0)).await;

    assert_eq!(claim(&db, 1).await, ["sync_old"]);
    assert_eq!(claim(&db, 1).await, ["order"]);
    assert_eq!(claim(&db, 1).await, ["sync_recent"]);
    assert_eq!(claim(&db, 1).await, ["sync_now"]);
}

/// A head start ranks an event earlier, never makes it due earlier: an
/// order due in two minutes is not claimed now, and the engine's next due
/// time is still two minutes away (an idle worker sleeps, not spins).
pub async fn a_head_start_never_runs_an_event_before_it_is_due(db: TestDb) {
    let engine = engine(&db, handlers(false));
    accept(&engine, "orders.paid", "order_later", "a", minutes(2)).await;

    assert!(claim(&db, 8).await.is_empty());
    let next = db.store.event_next_due().await.unwrap().expect("one event");
    assert!(
        next > Duration::from_secs(90) && next <= Duration::from_secs(120),
        "next due in {next:?}, expected about two minutes"
    );
}

/// With fair share, a head start orders a tenant's own events and takes
/// nothing from another tenant: a batch of two among two tenants takes
/// one of each, the busy tenant's order before its older product syncs.
pub async fn a_head_start_orders_a_tenants_own_events_within_its_share(db: TestDb) {
    let engine = engine(&db, handlers(true));
    for n in 0..10 {
        let id = format!("sync_a_{n}");
        accept(&engine, "products.update", &id, "a", minutes(-3)).await;
        let id = format!("sync_b_{n}");
        accept(&engine, "products.update", &id, "b", minutes(-3)).await;
    }
    accept(&engine, "orders.paid", "order_a", "a", minutes(0)).await;

    let batch = claim(&db, 2).await;
    assert_eq!(batch, ["sync_b_0", "order_a"], "one each, a's order first");
    let batch = claim(&db, 2).await;
    assert_eq!(batch, ["sync_a_0", "sync_b_1"]);
}
