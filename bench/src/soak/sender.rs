//! The provider's side: signed Stripe deliveries over HTTP at a steady rate,
//! a share of them redeliveries of events already acknowledged, some of those
//! older than the retention (late: their events are pruned, and only a
//! tombstone can tell the receiver it has seen them).
//!
//! Open loop: each delivery is sent at its time whatever the receiver's
//! latency (up to [`MAX_IN_FLIGHT`] at once), as a provider does. A failed
//! request (no answer, or not 2xx) is retried after a second, as a provider
//! retries, up to [`ATTEMPTS`] times.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use tickmark_examples::stripe_signature::stripe_signature;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::handler::KIND;

/// Requests in flight at most; beyond that the sender waits (and falls behind).
pub const MAX_IN_FLIGHT: usize = 512;
/// Tries per delivery before it counts as lost.
pub const ATTEMPTS: u32 = 5;

/// What the sender sends, and to whom.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// The receiver's address (`POST /hooks/stripe`).
    pub addr: SocketAddr,
    /// The Stripe signing secret.
    pub secret: String,
    /// Deliveries per second.
    pub rate: f64,
    /// The share of deliveries that are redeliveries (0.2).
    pub duplicate_share: f64,
    /// The share of redeliveries that are late, when there are events old enough.
    pub late_share: f64,
    /// Redeliveries younger than this are recent ones (their events may still be
    /// in the inbox).
    pub retention: Duration,
    /// Late redeliveries are older than this (the retention plus a prune
    /// period: their events are pruned) ...
    pub late_after: Duration,
    /// ... and younger than this (inside the dedup window).
    pub late_before: Duration,
    /// Bytes of filler in each payload (a real invoice event is a few KB).
    pub payload_bytes: usize,
}

/// Figures of one sampling interval, taken (and reset) by the sampler.
#[derive(Debug, Default, Clone)]
pub struct Interval {
    /// Acknowledgement latency of every answered request, ms.
    pub latencies_ms: Vec<f32>,
    /// First deliveries answered `new`.
    pub new: u64,
    /// Redeliveries answered `duplicate`.
    pub duplicate: u64,
    /// Requests that failed (retried).
    pub failed: u64,
}

/// Running totals for the correctness checks.
#[derive(Debug, Default)]
pub struct Totals {
    /// Deliveries of new events sent.
    pub first_sent: AtomicU64,
    /// New events acknowledged `new` (once each).
    pub accepted: AtomicU64,
    /// Redeliveries sent (recent and late).
    pub redeliveries: AtomicU64,
    /// Late redeliveries sent (older than the retention plus a prune period).
    pub late_redeliveries: AtomicU64,
    /// Late redeliveries answered `duplicate`.
    pub late_duplicates: AtomicU64,
    /// Redeliveries answered `new`: an event accepted twice (must be 0).
    pub redelivery_answered_new: AtomicU64,
    /// First deliveries answered `duplicate` with no failed attempt before
    /// (must be 0: the ids are fresh).
    pub first_answered_duplicate: AtomicU64,
    /// Failed requests (each retried).
    pub failed_requests: AtomicU64,
    /// New events never acknowledged after every attempt (must be 0).
    pub lost: AtomicU64,
}

/// The sender's shared state: the interval's figures, the totals, and the
/// acknowledged events that may be redelivered.
#[derive(Debug, Default)]
pub struct SenderState {
    interval: Mutex<Interval>,
    /// Totals since the start.
    pub totals: Totals,
    /// Acknowledged events (number, when acknowledged), oldest first.
    acknowledged: Mutex<VecDeque<(u64, Instant)>>,
}

impl SenderState {
    /// The figures since the last call, and a fresh interval.
    pub fn take_interval(&self) -> Interval {
        std::mem::take(&mut *self.interval.lock().expect("interval lock"))
    }

    fn record(&self, took: Duration, answer: Answer) {
        let mut interval = self.interval.lock().expect("interval lock");
        match answer {
            Answer::Failed => interval.failed += 1,
            Answer::New => interval.new += 1,
            Answer::Duplicate => interval.duplicate += 1,
        }
        if answer != Answer::Failed {
            interval.latencies_ms.push(took.as_secs_f32() * 1000.0);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    New,
    Duplicate,
    Failed,
}

/// Which kind of delivery this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    First(u64),
    Recent(u64),
    Late(u64),
}

/// Send until `stop`, then wait for the requests in flight.
pub async fn run(config: SenderConfig, state: Arc<SenderState>, stop: CancellationToken) {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let mut next_event = 0_u64;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / config.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let filler = "x".repeat(config.payload_bytes);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let delivery = choose(&config, &state, &mut rng, &mut next_event);
        let permit = slots.clone().acquire_owned().await.expect("semaphore");
        let (client, config, state) = (client.clone(), config.clone(), state.clone());
        let body = body(delivery, &filler);
        tokio::spawn(async move {
            deliver(&client, &config, &state, delivery, body).await;
            drop(permit);
        });
    }
    // Every request answered (or given up) before the totals are read.
    let _all = slots
        .acquire_many(MAX_IN_FLIGHT as u32)
        .await
        .expect("semaphore");
}

