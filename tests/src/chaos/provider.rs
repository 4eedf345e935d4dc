//! The sender, behaving like a webhook provider: each delivery is signed as
//! Stripe signs (`Stripe-Signature: t=…,v1=…`, re-signed on every attempt)
//! and POSTed to a random live node; anything but a 2xx — a refused
//! connection, a reset, a timeout, a 503 — is retried with backoff, to another
//! random live node, until a 2xx comes back or the run gives up.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use hmac::{Hmac, Mac};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long one attempt may take before it counts as a timeout.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(8);

/// Longest backoff between two attempts of one delivery.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The nodes' receiver addresses, by slot; `None` while a node is down or
/// stopped (the sender picks among the others).
#[derive(Debug, Default)]
pub struct Targets {
    slots: Mutex<Vec<Option<SocketAddr>>>,
}

impl Targets {
    /// `slots` nodes, none live yet.
    pub fn new(slots: usize) -> Targets {
        Targets {
            slots: Mutex::new(vec![None; slots]),
        }
    }

    /// Set (or clear) a slot's address.
    pub fn set(&self, slot: usize, addr: Option<SocketAddr>) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = slots.get_mut(slot) {
            *entry = addr;
        }
    }

    /// A random live address.
    pub fn pick(&self) -> Option<SocketAddr> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let live: Vec<SocketAddr> = slots.iter().flatten().copied().collect();
        if live.is_empty() {
            return None;
        }
        Some(live[rand::thread_rng().gen_range(0..live.len())])
    }
}

/// What the sender saw, over all deliveries.
#[derive(Debug, Default)]
pub struct SendTally {
    /// Attempts sent (including retries).
    pub attempts: AtomicU64,
    /// Deliveries answered 200 `new`.
    pub new: AtomicU64,
    /// Deliveries answered 200 `duplicate`.
    pub duplicate: AtomicU64,
    /// 200 answers with another status word (there should be none).
    pub other_2xx: AtomicU64,
    /// 503 answers (the database was down).
    pub unavailable_503: AtomicU64,
    /// Connections refused or broken (a node was killed or restarting).
    pub connection_errors: AtomicU64,
    /// Attempts that got no answer in [`ATTEMPT_TIMEOUT`] (a stopped node).
    pub timeouts: AtomicU64,
    /// Any other answer (a 4xx or 500: a bug; retried like a provider would).
    pub unexpected: AtomicU64,
    /// Deliveries that never got a 2xx before the run gave up.
    pub given_up: AtomicU64,
    /// The first few unexpected answers, for the report.
    pub unexpected_samples: Mutex<Vec<String>>,
    /// When the database failed over (the primary was killed), if it did.
    pub fault_at: Mutex<Option<Instant>>,
    /// The first 2xx answer to an attempt sent after [`Self::fault_at`]:
    /// deliveries were accepted again.
    pub first_2xx_after_fault: Mutex<Option<Instant>>,
}

impl SendTally {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Note a 2xx answer to an attempt sent at `sent_at`.
    fn answered_2xx(&self, sent_at: Instant) {
        let fault_at = *self.fault_at.lock().unwrap_or_else(PoisonError::into_inner);
        if fault_at.is_some_and(|fault_at| sent_at >= fault_at) {
            let mut first = self
                .first_2xx_after_fault
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if first.is_none_or(|first| now < first) {
                *first = Some(now);
            }
        }
    }
}

/// Signs and sends deliveries.
#[derive(Debug, Clone)]
pub struct Provider {
    client: Client<HttpConnector, Body>,
    secret: String,
    targets: Arc<Targets>,
    tally: Arc<SendTally>,
}

/// How one delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// 200 `new`.
    New,
    /// 200 `duplicate`.
    Duplicate,
    /// Another 2xx.
    Other,
    /// The run gave up before a 2xx.
    GaveUp,
}

impl Provider {
    /// A sender signing with `secret` and aiming at `targets`.
    pub fn new(secret: &str, targets: Arc<Targets>, tally: Arc<SendTally>) -> Provider {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        connector.set_nodelay(true);
        Provider {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(5))
                .build(connector),
            secret: secret.to_owned(),
            targets,
            tally,
        }
    }

    /// The `Stripe-Signature` header for `body` at Unix time `t`.
    pub fn stripe_signature(secret: &str, t: i64, body: &str) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
            .expect("HMAC takes any key length");
        mac.update(format!("{t}.{body}").as_bytes());
        format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// Deliver `body` until a 2xx, or until `give_up` fires.
    pub async fn deliver(&self, body: &str, give_up: &CancellationToken) -> Delivered {
        let mut failures: u32 = 0;
        loop {
            if give_up.is_cancelled() {
                SendTally::bump(&self.tally.given_up);
                return Delivered::GaveUp;
            }
            if let Some(addr) = self.targets.pick() {
                SendTally::bump(&self.tally.attempts);
                let sent_at = Instant::now();
                match self.attempt(addr, body).await {
                    Attempt::Answered(200..=299, word) => {
                        self.tally.answered_2xx(sent_at);
                        let (counter, delivered) = match word.as_str() {
                            "new" => (&self.tally.new, Delivered::New),
                            "duplicate" => (&self.tally.duplicate, Delivered::Duplicate),
                            _ => (&self.tally.other_2xx, Delivered::Other),
                        };
                        SendTally::bump(counter);
                        return delivered;
                    }
                    Attempt::Answered(503, _) => SendTally::bump(&self.tally.unavailable_503),
                    Attempt::Answered(status, word) => {
                        SendTally::bump(&self.tally.unexpected);
                        let mut samples = self
                            .tally
                            .unexpected_samples
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        if samples.len() < 10 {
                            samples.push(format!("{status} {word}"));
                        }
                    }
                    Attempt::ConnectionError => SendTally::bump(&self.tally.connection_errors),
                    Attempt::TimedOut => SendTally::bump(&self.tally.timeouts),
                }
            }
            failures = failures.saturating_add(1);
            let backoff = (Duration::from_millis(100) * 2u32.saturating_pow(failures.min(6)))
                .min(MAX_BACKOFF);
            let jitter = rand::thread_rng().gen_range(0.5..1.0);
            tokio::select! {
                _ = give_up.cancelled() => {}
                _ = tokio::time::sleep(backoff.mul_f64(jitter)) => {}
            }
        }
    }

    async fn attempt(&self, addr: SocketAddr, body: &str) -> Attempt {
        let t = chrono::Utc::now().timestamp();
        let request = Request::post(format!("http://{addr}/hooks/stripe"))
            .header("content-type", "application/json; charset=utf-8")
            .header(
                "user-agent",
                "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
            )
            .header(
                "stripe-signature",
                Self::stripe_signature(&self.secret, t, body),
            )
            .body(Body::from(body.to_owned()))
            .expect("a valid request");
        let exchange = async {
            let response = self.client.request(request).await.ok()?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await.ok()?.to_bytes();
            let word = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|json| {
                    json.get("status").and_then(|s| s.as_str()).map(|s| {
                        match json.get("error").and_then(|e| e.as_str()) {
                            Some(error) => format!("{s}/{error}"),
                            None => s.to_owned(),
                        }
                    })
                })
                .unwrap_or_default();
            Some((status, word))
        };
        match tokio::time::timeout(ATTEMPT_TIMEOUT, exchange).await {
            Ok(Some((status, word))) => Attempt::Answered(status, word),
            Ok(None) => Attempt::ConnectionError,
            Err(_) => Attempt::TimedOut,
        }
    }
}

enum Attempt {
    Answered(u16, String),
    ConnectionError,
    TimedOut,
}
