//! Waiting on a condition with a deadline, for state that lives in another
//! process (a database row, a child's progress). In-process progress is
//! awaited through `WorkerStats` instead.

use std::future::Future;
use std::time::Duration;

/// Check `condition` every 50 ms until it holds; panic with `what` after `limit`.
pub async fn until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
