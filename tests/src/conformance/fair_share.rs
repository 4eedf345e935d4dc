//! Fair share across tenants (docs/flow_control.md, "Fair share across
//! tenants"): among the tenants with events due, a claim gives each tenant
//! slots in proportion to its weight, whatever the due order. PostgreSQL
//! (migration 0018, in the claim statement) and SQLite (the store's
//! `fair.rs`, in the claim's write transaction).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use tickmark::{Engine, Handler, Handlers, NewEvent};
use tickmark_driver::store::ClaimParams;

use super::engine;
use crate::test_steps::Record;
use crate::TestDb;

/// `stripe/invoice.paid`, one recording step, claimed in fair shares per
/// connected account (`/account`).
pub fn fair_handlers() -> Handlers {
    Handlers::new().on(
        "stripe",
        "invoice.paid",
        Handler::new()
            .named_step("first", Record::default())
            .tenant_key("/account"),
    )
}

/// Accept `count` events of `account`, ids `evt_{account}_{n}`.
pub async fn accept(engine: &Engine, account: &str, count: usize) {
    for n in 0..count {
        let id = format!("evt_{account}_{n}");
        let payload = json!({"id": id, "account": account});
        engine
            .accept(NewEvent::with_id("stripe", &id, "invoice.paid", payload))
            .await
            .unwrap();
    }
}

/// Claim a batch of `limit`; how many events of each tenant it took.
async fn claim(db: &TestDb, limit: u32) -> HashMap<String, usize> {
    let params = ClaimParams::new("fair-worker", limit, Duration::from_secs(30));
    let claimed = db.store.event_claim_many(&params).await.unwrap();
    let mut by_tenant = HashMap::new();
    for event in claimed {
        let tenant = event.event.payload["account"]
            .as_str()
            .unwrap_or("none")
            .to_owned();
        *by_tenant.entry(tenant).or_default() += 1;
    }
    by_tenant
}

fn count(claimed: &HashMap<String, usize>, tenant: &str) -> usize {
    claimed.get(tenant).copied().unwrap_or(0)
}

/// A tenant whose 300 events were accepted first does not hold back another
/// tenant's three: the first batch takes them, and fills up with the first
/// tenant's events.
pub async fn a_flooding_tenant_does_not_hold_back_another(db: TestDb) {
    let engine = engine(&db, fair_handlers());
    accept(&engine, "acct_loud", 300).await;
    accept(&engine, "acct_quiet", 3).await;

    let first = claim(&db, 32).await;
    assert_eq!(count(&first, "acct_quiet"), 3, "{first:?}");
    assert_eq!(count(&first, "acct_loud"), 29, "{first:?}");
}

/// With weights 3 and 1 and both tenants backlogged, every batch splits
/// three to one.
pub async fn claims_follow_the_tenants_weights(db: TestDb) {
    let engine = engine(&db, fair_handlers());
    accept(&engine, "acct_big", 200).await;
    accept(&engine, "acct_small", 200).await;
    db.probe
        .execute("INSERT INTO tickmark_tenants (tenant_key, weight) VALUES ('acct_big', 3)")
        .await;

    for _ in 0..4 {
        let batch = claim(&db, 40).await;
        assert_eq!(count(&batch, "acct_big"), 30, "{batch:?}");
        assert_eq!(count(&batch, "acct_small"), 10, "{batch:?}");
    }
}

/// A tenant alone gets the whole batch, however many tenants it shared
/// with before.
pub async fn a_tenant_alone_gets_the_whole_batch(db: TestDb) {
    let engine = engine(&db, fair_handlers());
    accept(&engine, "acct_alone", 100).await;
    let batch = claim(&db, 64).await;
    assert_eq!(count(&batch, "acct_alone"), 64, "{batch:?}");
}

/// A tenant that had nothing to run while others were served saves no
/// slots for later: when it comes back it starts level with the busy ones
/// (at the clock), not 100 events ahead of them. Batches of four among
/// three tenants give each a share of two, and the virtual times decide
/// who gets the four: a tenant starting at zero would win every one of
/// them for 50 claims.
pub async fn an_idle_tenant_saves_no_slots_for_later(db: TestDb) {
    let engine = engine(&db, fair_handlers());
    accept(&engine, "acct_busy_1", 200).await;
    accept(&engine, "acct_busy_2", 200).await;
    let warm_up = claim(&db, 200).await;
    assert_eq!(count(&warm_up, "acct_busy_1"), 100, "{warm_up:?}");

    accept(&engine, "acct_back", 100).await;
    let mut got = HashMap::new();
    for _ in 0..6 {
        for (tenant, n) in claim(&db, 4).await {
            *got.entry(tenant).or_insert(0) += n;
        }
    }
    for tenant in ["acct_back", "acct_busy_1", "acct_busy_2"] {
        let n = count(&got, tenant);
        assert!((7..=9).contains(&n), "{tenant} got {n} of 24: {got:?}");
    }
}

/// Events of a handler without a tenant key are still claimed while other
/// handlers' events are claimed in fair shares.
pub async fn events_without_a_tenant_are_claimed_beside_the_tenants(db: TestDb) {
    let handlers = fair_handlers().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", Record::default()),
    );
    let engine = engine(&db, handlers);
    for n in 0..5 {
        engine
            .accept(NewEvent::with_id(
                "shop",
                format!("evt_untenanted_{n}"),
                "order.paid",
                json!({}),
            ))
            .await
            .unwrap();
    }
    accept(&engine, "acct_loud", 100).await;
    let batch = claim(&db, 20).await;
    assert_eq!(count(&batch, "none"), 5, "{batch:?}");
    assert_eq!(count(&batch, "acct_loud"), 15, "{batch:?}");
}

/// A weight that is not a positive number is refused by the database, so
/// no tenant is ever stalled by one.
pub async fn a_weight_that_is_not_a_positive_number_is_refused(db: TestDb) {
    use sqlx::Connection;
    for weight in ["0", "-1", "'NaN'", "'Infinity'", "1e999"] {
        let sql = format!(
            "INSERT INTO tickmark_tenants (tenant_key, weight) VALUES ('acct_x', {weight})"
        );
        let refused = match db.backend() {
            tickmark::Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
                sqlx::query(&sql).execute(&mut conn).await.map(|_| ())
            }
            tickmark::Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                sqlx::query(&sql).execute(&mut conn).await.map(|_| ())
            }
        };
        assert!(refused.is_err(), "weight {weight} was stored");
    }
}
