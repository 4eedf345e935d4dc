//! One run: a fresh schema, R receivers that take a backlog of signed
//! deliveries, then N workers that drain it while the database's wait events
//! are sampled; optionally one worker SIGKILLed under load. Ends with the
//! correctness checks and the schema dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use chrono::{DateTime, Utc};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use sqlx::PgPool;
use tickmark::store::postgres::{PostgresOptions, PostgresStore};
use tokio_util::sync::CancellationToken;

use super::children::{Child, Counters, Message};
use super::deliveries::{deliveries, Delivery};
use super::sampler::{self, Waits};
use super::steps::CREATE_EFFECTS;
use crate::bench::database::ScratchDatabase;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Steps per event (`reserve`, `call`, `settle`).
pub const STEPS: usize = 3;
/// A run that has not drained after this long is abandoned.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// What one run does.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// PostgreSQL URL without `search_path`: each run makes its own schema.
    pub base_url: String,
    /// Worker processes.
    pub processes: usize,
    /// Receiver processes that take the backlog.
    pub receivers: usize,
    /// Distinct events in the backlog.
    pub events: usize,
    /// Share of extra deliveries that repeat an earlier one.
    pub redelivered: f64,
    /// Concurrent HTTP clients delivering the backlog.
    pub clients: usize,
    /// The `call` step's simulated call, in ms.
    pub call_ms: u64,
    /// Each worker's concurrency, if not `WorkerConfig`'s default (16).
    pub concurrency: Option<usize>,
    /// SIGKILL worker 0 once a third of the backlog is done.
    pub kill: bool,
    /// Names the run's schema, event ids and `application_name`s.
    pub tag: String,
}

/// What a SIGKILL under load cost.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KillFigures {
    /// Events the killed worker had finished when it was killed.
    pub killed_after_events: u64,
    /// Events the killed worker held (running or claimed ahead).
    pub held: usize,
    /// Of those, events its connection's claim committed after the kill.
    pub claimed_after_kill: usize,
    /// The workers' lease (`WorkerConfig::default().lease`).
    pub lease_s: f64,
    /// The latest of the held leases' expiries, after the kill.
    pub lease_left_max_s: f64,
    /// Longest time from the kill until another worker claimed a held event.
    pub max_wait_to_claim_s: f64,
    /// Longest time from the kill until a held event was done.
    pub max_wait_to_done_s: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunFigures {
    /// Worker processes.
    pub processes: usize,
    /// Each worker's concurrency.
    pub concurrency: usize,
    /// Receiver processes that took the backlog.
    pub receivers: usize,
    /// Distinct events drained.
    pub events: usize,
    /// Deliveries sent (events plus redeliveries).
    pub deliveries: usize,
    /// Deliveries sent again after a failed request.
    pub deliveries_retried: usize,
    /// Deliveries answered per second by the receivers.
    pub accepted_per_s: f64,
    /// From `go` to the last event's `finished_at` (database clock).
    pub drain_s: f64,
    /// Events finished per second of the drain.
    pub events_per_s: f64,
    /// Steps finished per second of the drain.
    pub steps_per_s: f64,
    /// Calls of `tickmark_claim` (`pg_stat_user_functions`).
    pub claims: u64,
    /// Events leased per claim, on average.
    pub events_per_claim: f64,
    /// Mean time inside `tickmark_claim`, server side.
    pub claim_ms_mean: f64,
    /// Idle naps of the claim loops (a claim came back short or empty)
    /// while some event was not yet claimed.
    pub short_claims_under_backlog: u64,
    /// Sampled worker backends waiting on a heavyweight lock.
    pub lock_wait_samples: u64,
    /// Worker backends executing a statement, on average.
    pub active_mean: f64,
    /// Of those, executing the claim, on average.
    pub claim_active_mean: f64,
    /// Other sessions' active backends on the server, on average (noise).
    pub others_active_mean: f64,
    /// The most frequent wait events of the workers' active backends, with
    /// their share (%) of the active samples (`CPU`: none).
    pub top_waits: Vec<(String, f64)>,
    /// Most connections of the worker processes seen at once.
    pub max_connections: u64,
    /// Commits per event, server-wide during the drain (other sessions
    /// included).
    pub commits_per_event: f64,
    /// WAL flushes per second of the drain (server-wide).
    pub wal_syncs_per_s: f64,
    /// WAL written per event, in KB (server-wide).
    pub wal_kb_per_event: f64,
    /// `sum(takeovers)` of `tickmark_events`.
    pub takeovers: i64,
    /// Steps that ran twice: `sum(runs) - count(*)` of `fleet_effects`.
    pub reruns: i64,
    /// Step attempts that failed (workers' counters).
    pub steps_failed: u64,
    /// Leases the workers lost (workers' counters).
    pub leases_lost: u64,
    /// Whether every check passed.
    pub correct: bool,
    /// The checks that failed.
    pub problems: Vec<String>,
    /// The kill's figures, in a kill run.
    pub kill: Option<KillFigures>,
}

