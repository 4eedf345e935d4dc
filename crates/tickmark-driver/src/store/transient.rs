//! In-process retries of transient store errors (a dropped connection during a
//! database restart), with the `backoff` crate. Durable step retries are a
//! different thing: they are stored data (see `retry.rs`).

use std::future::Future;
use std::time::Duration;

use backoff::backoff::Backoff;
use backoff::exponential::ExponentialBackoff;

use super::StoreError;

/// Run `operation` until it succeeds, fails permanently, or `budget` has passed
/// while it kept failing transiently.
pub async fn retry_transient<T, F, Fut>(
    what: &'static str,
    budget: Duration,
    mut operation: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let policy = Jittered(ExponentialBackoff {
        initial_interval: Duration::from_millis(50),
        max_interval: Duration::from_secs(2),
        max_elapsed_time: Some(budget),
        // The spread is `Jittered`'s, drawn from `crate::jitter`.
        randomization_factor: 0.0,
        ..ExponentialBackoff::<RuntimeClock>::default()
    });
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

/// How far a retry's delay is spread around its exponential value (±50 %).
const SPREAD: f64 = 0.5;

/// The exponential schedule spread by [`crate::jitter`] (the `backoff`
/// crate's own spread draws from a generator a simulation cannot seed).
struct Jittered(ExponentialBackoff<RuntimeClock>);

impl Backoff for Jittered {
    fn next_backoff(&mut self) -> Option<Duration> {
        let spread = 1.0 + SPREAD * (2.0 * crate::jitter::unit() - 1.0);
        self.0.next_backoff().map(|delay| delay.mul_f64(spread))
    }

    fn reset(&mut self) {
        self.0.reset();
    }
}

/// The budget is measured on tokio's clock, the one the retries sleep on
/// (the same as the system's, except under a paused, simulated clock).
#[derive(Debug, Default)]
struct RuntimeClock;

impl backoff::Clock for RuntimeClock {
    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}
