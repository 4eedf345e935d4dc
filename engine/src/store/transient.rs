//! In-process retries of transient store errors (a dropped connection during a
//! database restart), with the `backoff` crate. Durable step retries are a
//! different thing: they are stored data (see `retry.rs`).

use std::future::Future;
use std::time::Duration;

use backoff::ExponentialBackoff;

use super::StoreError;

/// Run `operation` until it succeeds, fails permanently, or `budget` has passed
/// while it kept failing transiently.
pub(crate) async fn retry_transient<T, F, Fut>(
    what: &'static str,
    budget: Duration,
    mut operation: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let policy = ExponentialBackoff {
        initial_interval: Duration::from_millis(50),
        max_interval: Duration::from_secs(2),
        max_elapsed_time: Some(budget),
        ..ExponentialBackoff::default()
    };
    backoff::future::retry_notify(
        policy,
        || {
            let attempt = operation();
            async move {
                attempt.await.map_err(|error| {
                    if error.is_transient() {
                        backoff::Error::transient(error)
                    } else {
                        backoff::Error::permanent(error)
                    }
                })
            }
        },
        |error: StoreError, wait: Duration| {
            tracing::warn!(operation = what, %error, retry_in_ms = wait.as_millis() as u64, "transient store error; retrying");
        },
    )
    .await
}