/// Run once; the schema is dropped whatever happens.
pub async fn run(config: &RunConfig) -> Result<RunFigures, BoxError> {
    let db = ScratchDatabase::create(Some(&config.base_url), &config.tag)
        .await
        .map_err(|e| e.to_string())?;
    let result = run_in(config, &db.url).await;
    db.remove().await.map_err(|e| e.to_string())?;
    result
}

/// A server-wide counter snapshot: WAL and commits.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
struct ServerCounters {
    /// The WAL flushed so far, as a byte position (`pg_stat_wal.wal_bytes`
    /// lags: a backend reports it when it gets round to it, so a short span
    /// could read nothing; bench/src/bench/server_cost.rs).
    wal_bytes: f64,
    wal_sync: i64,
    xact_commit: i64,
}

async fn server_counters(pool: &PgPool) -> Result<ServerCounters, sqlx::Error> {
    sqlx::query_as(
        "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::float8 AS wal_bytes,
                w.wal_sync, d.xact_commit
         FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()",
    )
    .fetch_one(pool)
    .await
}

async fn run_in(config: &RunConfig, url: &str) -> Result<RunFigures, BoxError> {
    let prefix = format!("fleet_{}_{}_", std::process::id(), config.tag);
    let child_url =
        |name: &str| format!("{url}&options[track_functions]=pl&application_name={prefix}{name}");
    // Migrate once here, before the children connect; keep a small pool.
    let store = PostgresStore::connect_with(
        &format!(
            "{url}&application_name=fleet_{}_coordinator",
            std::process::id()
        ),
        PostgresOptions {
            max_connections: 3,
            ..PostgresOptions::default()
        },
    )
    .await?;
    let pool = store.pool().clone();
    sqlx::query(CREATE_EFFECTS).execute(&pool).await?;
    let mut figures = RunFigures {
        processes: config.processes,
        concurrency: config
            .concurrency
            .unwrap_or(tickmark::WorkerConfig::default().concurrency),
        receivers: config.receivers,
        events: config.events,
        ..RunFigures::default()
    };

    // 1. The backlog, through the receivers.
    let mut receivers = Vec::new();
    let mut addrs = Vec::new();
    for r in 0..config.receivers {
        let name = format!("r{r}");
        let mut child = Child::spawn(
            &name,
            "receiver",
            &[
                "--child-url".into(),
                child_url(&name),
                "--call-ms".into(),
                config.call_ms.to_string(),
            ],
        )?;
        let addr = child
            .expect(Duration::from_secs(120), |m| match m {
                Message::Listening(addr) => Some(addr.clone()),
                _ => None,
            })
            .await?;
        addrs.push(addr);
        receivers.push(child);
    }
    let backlog = deliveries(&config.tag, config.events, config.redelivered);
    figures.deliveries = backlog.len();
    let started = Instant::now();
    let retried = deliver(&addrs, config.clients, backlog).await?;
    figures.accepted_per_s = round(figures.deliveries as f64 / started.elapsed().as_secs_f64());
    figures.deliveries_retried = retried;
    // Their connections would count against max_connections during the drain.
    for child in receivers {
        child.stop().await?;
    }
    let accepted: i64 = sqlx::query_scalar("SELECT count(*) FROM tickmark_events")
        .fetch_one(&pool)
        .await?;
    tracing::info!(
        accepted,
        deliveries = figures.deliveries,
        per_s = figures.accepted_per_s,
        "backlog accepted"
    );

    // 2. The workers.
    let mut workers = Vec::new();
    for w in 0..config.processes {
        let name = format!("w{w}");
        let mut args = vec![
            "--child-url".into(),
            child_url(&name),
            "--call-ms".into(),
            config.call_ms.to_string(),
            "--name".into(),
            format!("{prefix}{name}"),
        ];
        if let Some(concurrency) = config.concurrency {
            args.extend(["--concurrency".into(), concurrency.to_string()]);
        }
        workers.push(Child::spawn(&name, "worker", &args)?);
    }
    for worker in &mut workers {
        worker
            .expect(Duration::from_secs(120), |m| {
                matches!(m, Message::Ready).then_some(())
            })
            .await?;
    }
    let before = server_counters(&pool).await?;
    let go_at: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await?;
    let stop_sampling = CancellationToken::new();
    let sampling = tokio::spawn(sampler::sample(
        url.to_owned(),
        format!("{prefix}w"),
        stop_sampling.clone(),
    ));
    let go = Instant::now();
    for worker in &mut workers {
        worker.go().await?;
    }

    // 3. Drain; kill one worker a third of the way.
    let events = config.events as u64;
    let mut short_under_backlog = 0;
    let mut killed: Option<Killed> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last_check = Instant::now();
    loop {
        tick.tick().await;
        if go.elapsed() > RUN_TIMEOUT {
            return Err(format!("not drained after {RUN_TIMEOUT:?}").into());
        }
        for worker in &mut workers {
            worker.poll();
        }
        let total = sum(&workers);
        if total.claimed < events {
            short_under_backlog = total.idle_waits;
        }
        if config.kill && killed.is_none() && total.events_done >= events / 3 {
            let owner = format!("{prefix}{}", workers[0].name);
            killed = Some(Killed::now(&mut workers[0], owner, &pool).await?);
        }
        if let Some(k) = killed.as_mut() {
            k.observe(&pool).await?;
        }
        let near_end = total.events_done >= events || killed.is_some();
        if near_end && last_check.elapsed() >= Duration::from_millis(250) {
            last_check = Instant::now();
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM tickmark_events WHERE state <> 'done'")
                    .fetch_one(&pool)
                    .await?;
            if left == 0 && killed.as_ref().is_none_or(|k| k.settled()) {
                break;
            }
        }
    }
    let after = server_counters(&pool).await?;
    stop_sampling.cancel();
    let waits: Waits = sampling.await??;

    // 4. Stop the workers; their final counters.
    let mut counters = Vec::new();
    let killed_name = killed.as_ref().map(|k| k.name.clone());
    for worker in workers {
        if Some(&worker.name) == killed_name.as_ref() {
            counters.push(worker.last);
        } else {
            counters.push(worker.stop().await?);
        }
    }
    let total = counters.iter().copied().fold(Counters::default(), add);

    // 5. Figures and checks.
    figures.drain_s = sqlx::query_scalar::<_, f64>(
        "SELECT extract(epoch FROM max(finished_at) - $1)::float8 FROM tickmark_events",
    )
    .bind(go_at)
    .fetch_one(&pool)
    .await?;
    figures.events_per_s = round(config.events as f64 / figures.drain_s);
    figures.steps_per_s = round(figures.events_per_s * STEPS as f64);
    // Backends flush their function counts as they exit.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let claims: Option<(i64, f64)> = sqlx::query_as(
        "SELECT calls, total_time FROM pg_stat_user_functions
         WHERE schemaname = current_schema() AND funcname = 'tickmark_claim'",
    )
    .fetch_optional(&pool)
    .await?;
    if let Some((calls, total_ms)) = claims {
        figures.claims = calls as u64;
        figures.events_per_claim = round(total.claimed as f64 / calls.max(1) as f64);
        figures.claim_ms_mean = round(total_ms / calls.max(1) as f64);
    }
    figures.short_claims_under_backlog = short_under_backlog;
    figures.lock_wait_samples = waits.lock_waits;
    let samples = waits.samples.max(1) as f64;
    figures.active_mean = round(waits.active as f64 / samples);
    figures.claim_active_mean = round(waits.claim_active as f64 / samples);
    figures.others_active_mean = round(waits.others_active as f64 / samples);
    figures.top_waits = waits.top(4);
    figures.max_connections = waits.max_connections;
    let events_f = config.events as f64;
    figures.commits_per_event = round((after.xact_commit - before.xact_commit) as f64 / events_f);
    figures.wal_syncs_per_s = round((after.wal_sync - before.wal_sync) as f64 / figures.drain_s);
    figures.wal_kb_per_event = round((after.wal_bytes - before.wal_bytes) / 1024.0 / events_f);
    figures.steps_failed = total.steps_failed;
    figures.leases_lost = total.leases_lost;
    figures.kill = killed.map(|k| k.figures());

    check(config, &pool, accepted, &mut figures).await?;
    pool.close().await;
    Ok(figures)
}

