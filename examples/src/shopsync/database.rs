//! The engine's database, and the app's one table in it:
//! `shopsync_received`, what the `record` step saw. Created at start with
//! `CREATE TABLE IF NOT EXISTS`, the same SQL on both backends.

use std::sync::Arc;
use std::time::Duration;

use tickmark::{Engine, Store, StoreError};

/// The table `record` writes to.
pub const RECEIVED_TABLE: &str = "shopsync_received";

const CREATE_RECEIVED: &str = "CREATE TABLE IF NOT EXISTS shopsync_received (
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    kind     TEXT NOT NULL,
    shop     TEXT,
    PRIMARY KEY (source, event_id)
)";

/// Connect the engine's store at `url` (`sqlite://…` or `postgres://…`),
/// applying tickmark's schema.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    tickmark::connect(url).await
}

/// Create the app's table if it does not exist, in one of the engine's
/// transactions.
pub async fn create_tables(engine: &Engine) -> Result<(), StoreError> {
    // Two PostgreSQL processes creating the same table at the same moment
    // can collide in the catalog; a second try sees the table.
    let mut tries = 0;
    loop {
        let created = async {
            let mut tx = engine.transaction().await?;
            tx.query(CREATE_RECEIVED).execute().await?;
            tx.commit().await
        }
        .await;
        match created {
            Ok(()) => return Ok(()),
            Err(_) if tries < 3 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100 * tries)).await;
            }
            Err(error) => return Err(error),
        }
    }
}
