//! `record`: note (source, event id, kind) of any other verified event in the
//! `received` table, in the engine's transaction (exactly once).

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Step, StepContext, StepError, StepResult};

const INSERT_PG: &str = "INSERT INTO received (source, event_id, kind) VALUES ($1, $2, $3)
    ON CONFLICT (source, event_id) DO NOTHING";
const INSERT_LITE: &str = "INSERT INTO received (source, event_id, kind) VALUES (?1, ?2, ?3)
    ON CONFLICT (source, event_id) DO NOTHING";

/// Inserts the event into `received`. Output: `{"inserted": bool}` (false
/// only if an operator re-ran the step).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Record;

#[typetag::serde(name = "payments.record")]
#[async_trait::async_trait]
impl Step for Record {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let event = ctx.event();
        let (source, id, kind) = (event.source.clone(), event.id.clone(), event.kind.clone());
        let tx = ctx.transaction()?;
        let inserted = if let Some(conn) = tx.postgres() {
            sqlx::query(INSERT_PG)
                .bind(&source)
                .bind(&id)
                .bind(&kind)
                .execute(conn)
                .await?
                .rows_affected()
        } else if let Some(conn) = tx.sqlite() {
            sqlx::query(INSERT_LITE)
                .bind(&source)
                .bind(&id)
                .bind(&kind)
                .execute(conn)
                .await?
                .rows_affected()
        } else {
            return Err(StepError::terminal(
                "the engine's database is neither PostgreSQL nor SQLite",
            ));
        };
        Ok(json!({ "inserted": inserted == 1 }))
    }
}