/// Every event done exactly once: all events accepted once and done, every
/// step row done, one effect row per step, and no step ran twice beyond the
/// events a killed worker held.
async fn check(
    config: &RunConfig,
    pool: &PgPool,
    accepted: i64,
    figures: &mut RunFigures,
) -> Result<(), sqlx::Error> {
    let expected = config.events as i64;
    let (events, done, takeovers): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE state = 'done'), coalesce(sum(takeovers), 0)::int8
         FROM tickmark_events",
    )
    .fetch_one(pool)
    .await?;
    let (steps, steps_done): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE state = 'done') FROM tickmark_steps",
    )
    .fetch_one(pool)
    .await?;
    let (effects, runs): (i64, i64) =
        sqlx::query_as("SELECT count(*), coalesce(sum(runs), 0)::int8 FROM fleet_effects")
            .fetch_one(pool)
            .await?;
    figures.takeovers = takeovers;
    figures.reruns = runs - effects;
    let held = figures.kill.as_ref().map_or(0, |k| k.held as i64);
    let mut problems = Vec::new();
    let steps_expected = expected * STEPS as i64;
    let mut expect = |what: &str, ok: bool, detail: String| {
        if !ok {
            problems.push(format!("{what}: {detail}"));
        }
    };
    expect(
        "accepted once each",
        accepted == expected && events == expected,
        format!("{accepted} accepted, {events} events, {expected} expected"),
    );
    expect(
        "every event done",
        done == expected,
        format!("{done} of {expected}"),
    );
    expect(
        "every step marked done once",
        steps == steps_expected && steps_done == steps_expected,
        format!("{steps_done} done of {steps} rows, {steps_expected} expected"),
    );
    expect(
        "one effect per step",
        effects == steps_expected,
        format!("{effects} rows, {steps_expected} expected"),
    );
    expect(
        "re-runs only of events a killed worker held",
        runs - effects <= held,
        format!("{} re-runs, {held} held", runs - effects),
    );
    expect(
        "takeovers only of events a killed worker held",
        takeovers <= held,
        format!("{takeovers} takeovers, {held} held"),
    );
    for problem in &problems {
        tracing::error!(%problem, "check failed");
    }
    figures.correct = problems.is_empty();
    figures.problems = problems;
    Ok(())
}