fn choose(
    config: &SenderConfig,
    state: &SenderState,
    rng: &mut rand::rngs::StdRng,
    next_event: &mut u64,
) -> Delivery {
    let now = Instant::now();
    let mut acknowledged = state.acknowledged.lock().expect("acknowledged lock");
    // Forget what may no longer be redelivered.
    let keep = config.late_before;
    while acknowledged
        .front()
        .is_some_and(|(_, at)| now.duration_since(*at) > keep)
    {
        acknowledged.pop_front();
    }
    if !acknowledged.is_empty() && rng.gen_bool(config.duplicate_share) {
        // Acknowledgements arrive nearly in order: a partition point is close enough.
        let younger_than = |age: Duration| {
            now.checked_sub(age)
                .map_or(0, |at| acknowledged.partition_point(|(_, t)| *t < at))
        };
        let recent_from = younger_than(config.retention.mul_f64(0.9));
        let late_until = younger_than(config.late_after);
        if late_until > 0 && rng.gen_bool(config.late_share) {
            return Delivery::Late(acknowledged[rng.gen_range(0..late_until)].0);
        }
        if recent_from < acknowledged.len() {
            return Delivery::Recent(
                acknowledged[rng.gen_range(recent_from..acknowledged.len())].0,
            );
        }
    }
    *next_event += 1;
    Delivery::First(*next_event)
}

fn body(delivery: Delivery, filler: &str) -> String {
    let (Delivery::First(n) | Delivery::Recent(n) | Delivery::Late(n)) = delivery;
    serde_json::json!({
        "id": format!("evt_soak_{n}"),
        "object": "event",
        "type": KIND,
        "data": {"object": {
            "id": format!("in_soak_{n}"),
            "customer": format!("cus_{}", n % 997),
            "amount_paid": 1200,
            "currency": "usd",
            "description": filler,
        }}
    })
    .to_string()
}

fn sign(secret: &str, body: &str) -> String {
    stripe_signature(secret, chrono::Utc::now().timestamp(), body)
}

async fn deliver(
    client: &Client<HttpConnector, Body>,
    config: &SenderConfig,
    state: &SenderState,
    delivery: Delivery,
    body: String,
) {
    let totals = &state.totals;
    match delivery {
        Delivery::First(_) => totals.first_sent.fetch_add(1, Ordering::Relaxed),
        Delivery::Recent(_) => totals.redeliveries.fetch_add(1, Ordering::Relaxed),
        Delivery::Late(_) => {
            totals.redeliveries.fetch_add(1, Ordering::Relaxed);
            totals.late_redeliveries.fetch_add(1, Ordering::Relaxed)
        }
    };
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Stripe signs each attempt anew.
        let request = Request::post(format!("http://{}/hooks/stripe", config.addr))
            .header("content-type", "application/json")
            .header("stripe-signature", sign(&config.secret, &body))
            .body(Body::from(body.clone()))
            .expect("request");
        let sent = Instant::now();
        let answer = send(client, request).await;
        state.record(sent.elapsed(), answer);
        match (delivery, answer) {
            (_, Answer::Failed) => {
                totals.failed_requests.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(?delivery, attempt, "delivery failed; retrying");
                continue;
            }
            (Delivery::First(n), answer) => {
                // A duplicate after a failed attempt: that attempt was accepted.
                if answer == Answer::Duplicate && attempt == 0 {
                    totals
                        .first_answered_duplicate
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::error!(event = n, "a first delivery was answered duplicate");
                }
                totals.accepted.fetch_add(1, Ordering::Relaxed);
                state
                    .acknowledged
                    .lock()
                    .expect("acknowledged lock")
                    .push_back((n, Instant::now()));
            }
            (Delivery::Recent(n) | Delivery::Late(n), Answer::New) => {
                totals
                    .redelivery_answered_new
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(?delivery, event = n, "a redelivery was accepted as new");
            }
            (Delivery::Late(_), Answer::Duplicate) => {
                totals.late_duplicates.fetch_add(1, Ordering::Relaxed);
            }
            (Delivery::Recent(_), Answer::Duplicate) => {}
        }
        return;
    }
    if let Delivery::First(n) = delivery {
        totals.lost.fetch_add(1, Ordering::Relaxed);
        tracing::error!(event = n, "a new event was never acknowledged");
    }
}

async fn send(client: &Client<HttpConnector, Body>, request: Request<Body>) -> Answer {
    let Ok(response) = client.request(request).await else {
        return Answer::Failed;
    };
    let ok = response.status().is_success();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_else(|_| Bytes::new());
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    match (ok, json["status"].as_str()) {
        (true, Some("new")) => Answer::New,
        (true, Some("duplicate")) => Answer::Duplicate,
        _ => Answer::Failed,
    }
}
