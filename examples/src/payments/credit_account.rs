//! `credit_account`: add the invoice's `amount_paid` to the customer's
//! balance, in the engine's transaction, so the credit commits together with
//! the step's mark: exactly once, however often the event is delivered or the
//! worker crashes.

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Step, StepContext, StepError, StepResult};

use super::Invoice;

const UPSERT_PG: &str = "INSERT INTO accounts (customer, balance) VALUES ($1, $2)
    ON CONFLICT (customer) DO UPDATE SET balance = accounts.balance + excluded.balance
    RETURNING balance";
const UPSERT_LITE: &str = "INSERT INTO accounts (customer, balance) VALUES (?1, ?2)
    ON CONFLICT (customer) DO UPDATE SET balance = accounts.balance + excluded.balance
    RETURNING balance";

/// Credits `data.object.amount_paid` to `data.object.customer` (an upsert
/// into `accounts`). Output: `{"customer", "credited", "balance"}`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CreditAccount;

#[typetag::serde(name = "payments.credit_account")]
#[async_trait::async_trait]
impl Step for CreditAccount {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let invoice = Invoice::from_event(ctx.event())?;
        let tx = ctx.transaction()?;
        let balance: i64 = if let Some(conn) = tx.postgres() {
            sqlx::query_scalar(UPSERT_PG)
                .bind(&invoice.customer)
                .bind(invoice.amount_paid)
                .fetch_one(conn)
                .await?
        } else if let Some(conn) = tx.sqlite() {
            sqlx::query_scalar(UPSERT_LITE)
                .bind(&invoice.customer)
                .bind(invoice.amount_paid)
                .fetch_one(conn)
                .await?
        } else {
            return Err(StepError::terminal(
                "the engine's database is neither PostgreSQL nor SQLite",
            ));
        };
        Ok(json!({
            "customer": invoice.customer,
            "credited": invoice.amount_paid,
            "balance": balance,
        }))
    }
}