/// The killed worker, and what became of the events it held.
struct Killed {
    name: String,
    /// Its lease owner name.
    owner: String,
    at: Instant,
    at_db: DateTime<Utc>,
    after_events: u64,
    lease_left_max_s: f64,
    /// Held events found after the kill (a claim committed by its
    /// connection after the process died).
    claimed_after_kill: usize,
    /// Held event → when it was claimed again and done.
    held: HashMap<i64, Followed>,
}

/// A held event as looked at: id, lease owner, state, finished and lease
/// expiry (seconds after the kill).
type HeldRow = (i64, Option<String>, String, Option<f64>, f64);

/// A held event, followed after the kill: seconds after it.
#[derive(Debug, Clone, Copy, Default)]
struct Followed {
    claimed_s: Option<f64>,
    done_s: Option<f64>,
}

impl Killed {
    async fn now(worker: &mut Child, owner: String, pool: &PgPool) -> Result<Self, BoxError> {
        let after_events = worker.last.events_done;
        worker.kill().await?;
        let at = Instant::now();
        let at_db: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(pool)
            .await?;
        let rows: Vec<(i64, f64)> = sqlx::query_as(
            "SELECT id, extract(epoch FROM due_at - $2)::float8 FROM tickmark_events
             WHERE state = 'running' AND lease_owner = $1",
        )
        .bind(&owner)
        .bind(at_db)
        .fetch_all(pool)
        .await?;
        let lease_left_max_s = rows.iter().map(|r| r.1).fold(0.0, f64::max);
        tracing::info!(worker = %worker.name, held = rows.len(), lease_left_max_s, "SIGKILLed a worker under load");
        Ok(Self {
            name: worker.name.clone(),
            owner,
            at,
            at_db,
            after_events,
            lease_left_max_s,
            claimed_after_kill: 0,
            held: rows
                .into_iter()
                .map(|(id, _)| (id, Followed::default()))
                .collect(),
        })
    }

