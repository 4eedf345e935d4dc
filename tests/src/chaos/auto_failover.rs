//! `chaos --failover auto`: the failover decided by a real HA manager,
//! pg_auto_failover ([`Formation`]), not by the run.
//!
//! Half-way through the chaos phase the primary's machine dies (its keeper
//! and PostgreSQL, SIGKILL) while deliveries continue. Nothing is promoted
//! by hand: the run only watches the standby until it accepts writes, then
//! counts which acknowledged deliveries the new primary lacks, and starts
//! the old primary's keeper again, which rejoins as a standby. After the
//! drain, [`verify_rejoined`] checks that no write of tickmark ever landed
//! on the old primary: it is in recovery, on the new primary's timeline, and
//! once it has replayed all the new primary wrote, its tickmark tables and
//! ledger are the new primary's, row for row.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::chaos::plan::Plan;
use crate::chaos::provider::{Provider, SendTally};
use crate::chaos::report::{FailoverFigures, RejoinFigures};
use crate::pg_auto_failover::Formation;

use super::database::Judge;

/// How long pg_auto_failover may take to promote the standby, and the old
/// primary to rejoin (seconds each with the formation's monitor settings;
/// the longest rejoin seen on a busy machine took 34 s).
const WITHIN: Duration = Duration::from_secs(90);

/// What the failover needs from the run.
pub struct AutoFailover<'a> {
    /// The formation; its primary is killed.
    pub formation: &'a mut Formation,
    /// The sender (one extra delivery is sent at the kill, to see a 503).
    pub provider: &'a Provider,
    /// The sender's tally: the kill is its fault time.
    pub tally: &'a SendTally,
    /// Every 2xx so far: the event's index in the plan and when it was answered.
    pub acked: &'a std::sync::Mutex<Vec<(usize, Instant)>>,
    /// The run's plan.
    pub plan: &'a Plan,
    /// The judge, repointed to the new primary.
    pub judge: &'a Judge,
    /// Cancelled when the run gives up on deliveries.
    pub give_up: &'a CancellationToken,
}

/// Kill the primary and let pg_auto_failover fail over; start the old
/// primary's keeper again once the standby is promoted, and wait until it
/// has rejoined. The index of the old primary and the figures (an old
/// primary that does not rejoin is a failed check, not an error).
pub async fn fail_over(how: AutoFailover<'_>) -> Result<(usize, FailoverFigures), String> {
    let formation = how.formation;
    let old = formation.primary().await.map_err(|e| e.to_string())?;
    let new = 1 - old;
    let sync_names = formation
        .synchronous_standby_names(old, Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    let killed_at = formation.kill_node(old).await.map_err(|e| e.to_string())?;
    let killed_epoch = epoch_secs(SystemTime::now()) - killed_at.elapsed().as_secs_f64();
    *how.tally
        .fault_at
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(killed_at);
    let extra = how.plan.events.first().map(|event| {
        let (provider, body, give_up) = (
            how.provider.clone(),
            event.body.clone(),
            how.give_up.clone(),
        );
        tokio::spawn(async move { provider.deliver(&body, &give_up).await })
    });

    let promoted_at = formation
        .wait_until_writable(new, WITHIN)
        .await
        .map_err(|e| e.to_string())?;
    // Before the kill every 2xx came from the old primary; between the kill
    // and the promotion nothing accepted writes, so a 2xx then is an answer
    // the old primary committed before it died. Both must be on the new
    // primary; one acknowledged before the kill must be the row the old
    // primary inserted then, not a later redelivery accepted as new.
    let mut answered: HashMap<usize, Instant> = HashMap::new();
    for &(event, at) in how
        .acked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        if at < promoted_at {
            let first = answered.entry(event).or_insert(at);
            *first = (*first).min(at);
        }
    }
    let rows = received_before(&formation.node_url(new), killed_epoch).await?;
    let mut lost: Vec<String> = answered
        .iter()
        .filter(|(&event, &at)| {
            let id = &how.plan.events[event].id;
            match rows.get(id) {
                None => true,
                Some(&before_kill) => at < killed_at && !before_kill,
            }
        })
        .map(|(&event, _)| how.plan.events[event].id.clone())
        .collect();
    lost.sort();
    how.judge
        .repoint(&formation.node_url(new))
        .map_err(|e| e.to_string())?;

    // The old primary's machine comes back.
    let restarted_at = Instant::now();
    formation
        .restart_keeper(old)
        .await
        .map_err(|e| e.to_string())?;
    let rejoined = formation.wait_until_rejoined(old, WITHIN).await;
    eprintln!(
        "chaos: the old primary (node{}) {} {:?} after its keeper restarted; its keeper's log:\n{}",
        old + 1,
        if rejoined.is_ok() {
            "rejoined as a standby"
        } else {
            "had not rejoined"
        },
        restarted_at.elapsed(),
        formation.transitions(old)
    );
    let (rejoined_ms, rejoin_error) = match rejoined {
        Ok(()) => (Some(millis(restarted_at.elapsed())), None),
        Err(error) => (None, error.to_string().lines().next().map(str::to_owned)),
    };
    if let Some(extra) = extra {
        let _ = extra.await;
    }
    Ok((
        old,
        FailoverFigures {
            replication: format!("auto (pg_auto_failover; {sync_names})"),
            standby_cut_ms: 0,
            acked_before_kill: answered.len() as u64,
            acked_lost: lost.len() as u64,
            acked_lost_samples: lost.iter().take(10).cloned().collect(),
            kill_to_promoted_ms: millis(promoted_at - killed_at),
            kill_to_accepted_ms: None,
            rejoin: Some(RejoinFigures {
                rejoined_ms,
                rejoin_error,
                ..RejoinFigures::default()
            }),
        },
    ))
}

