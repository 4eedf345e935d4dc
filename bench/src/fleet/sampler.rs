//! The database's wait events during a drain: `pg_stat_activity`, sampled
//! every 100 ms on a connection of its own, for the run's worker backends
//! (found by `application_name`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

/// What the samples saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Waits {
    /// Samples taken.
    pub samples: u64,
    /// Backends seen executing a statement, summed over the samples (÷
    /// samples: how many were active on average).
    pub active: u64,
    /// Active backends by `wait_event_type:wait_event` (`CPU` when none),
    /// summed over the samples.
    pub by_event: BTreeMap<String, u64>,
    /// Of those, the ones executing the claim (`tickmark_claim`).
    pub claim_active: u64,
    /// Active backends waiting on a heavyweight lock (`Lock:*`): a row, a
    /// transaction or a relation another backend holds.
    pub lock_waits: u64,
    /// Other sessions' backends executing a statement (other benchmarks,
    /// tests), summed over the samples: how busy the shared server was.
    pub others_active: u64,
    /// Most connections of the run's processes seen at once (any state).
    pub max_connections: u64,
}

impl Waits {
    /// The `n` most frequent wait events, as `event share%` (share of the
    /// active samples).
    pub fn top(&self, n: usize) -> Vec<(String, f64)> {
        let mut all: Vec<(&String, &u64)> = self.by_event.iter().collect();
        all.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        all.into_iter()
            .take(n)
            .map(|(k, v)| {
                (
                    k.clone(),
                    (*v as f64 * 1000.0 / self.active.max(1) as f64).round() / 10.0,
                )
            })
            .collect()
    }
}

/// Sample until `stop` is cancelled; backends whose `application_name`
/// starts with `prefix`.
pub async fn sample(
    admin_url: String,
    prefix: String,
    stop: CancellationToken,
) -> Result<Waits, sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(&admin_url).await?;
    let pattern = format!("{prefix}%");
    let mut waits = Waits::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => break,
        }
        let rows: Vec<(bool, String, Option<String>, bool)> = sqlx::query_as(
            "SELECT application_name LIKE $1, coalesce(state, ''),
                    wait_event_type || ':' || wait_event,
                    coalesce(query LIKE '%tickmark_claim%', false)
             FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await?;
        waits.samples += 1;
        let ours = rows.iter().filter(|r| r.0).count() as u64;
        waits.max_connections = waits.max_connections.max(ours);
        for (mine, state, event, claim) in rows {
            if state != "active" {
                continue;
            }
            if !mine {
                waits.others_active += 1;
                continue;
            }
            waits.active += 1;
            if claim {
                waits.claim_active += 1;
            }
            let event = event.unwrap_or_else(|| "CPU".to_owned());
            if event.starts_with("Lock:") {
                waits.lock_waits += 1;
            }
            *waits.by_event.entry(event).or_default() += 1;
        }
    }
    conn.close().await?;
    Ok(waits)
}