    /// Look at the held events once.
    async fn observe(&mut self, pool: &PgPool) -> Result<(), sqlx::Error> {
        if self.settled() {
            return Ok(());
        }
        let ids: Vec<i64> = self.held.keys().copied().collect();
        // The dead worker's connection may still commit a claim it sent
        // before the kill (the server notices the client is gone only when
        // it answers): those events are held too, and found here.
        let rows: Vec<HeldRow> = sqlx::query_as(
            "SELECT id, lease_owner, state, extract(epoch FROM finished_at - $2)::float8,
                    extract(epoch FROM due_at - $2)::float8
             FROM tickmark_events
             WHERE id = ANY($1) OR (lease_owner = $3 AND state = 'running')",
        )
        .bind(&ids)
        .bind(self.at_db)
        .bind(&self.owner)
        .fetch_all(pool)
        .await?;
        let now = self.at.elapsed().as_secs_f64();
        for (id, owner, state, finished, due) in rows {
            if !self.held.contains_key(&id) {
                self.claimed_after_kill += 1;
            }
            let entry = self.held.entry(id).or_default();
            let mine = owner.as_deref() == Some(self.owner.as_str());
            if mine && state == "running" {
                self.lease_left_max_s = self.lease_left_max_s.max(due);
            }
            if entry.claimed_s.is_none() && !mine {
                entry.claimed_s = Some(now);
            }
            if entry.done_s.is_none() && state == "done" {
                entry.done_s = Some(finished.unwrap_or(now).max(0.0));
            }
        }
        Ok(())
    }

    fn settled(&self) -> bool {
        self.at.elapsed() > Duration::from_secs(2) && self.held.values().all(|h| h.done_s.is_some())
    }

    fn figures(&self) -> KillFigures {
        let max = |pick: fn(&Followed) -> Option<f64>| {
            self.held.values().filter_map(pick).fold(0.0, f64::max)
        };
        KillFigures {
            killed_after_events: self.after_events,
            held: self.held.len(),
            claimed_after_kill: self.claimed_after_kill,
            lease_s: tickmark::WorkerConfig::default().lease.as_secs_f64(),
            lease_left_max_s: round(self.lease_left_max_s),
            max_wait_to_claim_s: round(max(|h| h.claimed_s)),
            max_wait_to_done_s: round(max(|h| h.done_s)),
        }
    }
}

fn sum(workers: &[Child]) -> Counters {
    workers
        .iter()
        .map(|w| w.last)
        .fold(Counters::default(), add)
}

fn add(a: Counters, b: Counters) -> Counters {
    Counters {
        claimed: a.claimed + b.claimed,
        takeovers: a.takeovers + b.takeovers,
        steps_done: a.steps_done + b.steps_done,
        steps_failed: a.steps_failed + b.steps_failed,
        events_done: a.events_done + b.events_done,
        leases_lost: a.leases_lost + b.leases_lost,
        idle_waits: a.idle_waits + b.idle_waits,
    }
}

fn round(x: f64) -> f64 {
    if x.is_finite() {
        (x * 100.0).round() / 100.0
    } else {
        0.0
    }
}

/// Send every delivery from `clients` HTTP clients, spread over the
/// receivers; a failed request is sent again (as a provider would), up to
/// 20 times. Returns how many were sent again.
async fn deliver(
    addrs: &[String],
    clients: usize,
    backlog: Vec<Delivery>,
) -> Result<usize, BoxError> {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let backlog = Arc::new(backlog);
    let addrs = Arc::new(addrs.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let retried = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (client, backlog, addrs, next, retried) = (
            client.clone(),
            backlog.clone(),
            addrs.clone(),
            next.clone(),
            retried.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(delivery) = backlog.get(i) else {
                    return Ok::<_, String>(());
                };
                let addr = &addrs[i % addrs.len()];
                let mut tries = 0;
                loop {
                    let request = Request::post(format!("http://{addr}/hooks/stripe"))
                        .header("content-type", "application/json")
                        .header("stripe-signature", &delivery.signature)
                        .body(Body::from(delivery.body.clone()))
                        .expect("request");
                    let ok = match client.request(request).await {
                        Ok(response) => {
                            let ok = response.status().is_success();
                            let _ = response.into_body().collect().await;
                            ok
                        }
                        Err(_) => false,
                    };
                    if ok {
                        break;
                    }
                    tries += 1;
                    retried.fetch_add(1, Ordering::Relaxed);
                    if tries >= 20 {
                        return Err(format!("delivery {i} refused 20 times"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await?.map_err(|e| -> BoxError { e.into() })?;
    }
    Ok(retried.load(Ordering::Relaxed))
}