/// After the drain (the nodes stopped): wait until the old primary `old`
/// has replayed all the new primary wrote, then compare them. Nothing to
/// compare when it did not rejoin.
pub async fn verify_rejoined(
    formation: &Formation,
    old: usize,
    figures: &mut RejoinFigures,
) -> Result<(), String> {
    if figures.rejoined_ms.is_none() {
        return Ok(());
    }
    let new = 1 - old;
    let mut primary = connect(&formation.node_url(new)).await?;
    let mut standby = connect(&formation.node_url(old)).await?;
    let (lsn, timeline): (String, String) = sqlx::query_as(
        "SELECT pg_current_wal_lsn()::text, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
    )
    .fetch_one(&mut primary)
    .await
    .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let caught_up: bool =
            sqlx::query_scalar("SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)")
                .bind(&lsn)
                .fetch_one(&mut standby)
                .await
                .map_err(|e| e.to_string())?;
        if caught_up {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the old primary did not replay up to {lsn} within a minute"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (in_recovery, received_tli): (bool, Option<i32>) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), (SELECT received_tli FROM pg_stat_wal_receiver LIMIT 1)",
    )
    .fetch_one(&mut standby)
    .await
    .map_err(|e| e.to_string())?;
    figures.in_recovery = in_recovery;
    figures.new_primary_timeline = i64::from_str_radix(&timeline, 16).unwrap_or(-1);
    figures.old_primary_timeline = received_tli.map_or(-1, i64::from);
    let mut same = true;
    for table in ["tickmark_events", "tickmark_steps", "accounts"] {
        let on_new = fingerprint(&mut primary, table).await?;
        let on_old = fingerprint(&mut standby, table).await?;
        if table == "tickmark_events" {
            figures.events_on_new_primary = on_new.0;
            figures.events_on_old_primary = on_old.0;
        }
        same &= on_new == on_old;
    }
    figures.rows_match = same;
    Ok(())
}

/// Rows in `table` and an MD5 of all of them, sorted as text.
async fn fingerprint(conn: &mut PgConnection, table: &str) -> Result<(i64, String), String> {
    sqlx::query_as(&format!(
        "SELECT count(*), coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t::text)), '') \
         FROM {table} t"
    ))
    .fetch_one(conn)
    .await
    .map_err(|e| format!("{table}: {e}"))
}

/// Every Stripe event on `url`, and whether its row was inserted before
/// `epoch` (seconds since 1970).
async fn received_before(url: &str, epoch: f64) -> Result<HashMap<String, bool>, String> {
    let mut conn = connect(url).await?;
    let rows: Vec<(String, bool)> = sqlx::query_as(
        "SELECT dedup_key, extract(epoch FROM received_at)::float8 < $1 FROM tickmark_events \
         WHERE source = 'stripe'",
    )
    .bind(epoch)
    .fetch_all(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    Ok(rows.into_iter().collect())
}

async fn connect(url: &str) -> Result<PgConnection, String> {
    PgConnection::connect(url).await.map_err(|e| e.to_string())
}

fn epoch_secs(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
