//! SQL written once for both backends, in the engine's transaction
//! (`StepTransaction::query`): a transactional step that does not know which
//! database it runs on, and an application's own set-up through
//! `Engine::transaction`.

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{EventState, Handler, Handlers, Step, StepContext, StepResult};

use super::{engine, order_paid, quick_worker};
use crate::TestDb;

/// Credits the order's total in one portable statement, then reads it back
/// in the same transaction.
#[derive(Debug, Serialize, Deserialize)]
struct PortableCredit {
    amount: i64,
}

#[typetag::serde(name = "conformance.portable_credit")]
#[async_trait::async_trait]
impl Step for PortableCredit {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let order = ctx.event().id.clone();
        let key = ctx.idempotency_key().to_owned();
        let tx = ctx.transaction()?;
        let changed = tx
            .query("INSERT INTO portable_credits (order_id, amount, step_key, note, flagged) VALUES ($1, $2, $3, $4, $5)")
            .bind(&order)
            .bind(self.amount)
            .bind(key)
            .bind(None::<String>)
            .bind(true)
            .execute()
            .await?;
        let (total,): (i64,) = tx
            .query("SELECT CAST(sum(amount) AS BIGINT) FROM portable_credits WHERE order_id = $1")
            .bind(&order)
            .fetch_one()
            .await?;
        Ok(json!({ "changed": changed, "total_in_transaction": total }))
    }
}

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS portable_credits (\
    order_id TEXT NOT NULL, amount BIGINT NOT NULL, step_key TEXT NOT NULL, \
    note TEXT, flagged BOOLEAN NOT NULL)";

/// A transactional step written once runs on either backend, its write
/// commits with its mark, and reads in the same transaction see it.
pub async fn a_transactional_step_written_once_runs_on_either_backend(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("credit", PortableCredit { amount: 250 }),
    );
    let engine = engine(&db, handlers);
    let mut setup = engine.transaction().await.expect("begin");
    setup.query(CREATE_TABLE).execute().await.expect("create");
    setup.commit().await.expect("commit");

    let tickmark::Accepted::New { seq } = order_paid(&engine, "evt_portable").await else {
        panic!("new")
    };
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();

    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(record.state, EventState::Done);
    let steps = db.store.step_status(seq).await.unwrap();
    assert_eq!(
        steps[0].output,
        Some(json!({ "changed": 1, "total_in_transaction": 250 }))
    );

    let mut read = engine.transaction().await.expect("begin");
    let rows: Vec<(String, i64, String, Option<String>, bool)> = read
        .query("SELECT order_id, amount, step_key, note, flagged FROM portable_credits ORDER BY order_id")
        .fetch_all()
        .await
        .expect("read back");
    assert_eq!(
        rows,
        [(
            "evt_portable".to_owned(),
            250,
            "shop:evt_portable:credit".to_owned(),
            None,
            true
        )]
    );
    let missing: Option<(i64,)> = read
        .query("SELECT amount FROM portable_credits WHERE order_id = $1")
        .bind("evt_nobody")
        .fetch_optional()
        .await
        .expect("read");
    assert_eq!(missing, None);
}

/// An engine transaction dropped without `commit` leaves nothing behind.
pub async fn an_engine_transaction_dropped_uncommitted_rolls_back(db: TestDb) {
    let engine = engine(&db, Handlers::new());
    let mut setup = engine.transaction().await.expect("begin");
    setup.query(CREATE_TABLE).execute().await.expect("create");
    setup.commit().await.expect("commit");

    {
        let mut abandoned = engine.transaction().await.expect("begin");
        let changed = abandoned
            .query("INSERT INTO portable_credits (order_id, amount, step_key, flagged) VALUES ($1, $2, $3, $4)")
            .bind("evt_x")
            .bind(1_i32)
            .bind("k")
            .bind(false)
            .execute()
            .await
            .expect("insert");
        assert_eq!(changed, 1);
    }
    let mut read = engine.transaction().await.expect("begin");
    let (count,): (i64,) = read
        .query("SELECT count(*) FROM portable_credits")
        .fetch_one()
        .await
        .expect("count");
    assert_eq!(count, 0, "the uncommitted insert was rolled back");
}
